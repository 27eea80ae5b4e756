package kubeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// StatusError is an API answer other than 2xx.
type StatusError struct {
	Method, Path string
	// Code is the HTTP status code.
	Code int
	// Reason is the API Status's reason (NotFound, Forbidden,
	// AlreadyExists, …); empty when the body was not a Status.
	Reason string
	// Message is the API Status's message, or the start of the body.
	Message string
	// RetryAfter is how long the server asked us to wait before the next
	// request (its Retry-After header, in seconds or as a date); zero when
	// it asked for no wait.
	RetryAfter time.Duration
	// Status is the answer's body when it was an API Status, whole: its
	// details (the causes of a 422) for callers that need them.
	Status json.RawMessage
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += " (retry after " + e.RetryAfter.String() + ")"
	}
	return s
}

func newStatusError(method, path string, code int, body []byte) *StatusError {
	e := &StatusError{Method: method, Path: path, Code: code}
	var st status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		e.Reason, e.Message, e.Status = st.Reason, st.Message, json.RawMessage(body)
	} else {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		e.Message = msg
	}
	return e
}

// retryAfter reads a Retry-After header: delay-seconds, or an HTTP-date
// taken relative to the response's Date (the server's clock, so a skewed
// node clock does not stretch or cut the wait), else to now. Zero when
// absent, malformed or past.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		// Far beyond any sane wait; the policy clamps it anyway.
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		now = d
	}
	return max(at.Sub(now), 0)
}

// IsNotFound says whether err is the API's 404.
func IsNotFound(err error) bool { return hasCode(err, http.StatusNotFound) }

// IsAlreadyExists says whether err is the API's 409 for a name taken.
func IsAlreadyExists(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusConflict && se.Reason == "AlreadyExists"
}

func hasCode(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// RetryAfter is the wait the API server asked for with err, if it asked
// for one.
func RetryAfter(err error) (time.Duration, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter, true
	}
	return 0, false
}

// ErrorClass says what a failed request means for the next one.
type ErrorClass int

// The classes of errors.
const (
	// Transient: a 5xx without Retry-After, 408, 409, or no answer at all
	// (connection refused, a timeout): the same request may work soon.
	Transient ErrorClass = iota
	// Throttled: 429, or a 5xx with a Retry-After (overload): the server
	// said when to come back, and nothing should be sent before.
	Throttled
	// Persistent: any other 4xx (400, 401, 403, 404, 422, an admission
	// webhook's refusal): the same request will fail again until someone
	// changes something (RBAC, a policy, the token), so retries must be
	// rare. A Retry-After on one is still honoured (RetryAfter).
	Persistent
)

func (c ErrorClass) String() string {
	switch c {
	case Throttled:
		return "throttled"
	case Persistent:
		return "persistent"
	}
	return "transient"
}

// Classify sorts a request's error. A nil error is Transient, which
// callers never ask about.
func Classify(err error) ErrorClass {
	var se *StatusError
	if !errors.As(err, &se) {
		return Transient
	}
	switch {
	case se.Code == http.StatusTooManyRequests, se.Code >= 500 && se.RetryAfter > 0:
		return Throttled
	case se.Code >= 500, se.Code == http.StatusRequestTimeout, se.Code == http.StatusConflict:
		return Transient
	case se.Code >= 400:
		return Persistent
	}
	// A 1xx or 3xx the transport did not follow: nothing will change it.
	return Persistent
}

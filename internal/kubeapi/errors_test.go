package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

const statusBody = `{"kind":"Status","status":"Failure","message":"m","reason":"R"}`

// Retry-After in seconds or as a date is kept on the error, and the
// error is classified by what it means for the next request.
func TestRetryAfterAndClassification(t *testing.T) {
	serverNow := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	date := func(t time.Time) string { return t.Format(http.TimeFormat) }
	tests := []struct {
		name       string
		code       int
		header     http.Header
		wantAfter  time.Duration
		wantClass  ErrorClass
		wantString string
	}{
		{"429 seconds", 429, http.Header{"Retry-After": {"7"}}, 7 * time.Second, Throttled, "(retry after 7s)"},
		{"429 without", 429, nil, 0, Throttled, "429 Too Many Requests"},
		// The date is read against the server's Date, not our clock.
		{"503 date", 503, http.Header{"Retry-After": {date(serverNow.Add(90 * time.Second))}, "Date": {date(serverNow)}}, 90 * time.Second, Throttled, "1m30s"},
		{"500 without", 500, nil, 0, Transient, "500"},
		{"504 zero", 504, http.Header{"Retry-After": {"0"}}, 0, Transient, "504"},
		{"503 garbage", 503, http.Header{"Retry-After": {"soon"}}, 0, Transient, "503"},
		{"503 past date", 503, http.Header{"Retry-After": {date(serverNow.Add(-time.Minute))}, "Date": {date(serverNow)}}, 0, Transient, "503"},
		{"408", 408, nil, 0, Transient, "408"},
		{"409 conflict", 409, nil, 0, Transient, "409"},
		{"400", 400, nil, 0, Persistent, "400"},
		{"401 expired token", 401, nil, 0, Persistent, "401"},
		{"403 webhook refusal", 403, nil, 0, Persistent, "403"},
		{"404", 404, nil, 0, Persistent, "404"},
		{"422", 422, nil, 0, Persistent, "422"},
		// A Retry-After on a refusal is kept, the refusal stays persistent.
		{"403 with Retry-After", 403, http.Header{"Retry-After": {"30"}}, 30 * time.Second, Persistent, "30s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, srv := testClient(t)
			srv.answerWith(tt.code, statusBody, tt.header)
			err := cl.PatchNodeCondition(context.Background(), "n1", NodeCondition{Type: "GPUHealthy"})
			var se *StatusError
			if !errors.As(err, &se) || se.Code != tt.code {
				t.Fatalf("err = %v, want a %d StatusError", err, tt.code)
			}
			if se.RetryAfter != tt.wantAfter {
				t.Errorf("RetryAfter = %v, want %v", se.RetryAfter, tt.wantAfter)
			}
			d, ok := RetryAfter(fmt.Errorf("wrapped: %w", err))
			if d != tt.wantAfter || ok != (tt.wantAfter > 0) {
				t.Errorf("RetryAfter(err) = %v, %v", d, ok)
			}
			if c := Classify(fmt.Errorf("wrapped: %w", err)); c != tt.wantClass {
				t.Errorf("Classify = %v, want %v", c, tt.wantClass)
			}
			if !strings.Contains(err.Error(), tt.wantString) {
				t.Errorf("error %q does not mention %q", err, tt.wantString)
			}
		})
	}
}

// A date without the server's Date header is read against the client's
// clock.
func TestRetryAfterDateWithoutServerDate(t *testing.T) {
	now := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	h := http.Header{"Retry-After": {now.Add(2 * time.Minute).Format(http.TimeFormat)}}
	if d := retryAfter(h, now); d != 2*time.Minute {
		t.Errorf("retryAfter = %v, want 2m", d)
	}
	if d := retryAfter(http.Header{"Retry-After": {"99999999999"}}, now); d != 24*time.Hour {
		t.Errorf("huge Retry-After = %v, want clamped to a day", d)
	}
}

// No answer at all is transient, with no Retry-After.
func TestNetworkErrorIsTransient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cl := mustClient(t, Config{Server: "https://" + addr, Token: "t"})
	err = cl.PatchNodeCondition(context.Background(), "n1", NodeCondition{Type: "GPUHealthy"})
	if err == nil {
		t.Fatal("a closed port answered")
	}
	if c := Classify(err); c != Transient {
		t.Errorf("Classify(%v) = %v, want transient", err, c)
	}
	if _, ok := RetryAfter(err); ok {
		t.Error("a network error has a Retry-After")
	}
}

type countingObserver struct {
	mu   sync.Mutex
	seen []string
}

func (o *countingObserver) ObserveRequest(verb, resource, code string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, verb+" "+resource+" "+code)
}

// Every request is told to the observer by API verb, resource and code.
func TestRequestObserver(t *testing.T) {
	srv := newAPIServer(t, nil)
	obs := &countingObserver{}
	cl, err := New(Config{Server: srv.URL, CAData: srv.caPEM(), Token: "t"}, WithRequestObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srv.answer(429, statusBody)
	_ = cl.CreateEvent(ctx, Event{InvolvedObject: ObjectReference{Kind: "Node", Name: "n1"}})
	_ = cl.PatchEvent(ctx, "default", "e", 2, Time{})
	_, _ = cl.GetNode(ctx, "n1")
	_, _ = cl.GetPod(ctx, "ns", "p")
	_ = cl.PatchNodeCondition(ctx, "n1", NodeCondition{Type: "GPUHealthy"})
	_ = cl.PatchNodeMetadata(ctx, "n1", MetadataPatch{})
	srv.Close()
	_, _ = cl.GetNode(ctx, "n1")
	want := []string{
		"create events 429", "patch events 200", "get nodes 200", "get pods 200",
		"patch nodes/status 200", "patch nodes 200", "get nodes error",
	}
	if strings.Join(obs.seen, ", ") != strings.Join(want, ", ") {
		t.Errorf("observed\n %v\nwant\n %v", obs.seen, want)
	}
}

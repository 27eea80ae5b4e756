// Package auditlog reads one user's API requests from the kube-apiserver
// audit log (audit.k8s.io/v1 Events, one JSON line each), a phase at a
// time: that is its one job. The cluster lanes use it to attribute what a
// plugin asks of the API server.
package auditlog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"
)

// event is what is read of one audit.k8s.io/v1 Event line.
type event struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
	StageTimestamp  time.Time `json:"stageTimestamp"`
}

// Request is one API request of the user.
type Request struct {
	Verb     string
	Resource string // with "/subresource" when there is one: "nodes/status"
	URI      string
	Code     int           // the response's status code; 0 when none was logged
	Latency  time.Duration // the server's; 0 for a watch (long-running)
	At       time.Time     // when the server received it
}

// Write reports whether the request changes an object.
func (r Request) Write() bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// Tail reads the audit log at Path from where it last stopped, keeping
// the requests of User alone. The zero offset is the log's start.
type Tail struct {
	Path   string
	User   string
	offset int64
}

// Mark moves to the end of the log: what follows is the next phase.
func (a *Tail) Mark() error {
	st, err := os.Stat(a.Path)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	a.offset = st.Size()
	return nil
}

// Read returns the user's requests logged since the last Read or Mark.
// A request counts once: a watch when it starts (ResponseStarted), any
// other at ResponseComplete, with the server's latency. A line still
// being written is left for the next Read.
func (a *Tail) Read() ([]Request, error) {
	f, err := os.Open(a.Path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	var out []Request
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // a partial line waits for the next read
		}
		if err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		a.offset += int64(len(line))
		var e event
		if json.Unmarshal(line, &e) != nil || e.User.Username != a.User || e.ObjectRef == nil {
			continue
		}
		if (e.Verb == "watch") != (e.Stage == "ResponseStarted") || e.Stage != "ResponseStarted" && e.Stage != "ResponseComplete" {
			continue
		}
		q := Request{Verb: e.Verb, Resource: e.ObjectRef.Resource, URI: e.RequestURI, At: e.RequestReceived}
		if e.ObjectRef.Subresource != "" {
			q.Resource += "/" + e.ObjectRef.Subresource
		}
		if e.ResponseStatus != nil {
			q.Code = e.ResponseStatus.Code
		}
		if e.Verb != "watch" {
			q.Latency = e.StageTimestamp.Sub(e.RequestReceived)
		}
		out = append(out, q)
	}
	return out, nil
}

// Count is the requests by "verb resource": "patch nodes/status".
func Count(reqs []Request) map[string]int {
	m := map[string]int{}
	for _, r := range reqs {
		m[r.Verb+" "+r.Resource]++
	}
	return m
}

// Summary is "N requests: verb resource ×k, ...", sorted by resource,
// then verb; "0 requests" for none.
func Summary(reqs []Request) string {
	c := Count(reqs)
	byResource := func(k string) string {
		verb, resource, _ := strings.Cut(k, " ")
		return resource + " " + verb
	}
	keys := slices.SortedFunc(maps.Keys(c), func(a, b string) int {
		return strings.Compare(byResource(a), byResource(b))
	})
	noun := "requests"
	if len(reqs) == 1 {
		noun = "request"
	}
	if len(keys) == 0 {
		return fmt.Sprintf("%d %s", len(reqs), noun)
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, c[k])
	}
	return fmt.Sprintf("%d %s: %s", len(reqs), noun, strings.Join(parts, ", "))
}

package scale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// auditEvent is what is read of one audit.k8s.io/v1 Event line.
type auditEvent struct {
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

// request is one API request of the fleet.
type request struct {
	verb, resource string // resource includes "/subresource"
	uri            string
	code           int
	latency        time.Duration // 0 for a watch (long-running)
	at             time.Time
}

func (r request) write() bool {
	switch r.verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// auditTail reads the audit log from where it last stopped.
type auditTail struct {
	path   string
	user   string
	offset int64
}

// mark moves to the end of the log: what follows is the next phase.
func (a *auditTail) mark() error {
	st, err := os.Stat(a.path)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	a.offset = st.Size()
	return nil
}

// read returns the fleet's requests logged since the last read or mark.
// A request counts once: a watch when it starts (ResponseStarted), any
// other at ResponseComplete, with the server's latency.
func (a *auditTail) read() ([]request, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	var out []request
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
		var e auditEvent
		if json.Unmarshal(line, &e) != nil || e.User.Username != a.user || e.ObjectRef == nil {
			continue
		}
		if (e.Verb == "watch") != (e.Stage == "ResponseStarted") || e.Stage != "ResponseStarted" && e.Stage != "ResponseComplete" {
			continue
		}
		q := request{verb: e.Verb, resource: e.ObjectRef.Resource, uri: e.RequestURI, at: e.RequestReceived}
		if e.ObjectRef.Subresource != "" {
			q.resource += "/" + e.ObjectRef.Subresource
		}
		if e.ResponseStatus != nil {
			q.code = e.ResponseStatus.Code
		}
		if e.Verb != "watch" {
			q.latency = e.StageTimestamp.Sub(e.RequestReceived)
		}
		out = append(out, q)
	}
	return out, nil
}

// phase is what the fleet asked during one part of the run.
type phase struct {
	name     string
	duration time.Duration
	reqs     []request
}

type verbResource struct{ verb, resource string }

// counts is requests by verb and resource.
func (p phase) counts() map[verbResource]int {
	m := map[verbResource]int{}
	for _, r := range p.reqs {
		m[verbResource{r.verb, r.resource}]++
	}
	return m
}

func (p phase) writes() int {
	n := 0
	for _, r := range p.reqs {
		if r.write() {
			n++
		}
	}
	return n
}

func (p phase) count(verb, resource string) int {
	n := 0
	for _, r := range p.reqs {
		if r.verb == verb && r.resource == resource {
			n++
		}
	}
	return n
}

// codes lists the response codes that were not 2xx, with their counts.
func (p phase) codes() string {
	m := map[int]int{}
	for _, r := range p.reqs {
		if r.code >= 300 {
			m[r.code]++
		}
	}
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d×%d", m[c], c))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// latencies are the server's latencies of the phase's requests but watches.
func (p phase) latencies() []time.Duration {
	var out []time.Duration
	for _, r := range p.reqs {
		if r.verb != "watch" {
			out = append(out, r.latency)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// quantile of sorted durations; 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1 // nearest rank
	return sorted[max(0, min(i, len(sorted)-1))]
}

// clusterWide lists the phase's lists and watches that are not narrowed to
// one node by a field selector: a node agent must never make one.
func (p phase) clusterWide() []string {
	var out []string
	for _, r := range p.reqs {
		if r.verb != "list" && r.verb != "watch" {
			continue
		}
		u, err := url.Parse(r.uri)
		if err != nil || !strings.Contains(u.Query().Get("fieldSelector"), "spec.nodeName=") {
			out = append(out, r.verb+" "+r.uri)
		}
	}
	return out
}

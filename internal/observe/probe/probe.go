// Package probe answers the kubelet's liveness and readiness probes.
//
// Readiness is a set of named gates: the plugin is ready when none is
// shut. A front-end shuts a gate per resource until the kubelet took its
// registration (device-plugin API) or until its ResourceSlices were handed
// to the publisher (DRA). Liveness is a set of named loops: the plugin is
// live while each loop turned within a few of its periods, so a loop stuck
// in a hung NVML call restarts the container.
//
// Status serves both over HTTP (Handler: /livez and /readyz), on a Unix
// socket for the probe command and on the metrics port.
package probe

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// A loop is late after lateAfter of its periods plus slack: one slow
// poll on a node with many GPUs is not a hang.
const (
	lateAfter = 3
	slack     = 30 * time.Second
)

type loop struct {
	every time.Duration
	last  time.Time
}

// Status holds the gates and loops. Its zero value is not usable: use New.
// A nil *Status does nothing, so callers without probes need no checks.
type Status struct {
	now func() time.Time

	mu    sync.Mutex
	gates map[string]string // name → why it is shut; "" is open
	loops map[string]loop
}

// New returns a Status with no gates and no loops (ready and live). now is
// the clock; nil is time.Now.
func New(now func() time.Time) *Status {
	if now == nil {
		now = time.Now
	}
	return &Status{now: now, gates: map[string]string{}, loops: map[string]loop{}}
}

// Gate sets gate name: open when why is "", else shut for why.
func (s *Status) Gate(name, why string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.gates[name] = why
	s.mu.Unlock()
}

// Forget removes gate name, for a resource no longer served.
func (s *Status) Forget(name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.gates, name)
	s.mu.Unlock()
}

// Turned records that loop name went round; it turns about every every.
func (s *Status) Turned(name string, every time.Duration) {
	if s == nil {
		return
	}
	now := s.now()
	s.mu.Lock()
	s.loops[name] = loop{every: every, last: now}
	s.mu.Unlock()
}

// Stopped removes loop name, which ended on purpose.
func (s *Status) Stopped(name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.loops, name)
	s.mu.Unlock()
}

// Ready returns nil when every gate is open, else why not, each shut gate
// named.
func (s *Status) Ready() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	var shut []string
	for name, why := range s.gates {
		if why != "" {
			shut = append(shut, name+": "+why)
		}
	}
	s.mu.Unlock()
	if len(shut) == 0 {
		return nil
	}
	slices.Sort(shut)
	return errors.New("not ready: " + strings.Join(shut, "; "))
}

// Live returns nil when every loop turned in time, else which did not.
func (s *Status) Live() error {
	if s == nil {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	var late []string
	for name, l := range s.loops {
		if since := now.Sub(l.last); since > lateAfter*l.every+slack {
			late = append(late, fmt.Sprintf("%s last turned %s ago (every %s)", name, since.Round(time.Second), l.every))
		}
	}
	s.mu.Unlock()
	if len(late) == 0 {
		return nil
	}
	slices.Sort(late)
	return errors.New("not live: " + strings.Join(late, "; "))
}

// Handler answers GET /livez and /readyz: 200 "ok", or 503 and why not.
func (s *Status) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { answer(w, s.Live()) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { answer(w, s.Ready()) })
	return mux
}

func answer(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ok")
}

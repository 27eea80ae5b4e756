package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// floors is the backoff policy with its jitter at the bottom: each wait is
// the floor (1 s, 30 s when persistent, or the server's Retry-After).
var floors = backoff.Policy{Rand: func() float64 { return 0 }}

// A 429 with Retry-After holds every Event write and the Node condition
// until the wait is over; the throttled Event is sent then, not dropped.
func TestThrottleHoldsEveryWrite(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{Events: true, NodeCondition: true, Backoff: floors})
	ctx := context.Background()
	r.Synced(GPU)
	r.pump(ctx)
	api.take() // the start-up condition
	api.failNext("create", &kubeapi.StatusError{Code: 429, RetryAfter: 10 * time.Second})
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.Transition(resname.GPU, "GPU-2", "GPU-2 (index 4)", false, "xid=48")
	next := r.pump(ctx)
	if c := api.take(); len(c) != 1 || c[0].op != "create" {
		t.Fatalf("after a 429, calls %+v; want the one create", c)
	}
	if !next.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("next wake %v, want the Retry-After", next)
	}
	for range 9 {
		clk.advance(time.Second)
		r.Transition(resname.GPU, "GPU-3", "", false, "xid=79")
		r.Transition(resname.GPU, "GPU-3", "", true, "")
		r.pump(ctx)
		if c := api.take(); len(c) != 0 {
			t.Fatalf("at %v, while the server said wait: %+v", clk.now().Sub(t0), c)
		}
	}
	clk.advance(time.Second)
	r.pump(ctx)
	c := api.take()
	creates := ops(c, "create")
	if len(creates) != 4 || creates[0].event.Message != "GPU-1 (index 3): xid=79: fallen off the bus" {
		t.Fatalf("after the wait, creates %+v; want the throttled one first, then 3", creates)
	}
	if p := ops(c, "patchCondition"); len(p) != 1 || p[0].cond.Status != "False" {
		t.Fatalf("after the wait, condition patches %+v", p)
	}
}

// A throttled condition PATCH holds the Events too.
func TestThrottledConditionHoldsEvents(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{Events: true, NodeCondition: true, Backoff: floors})
	ctx := context.Background()
	api.failNext("patchCondition", &kubeapi.StatusError{Code: 503, RetryAfter: 5 * time.Second})
	r.Synced(GPU)
	if next := r.pump(ctx); !next.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("next %v", next)
	}
	api.take()
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	clk.advance(4 * time.Second)
	r.pump(ctx)
	if c := api.take(); len(c) != 0 {
		t.Fatalf("sent while held: %+v", c)
	}
	clk.advance(time.Second)
	r.pump(ctx)
	if c := api.take(); len(ops(c, "create")) != 1 || len(ops(c, "patchCondition")) != 1 {
		t.Fatalf("after the hold: %+v", c)
	}
}

// An Event refused for good (an expired token, an admission webhook) does
// not make a write per transition: the sender backs off to one try every
// few minutes, and the warning is logged at most once a minute.
func TestPersistentEventErrorBacksOff(t *testing.T) {
	api := newFakeAPI()
	var logs bytes.Buffer
	refused := &kubeapi.StatusError{Code: 400, Reason: "BadRequest", Message: `admission webhook "deny.example.com" denied the request`}
	r, clk := newReporter(t, api, Options{Events: true, Backoff: ceilings, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	// A GPU flapping every 5 s for an hour: 720 transitions.
	for i := range 720 {
		api.failNext("create", refused)
		r.Transition(resname.GPU, "GPU-1", label1, i%2 == 1, "xid=79")
		r.pump(ctx)
		clk.advance(5 * time.Second)
	}
	creates := len(ops(api.take(), "create"))
	// Waits of 1, 2, 4, then 5 min: tries at 0, 1, 3, 7, 12, … 57 min.
	if creates != 14 {
		t.Fatalf("%d creates in an hour of refusals, want a try every few minutes", creates)
	}
	if n := strings.Count(logs.String(), "pausing Events"); n != creates {
		t.Errorf("%d warnings in an hour", n)
	}
	if !strings.Contains(logs.String(), "class=persistent") {
		t.Errorf("the warning does not say the error is persistent:\n%s", logs.String())
	}
	// A success ends the run: the next failure waits the first step again.
	api.mu.Lock()
	api.errs["create"] = []error{nil, nil, nil, errors.New("connection reset")}
	api.mu.Unlock()
	clk.advance(5 * time.Minute)
	r.Transition(resname.GPU, "GPU-2", "", false, "xid=79")
	r.pump(ctx)
	if c := ops(api.take(), "create"); len(c) != 3 {
		t.Fatalf("after the pause, creates %d; want GPU-1's last two and GPU-2's", len(c))
	}
	r.Transition(resname.GPU, "GPU-3", "", false, "xid=79")
	r.pump(ctx)
	r.Transition(resname.GPU, "GPU-4", "", false, "xid=79")
	r.pump(ctx)
	if c := ops(api.take(), "create"); len(c) != 1 {
		t.Fatalf("creates %d; want GPU-3's, failed, and none while paused", len(c))
	}
	clk.advance(2 * time.Second) // a transient error's first ceiling
	r.pump(ctx)
	if c := ops(api.take(), "create"); len(c) != 1 || !strings.HasPrefix(c[0].event.Message, "GPU-4") {
		t.Fatalf("after a transient error's first wait, creates %+v; want GPU-4's", c)
	}
}

// At rest nothing is written: no Event, no condition PATCH, however long
// and however often the watchers repeat the same state; changes that
// cancel out before a send are no condition PATCH either.
func TestNoWritesAtRest(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{Events: true, NodeCondition: true, NICs: true})
	ctx := context.Background()
	for i := range 8 {
		r.Transition(resname.GPU, fmt.Sprintf("GPU-%d", i), "", i != 3, "xid=79")
	}
	r.Transition("example.com/rdma", "0000:3b:00.0", "", true, "")
	r.Synced(GPU)
	r.Synced(NIC)
	r.pump(ctx)
	c := api.take()
	if len(ops(c, "patchCondition")) != 2 || len(ops(c, "create")) != 1 {
		t.Fatalf("start-up: %+v", c)
	}
	for range 24 * 60 {
		clk.advance(time.Minute)
		for i := range 8 {
			r.Transition(resname.GPU, fmt.Sprintf("GPU-%d", i), "", i != 3, "xid=79")
		}
		r.Transition("example.com/rdma", "0000:3b:00.0", "", true, "")
		if next := r.pump(ctx); !next.IsZero() && next.Sub(clk.now()) < time.Minute {
			t.Fatalf("a wake-up in %v at rest", next.Sub(clk.now()))
		}
	}
	if c := api.take(); len(c) != 0 {
		t.Fatalf("%d calls in a day at rest: %+v", len(c), c[0])
	}
	// GPU-0 fails and recovers between two sends: its two Events go out,
	// the condition it ends up in is the one the Node has.
	r.Transition(resname.GPU, "GPU-0", "", false, "xid=79")
	r.Transition(resname.GPU, "GPU-0", "", true, "")
	r.pump(ctx)
	c = api.take()
	if len(ops(c, "patchCondition")) != 0 || len(ops(c, "create")) != 2 {
		t.Fatalf("a flap between sends: %+v", c)
	}
}

// A device flapping makes at most one condition PATCH a second, the
// latest state winning.
func TestConditionAtMostOnceASecond(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{NodeCondition: true})
	ctx := context.Background()
	r.Synced(GPU)
	r.pump(ctx)
	api.take()
	clk.advance(time.Minute)
	var patches []call
	for i := range 50 { // every 100 ms for 5 s
		r.Transition(resname.GPU, "GPU-1", label1, i%2 == 1, "xid=79")
		next := r.pump(ctx)
		if !next.IsZero() && next.Sub(clk.now()) > time.Second {
			t.Fatalf("change %d waits %v", i, next.Sub(clk.now()))
		}
		patches = append(patches, ops(api.take(), "patchCondition")...)
		clk.advance(100 * time.Millisecond)
	}
	clk.advance(time.Second)
	r.pump(ctx)
	patches = append(patches, ops(api.take(), "patchCondition")...)
	if len(patches) < 4 || len(patches) > 6 {
		t.Fatalf("%d PATCHes for 5 s of flapping, want one a second", len(patches))
	}
	if last := patches[len(patches)-1].cond; last.Status != "True" {
		t.Errorf("last PATCH %+v, want the final state", last)
	}
	for i := 1; i < len(patches); i++ {
		if d := patches[i].cond.LastHeartbeatTime.Sub(patches[i-1].cond.LastHeartbeatTime.Time); d < time.Second {
			t.Errorf("PATCHes %d and %d %v apart", i-1, i, d)
		}
	}
}

package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// call is one API call the fake saw.
type call struct {
	op    string // create, patchEvent, getNode, patchCondition
	ns    string
	name  string
	event kubeapi.Event
	count int32
	cond  kubeapi.NodeCondition
}

type fakeAPI struct {
	mu    sync.Mutex
	calls []call
	node  kubeapi.Node
	// errs are returned by the next calls of an op, in order.
	errs map[string][]error
	// block, when set, holds CreateEvent until it is closed; entered
	// says a CreateEvent is waiting.
	block   chan struct{}
	entered chan struct{}
	// created receives every Event created, when set.
	created chan kubeapi.Event
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{errs: map[string][]error{}}
	f.node.Metadata = kubeapi.ObjectMeta{Name: "n1", UID: "node-uid"}
	return f
}

func (f *fakeAPI) record(c call) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	if errs := f.errs[c.op]; len(errs) > 0 {
		f.errs[c.op] = errs[1:]
		return errs[0]
	}
	return nil
}

func (f *fakeAPI) failNext(op string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[op] = append(f.errs[op], errs...)
}

// take returns and forgets the calls so far.
func (f *fakeAPI) take() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeAPI) CreateEvent(_ context.Context, e kubeapi.Event) error {
	if f.block != nil {
		select {
		case f.entered <- struct{}{}:
		default:
		}
		<-f.block
	}
	err := f.record(call{op: "create", ns: e.Metadata.Namespace, name: e.Metadata.Name, event: e})
	if err == nil && f.created != nil {
		f.created <- e
	}
	return err
}

func (f *fakeAPI) PatchEvent(_ context.Context, ns, name string, count int32, last kubeapi.Time) error {
	return f.record(call{op: "patchEvent", ns: ns, name: name, count: count, event: kubeapi.Event{LastTimestamp: last}})
}

func (f *fakeAPI) GetNode(_ context.Context, name string) (kubeapi.Node, error) {
	if err := f.record(call{op: "getNode", name: name}); err != nil {
		return kubeapi.Node{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.node, nil
}

func (f *fakeAPI) PatchNodeCondition(_ context.Context, node string, c kubeapi.NodeCondition) error {
	return f.record(call{op: "patchCondition", name: node, cond: c})
}

// ops lists the calls of one op.
func ops(calls []call, op string) []call {
	var out []call
	for _, c := range calls {
		if c.op == op {
			out = append(out, c)
		}
	}
	return out
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

var t0 = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

func newReporter(t *testing.T, api *fakeAPI, o Options) (*Reporter, *clock) {
	t.Helper()
	clk := &clock{t: t0}
	o.Node, o.Now = "n1", clk.now
	r, err := New(api, o)
	if err != nil {
		t.Fatal(err)
	}
	return r, clk
}

func holders(pods ...Pod) Holders {
	return HoldersFunc(func(_ context.Context, resource, id string) ([]Pod, error) {
		if resource == resname.GPU && id == "GPU-1" {
			return pods, nil
		}
		return nil, nil
	})
}

const label1 = "GPU-1 (index 3)"

func TestEventsOnNodeAndHoldingPods(t *testing.T) {
	api := newFakeAPI()
	// trainer-0 twice: two of its containers hold the GPU. The UIDs are
	// the node's (the kubelet's checkpoint): the API server is not asked.
	r, clk := newReporter(t, api, Options{Events: true, Holders: holders(Pod{"ml", "trainer-0", "uid-t0"}, Pod{"ml", "trainer-0", "uid-t0"}, Pod{"ml", "trainer-1", "uid-t1"})})
	ctx := context.Background()

	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.Transition(resname.GPU, "GPU-2", "GPU-2 (index 4)", true, "")
	r.pump(ctx)
	if c := api.take(); len(c) != 0 {
		t.Fatalf("devices first seen healthy made calls: %+v", c)
	}

	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79") // no change
	r.pump(ctx)
	creates := ops(api.take(), "create")
	if len(creates) != 3 {
		t.Fatalf("%d Events, want 3 (node, two pods): %+v", len(creates), creates)
	}
	const msg = "GPU-1 (index 3): xid=79: fallen off the bus"
	want := []struct{ ns, kind, name, uid string }{
		{"default", "Node", "n1", "node-uid"},
		{"ml", "Pod", "trainer-0", "uid-t0"},
		{"ml", "Pod", "trainer-1", "uid-t1"},
	}
	for i, w := range want {
		e := creates[i].event
		io := e.InvolvedObject
		if e.Metadata.Namespace != w.ns || io.Kind != w.kind || io.Name != w.name || io.UID != w.uid || io.APIVersion != "v1" || io.Namespace != map[bool]string{true: "", false: w.ns}[w.kind == "Node"] {
			t.Errorf("Event %d about %+v in %q, want %+v", i, io, e.Metadata.Namespace, w)
		}
		if e.Reason != ReasonGPUUnhealthy || e.Type != kubeapi.EventWarning || e.Message != msg || e.Count != 1 {
			t.Errorf("Event %d: %s %s %q count %d", i, e.Type, e.Reason, e.Message, e.Count)
		}
		if e.Source != (kubeapi.EventSource{Component: "gpu-device-plugin", Host: "n1"}) || e.ReportingComponent != "gpu-device-plugin" || e.ReportingInstance != "n1" {
			t.Errorf("Event %d source %+v reporting %s/%s", i, e.Source, e.ReportingComponent, e.ReportingInstance)
		}
		if !e.FirstTimestamp.Equal(t0) || !e.LastTimestamp.Equal(t0) || !strings.HasPrefix(e.Metadata.Name, w.name+".") {
			t.Errorf("Event %d name %s times %v %v", i, e.Metadata.Name, e.FirstTimestamp, e.LastTimestamp)
		}
	}

	// A new reason while still unhealthy is no transition.
	clk.advance(time.Second)
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79, thermal=91C>=slowdown 90C")
	r.pump(ctx)
	if c := ops(api.take(), "create"); len(c) != 0 {
		t.Fatalf("a reason change made Events: %+v", c)
	}

	clk.advance(time.Second)
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.pump(ctx)
	creates = ops(api.take(), "create")
	if len(creates) != 3 {
		t.Fatalf("%d recovery Events, want 3", len(creates))
	}
	for _, c := range creates {
		e := c.event
		if e.Reason != ReasonGPURecovered || e.Type != kubeapi.EventNormal || e.Message != "GPU-1 (index 3) is healthy again (was: xid=79: fallen off the bus, thermal=91C>=slowdown 90C)" {
			t.Errorf("recovery Event %s %s %q", e.Type, e.Reason, e.Message)
		}
	}
	if r.Dropped() != 0 {
		t.Fatalf("dropped %d", r.Dropped())
	}
}

func TestNICEventsAndFirstSightUnhealthy(t *testing.T) {
	api := newFakeAPI()
	r, _ := newReporter(t, api, Options{Events: true})
	r.Transition("example.com/rdma", "0000:3b:00.0", "0000:3b:00.0", false, "link down: eth2")
	r.pump(context.Background())
	c := ops(api.take(), "create")
	if len(c) != 1 {
		t.Fatalf("%d Events, want 1", len(c))
	}
	if e := c[0].event; e.Reason != ReasonNICUnhealthy || e.Message != "0000:3b:00.0 (example.com/rdma): link down: eth2" || e.InvolvedObject.Kind != "Node" {
		t.Fatalf("Event %+v", e)
	}
}

// The same Event again within the window adds to its count, sent at most
// once a minute; after the window it is a new Event.
func TestAggregation(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{Events: true})
	ctx := context.Background()
	flap := func() {
		r.Transition(resname.GPU, "GPU-1", label1, false, "xid=62")
		r.Transition(resname.GPU, "GPU-1", label1, true, "")
	}
	flap()
	r.pump(ctx)
	c := api.take()
	if len(ops(c, "create")) != 2 { // unhealthy, recovered
		t.Fatalf("calls %+v", c)
	}
	name := ops(c, "create")[0].name
	for range 5 {
		clk.advance(5 * time.Second)
		flap()
		if next := r.pump(ctx); !next.Equal(t0.Add(time.Minute)) {
			t.Fatalf("next wake %v, want the minute's end", next)
		}
	}
	if c := api.take(); len(c) != 0 {
		t.Fatalf("repeats within a minute made calls: %+v", c)
	}
	clk.advance(time.Minute)
	r.pump(ctx)
	c = ops(api.take(), "patchEvent")
	if len(c) != 2 || c[0].name != name || c[0].ns != "default" || c[0].count != 6 || !c[0].event.LastTimestamp.Equal(t0.Add(25*time.Second)) {
		t.Fatalf("count updates %+v", c)
	}
	// Nothing new: nothing sent.
	clk.advance(2 * time.Minute)
	if next := r.pump(ctx); !next.IsZero() {
		t.Fatalf("next wake %v with nothing to do", next)
	}
	if c := api.take(); len(c) != 0 {
		t.Fatalf("calls %+v", c)
	}
	// Ten minutes after the last one: a new Event.
	clk.advance(10 * time.Minute)
	flap()
	r.pump(ctx)
	c = ops(api.take(), "create")
	if len(c) != 2 || c[0].name == name || c[0].event.Count != 1 {
		t.Fatalf("after the window: %+v", c)
	}
	if r.Dropped() != 0 {
		t.Fatalf("dropped %d", r.Dropped())
	}
}

// An Event the API server let expire is created again.
func TestCountUpdateOfExpiredEventCreates(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{Events: true})
	ctx := context.Background()
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=62")
	r.pump(ctx)
	api.take()
	clk.advance(time.Minute)
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=62")
	api.failNext("patchEvent", &kubeapi.StatusError{Code: 404, Reason: "NotFound"})
	r.pump(ctx)
	c := api.take()
	if len(ops(c, "patchEvent")) != 1 {
		t.Fatalf("calls %+v", c)
	}
	var again bool
	for _, x := range ops(c, "create") {
		if x.event.Reason == ReasonGPUUnhealthy {
			again = x.event.Count == 2 && x.event.FirstTimestamp.Equal(t0)
		}
	}
	if !again {
		t.Fatalf("no new Event with the count: %+v", c)
	}
}

func TestTokenBucket(t *testing.T) {
	for _, tt := range []struct {
		name    string
		wait    time.Duration
		sent    int
		dropped int
	}{
		{"refilled in time", 9 * time.Minute, 25, 0},
		{"waited past the window", 10 * time.Minute, 21, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI()
			r, clk := newReporter(t, api, Options{Events: true})
			ctx := context.Background()
			for i := range 25 {
				r.Transition(resname.GPU, fmt.Sprintf("GPU-%d", i), "", false, "xid=79")
			}
			next := r.pump(ctx)
			if n := len(ops(api.take(), "create")); n != eventBurst {
				t.Fatalf("sent %d at once, want the burst %d", n, eventBurst)
			}
			if !next.Equal(t0.Add(eventRefill)) {
				t.Fatalf("next wake %v, want when a token is back", next)
			}
			clk.advance(eventRefill)
			r.pump(ctx)
			if n := len(ops(api.take(), "create")); n != 1 {
				t.Fatalf("sent %d after one refill, want 1", n)
			}
			clk.advance(tt.wait)
			r.pump(ctx)
			if n := 21 + len(ops(api.take(), "create")); n != tt.sent || r.Dropped() != tt.dropped {
				t.Fatalf("sent %d dropped %d, want %d and %d", n, r.Dropped(), tt.sent, tt.dropped)
			}
		})
	}
}

// Transition never blocks, even when the API hangs: past the queue's
// bound transitions are dropped and counted, and logged once.
func TestTransitionNeverBlocks(t *testing.T) {
	api := newFakeAPI()
	api.block, api.entered = make(chan struct{}), make(chan struct{}, 1)
	var logs bytes.Buffer
	r, err := New(api, Options{Node: "n1", Events: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	r.Transition(resname.GPU, "GPU-0", "", false, "xid=79")
	<-api.entered // Run is stuck in the API
	for i := range queueSize + 10 {
		r.Transition(resname.GPU, fmt.Sprintf("GPU-%d", i+1), "", false, "xid=79")
	}
	if d := r.Dropped(); d != 10 {
		t.Fatalf("dropped %d, want 10", d)
	}
	// The pump that was stuck logs the drops once it is free.
	close(api.block)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "Kubernetes Events dropped"); n != 1 || !strings.Contains(logs.String(), "dropped=10") {
		t.Fatalf("drop log lines %d:\n%s", n, logs.String())
	}
}

func TestRunSendsAsTransitionsHappen(t *testing.T) {
	api := newFakeAPI()
	api.created = make(chan kubeapi.Event, 4)
	r, err := New(api, Options{Node: "n1", Events: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	r.Transition(resname.GPU, "GPU-1", label1, false, "ecc=double-bit")
	select {
	case e := <-api.created:
		if e.Message != "GPU-1 (index 3): ecc=double-bit" {
			t.Fatalf("Event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Event")
	}
}

// Without holders the Event goes to the Node only; a holder whose UID the
// node could not tell gets its Event without one, logged once; the API
// server is never asked for a pod.
func TestHolderProblems(t *testing.T) {
	api := newFakeAPI()
	failing := true
	h := HoldersFunc(func(context.Context, string, string) ([]Pod, error) {
		if failing {
			return nil, errors.New("kubelet socket missing")
		}
		return []Pod{{"ml", "no-uid", ""}, {"ml", "alive", "uid-alive"}, {"ml", "unknown", ""}}, nil
	})
	var logs strings.Builder
	r, _ := newReporter(t, api, Options{Events: true, Holders: h, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.pump(ctx)
	if c := ops(api.take(), "create"); len(c) != 1 || c[0].event.InvolvedObject.Kind != "Node" {
		t.Fatalf("without holders: %+v", c)
	}
	failing = false
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.pump(ctx)
	var got []string
	for _, c := range api.take() {
		if c.op != "create" {
			t.Errorf("call %s: only Events are written, and no pod is read", c.op)
			continue
		}
		got = append(got, c.event.InvolvedObject.Name+"="+c.event.InvolvedObject.UID)
	}
	if strings.Join(got, " ") != "n1=node-uid no-uid= alive=uid-alive unknown=" {
		t.Fatalf("Events about %v", got)
	}
	if n := strings.Count(logs.String(), "without the pod's UID"); n != 1 {
		t.Errorf("logged %d times that an Event went without a pod UID, want once:\n%s", n, logs.String())
	}
}

func TestNodeUIDFallsBackToName(t *testing.T) {
	api := newFakeAPI()
	api.failNext("getNode", &kubeapi.StatusError{Code: 403})
	r, _ := newReporter(t, api, Options{Events: true})
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.pump(context.Background())
	if c := ops(api.take(), "create"); len(c) != 1 || c[0].event.InvolvedObject.UID != "n1" {
		t.Fatalf("Events %+v", c)
	}
}

func lastCondition(t *testing.T, api *fakeAPI) kubeapi.NodeCondition {
	t.Helper()
	c := ops(api.take(), "patchCondition")
	if len(c) != 1 {
		t.Fatalf("%d condition patches, want 1", len(c))
	}
	return c[0].cond
}

func TestConditionFlipsAndRecovers(t *testing.T) {
	api := newFakeAPI()
	// A stale False from an earlier run.
	api.node.Status.Conditions = []kubeapi.NodeCondition{{Type: ConditionGPUHealthy, Status: "False", LastTransitionTime: kubeapi.NewTime(t0.Add(-time.Hour))}}
	r, clk := newReporter(t, api, Options{NodeCondition: true})
	ctx := context.Background()
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.Transition(resname.GPU, "GPU-2", "GPU-2 (index 4)", true, "")
	r.pump(ctx)
	if c := api.take(); len(c) != 0 {
		t.Fatalf("calls before the GPUs synced: %+v", c)
	}
	r.Synced(GPU)
	r.pump(ctx)
	c := lastCondition(t, api)
	want := kubeapi.NodeCondition{Type: "GPUHealthy", Status: "True", Reason: "AllGPUsHealthy", Message: "all 2 GPUs are healthy", LastHeartbeatTime: kubeapi.NewTime(t0), LastTransitionTime: kubeapi.NewTime(t0)}
	if c != want {
		t.Fatalf("start-up condition\n got %+v\nwant %+v", c, want)
	}
	r.pump(ctx)
	if c := api.take(); len(c) != 0 {
		t.Fatalf("no change, yet %+v", c)
	}

	clk.advance(time.Minute)
	r.Transition(resname.GPU, "GPU-2", "GPU-2 (index 4)", false, "xid=79")
	r.Transition(resname.GPU, "GPU-1", label1, false, "thermal=91C>=slowdown 90C")
	r.pump(ctx)
	c = lastCondition(t, api)
	flipped := t0.Add(time.Minute)
	want = kubeapi.NodeCondition{Type: "GPUHealthy", Status: "False", Reason: "GPUUnhealthy",
		Message:           "GPU-1 (index 3): thermal=91C>=slowdown 90C; GPU-2 (index 4): xid=79: fallen off the bus",
		LastHeartbeatTime: kubeapi.NewTime(flipped), LastTransitionTime: kubeapi.NewTime(flipped)}
	if c != want {
		t.Fatalf("unhealthy condition\n got %+v\nwant %+v", c, want)
	}

	clk.advance(time.Minute)
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.pump(ctx)
	c = lastCondition(t, api)
	if c.Status != "False" || c.Message != "GPU-2 (index 4): xid=79: fallen off the bus" || !c.LastTransitionTime.Equal(flipped) || !c.LastHeartbeatTime.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("one GPU left: %+v", c)
	}

	clk.advance(time.Minute)
	r.Transition(resname.GPU, "GPU-2", "GPU-2 (index 4)", true, "")
	r.pump(ctx)
	c = lastCondition(t, api)
	if c.Status != "True" || c.Reason != "AllGPUsHealthy" || !c.LastTransitionTime.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("recovered: %+v", c)
	}
	if n := len(ops(api.take(), "getNode")); n != 0 {
		t.Fatalf("the Node was read %d more times", n)
	}
}

// A restart while a GPU is still broken is no transition.
func TestConditionKeepsTransitionTimeAcrossRestart(t *testing.T) {
	api := newFakeAPI()
	since := t0.Add(-time.Hour)
	api.node.Status.Conditions = []kubeapi.NodeCondition{{Type: ConditionGPUHealthy, Status: "False", LastTransitionTime: kubeapi.NewTime(since)}}
	r, _ := newReporter(t, api, Options{NodeCondition: true})
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.Synced(GPU)
	r.pump(context.Background())
	c := ops(api.take(), "patchCondition")
	if len(c) != 1 || c[0].cond.Status != "False" || !c[0].cond.LastTransitionTime.Equal(since) {
		t.Fatalf("patches %+v", c)
	}
}

// ceilings is the backoff policy with its jitter at the top: each wait
// is the ceiling (2 s, 4 s, … for transient errors).
var ceilings = backoff.Policy{Rand: func() float64 { return 1 }}

func TestConditionRetriesWithBackoff(t *testing.T) {
	api := newFakeAPI()
	api.failNext("getNode", errors.New("connection refused"))
	api.failNext("patchCondition", errors.New("connection refused"), &kubeapi.StatusError{Code: 500}, nil)
	r, clk := newReporter(t, api, Options{NodeCondition: true, Backoff: ceilings})
	ctx := context.Background()
	r.Synced(GPU)
	if next := r.pump(ctx); !next.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("first retry at %v", next)
	}
	// A transport error reading the Node: read again with the retry.
	c := api.take()
	if len(ops(c, "getNode")) != 1 || len(ops(c, "patchCondition")) != 1 {
		t.Fatalf("calls %+v", c)
	}
	clk.advance(time.Second)
	r.pump(ctx)
	if c := api.take(); len(c) != 0 {
		t.Fatalf("retried early: %+v", c)
	}
	clk.advance(time.Second)
	if next := r.pump(ctx); !next.Equal(t0.Add(6 * time.Second)) {
		t.Fatalf("second retry at %v, want 4 s later", next)
	}
	if c := api.take(); len(ops(c, "getNode")) != 1 || len(ops(c, "patchCondition")) != 1 {
		t.Fatalf("calls %+v", c)
	}
	clk.advance(4 * time.Second)
	if next := r.pump(ctx); !next.IsZero() {
		t.Fatalf("next wake %v after success", next)
	}
	if c := api.take(); len(c) != 1 || c[0].cond.Status != "True" {
		t.Fatalf("calls %+v", c)
	}
	// The backoff starts over after a success.
	clk.advance(time.Second)
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	api.failNext("patchCondition", errors.New("refused"))
	if next := r.pump(ctx); !next.Equal(clk.now().Add(2 * time.Second)) {
		t.Fatalf("retry at %v", next)
	}
}

func TestNICConditionAndForget(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{NodeCondition: true, NICs: true})
	ctx := context.Background()
	r.Transition("example.com/rdma", "0000:3b:00.0", "", false, "removed: gone from sysfs")
	r.Transition("example.com/rdma", "0000:3c:00.0", "", true, "")
	r.Synced(NIC)
	r.pump(ctx)
	c := ops(api.take(), "patchCondition")
	if len(c) != 1 || c[0].cond.Type != "NICHealthy" || c[0].cond.Status != "False" || c[0].cond.Reason != "NICUnhealthy" ||
		c[0].cond.Message != "0000:3b:00.0 (example.com/rdma): removed: gone from sysfs" {
		t.Fatalf("NIC condition %+v", c)
	}
	clk.advance(time.Second)
	r.Forget("example.com/rdma", "0000:3b:00.0")
	r.pump(ctx)
	c = ops(api.take(), "patchCondition")
	if len(c) != 1 || c[0].cond.Status != "True" || c[0].cond.Reason != "AllNICsHealthy" || c[0].cond.Message != "all 1 NICs are healthy" {
		t.Fatalf("after the NIC left: %+v", c)
	}
	// Without NICs the NIC condition is never sent; GPU's waits for its
	// own sync.
	api2 := newFakeAPI()
	r2, _ := newReporter(t, api2, Options{NodeCondition: true})
	r2.Transition("example.com/rdma", "0000:3b:00.0", "", false, "link down: eth2")
	r2.Synced(NIC)
	r2.pump(ctx)
	if c := api2.take(); len(c) != 0 {
		t.Fatalf("calls %+v", c)
	}
}

func TestConditionMessageIsBounded(t *testing.T) {
	api := newFakeAPI()
	r, _ := newReporter(t, api, Options{NodeCondition: true})
	for i := range 64 {
		id := fmt.Sprintf("GPU-%02d-%s", i, strings.Repeat("f", 30))
		r.Transition(resname.GPU, id, fmt.Sprintf("%s (index %d)", id, i), false, "xid=79")
	}
	r.Synced(GPU)
	r.pump(context.Background())
	c := lastCondition(t, api)
	if len(c.Message) > maxMessage || !strings.HasPrefix(c.Message, "GPU-00-") || !strings.HasSuffix(c.Message, " more") {
		t.Fatalf("message (%d bytes): %s", len(c.Message), c.Message)
	}
}

func TestJoinLimitedAndTruncate(t *testing.T) {
	if got := joinLimited([]string{"aaaa", "bbbb", "cccc", "dddd"}, 16); got != "aaaa; and 3 more" {
		t.Errorf("joinLimited = %q", got)
	}
	if got := joinLimited([]string{"aaaa", "bbbb"}, 100); got != "aaaa; bbbb" {
		t.Errorf("joinLimited = %q", got)
	}
	if got := joinLimited([]string{strings.Repeat("x", 50), "y"}, 30); len(got) > 30 || !strings.HasSuffix(got, "…; and 1 more") {
		t.Errorf("joinLimited = %q", got)
	}
	if got := truncate("ééééé", 6); got != "é…" {
		t.Errorf("truncate = %q", got)
	}
	if got := truncate("abcdef", 2); got != "ab" {
		t.Errorf("truncate = %q", got)
	}
	if got := joinLimited([]string{"aaaa", "bbbb", "cccc"}, 14); len(got) > 14 {
		t.Errorf("joinLimited = %q, over 14 bytes", got)
	}
}

func TestEventsOffSendsNoEvents(t *testing.T) {
	api := newFakeAPI()
	r, _ := newReporter(t, api, Options{NodeCondition: true})
	r.Synced(GPU)
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.pump(context.Background())
	if c := api.take(); len(ops(c, "create")) != 0 || len(ops(c, "patchCondition")) != 1 {
		t.Fatalf("calls %+v", c)
	}
	if _, err := New(api, Options{}); err == nil {
		t.Fatal("no node name accepted")
	}
}

// A node-wide notice (the CDI hook missing) shows on the condition while
// every GPU is healthy, keeps the status True, and goes when cleared.
func TestConditionNotice(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{NodeCondition: true})
	ctx := context.Background()
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.Synced(GPU)
	r.SetNotice(GPU, "CDIHookMissing", "CDI hook missing at /x")
	r.pump(ctx)
	c := lastCondition(t, api)
	if c.Status != "True" || c.Reason != "CDIHookMissing" || c.Message != "all 1 GPUs are healthy; CDI hook missing at /x" {
		t.Fatalf("with the notice: %+v", c)
	}
	clk.advance(time.Second)
	r.Transition(resname.GPU, "GPU-1", label1, false, "xid=79")
	r.pump(ctx)
	if c = lastCondition(t, api); c.Status != "False" || c.Reason != "GPUUnhealthy" || !strings.HasSuffix(c.Message, "; CDI hook missing at /x") {
		t.Fatalf("unhealthy with the notice: %+v", c)
	}
	clk.advance(time.Second)
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.SetNotice(GPU, "", "")
	r.pump(ctx)
	if c = lastCondition(t, api); c.Reason != "AllGPUsHealthy" || c.Message != "all 1 GPUs are healthy" {
		t.Fatalf("notice cleared: %+v", c)
	}
}

// A remark (the runtime's NVIDIA_VISIBLE_DEVICES door) ends the message
// but never changes the status or the reason, beside a notice or not.
func TestConditionRemark(t *testing.T) {
	const remark = "any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES"
	tests := []struct {
		name        string
		healthy     bool
		notice      string
		wantStatus  string
		wantReason  string
		wantMessage string
	}{
		{name: "healthy", healthy: true, wantStatus: "True", wantReason: "AllGPUsHealthy",
			wantMessage: "all 1 GPUs are healthy; " + remark},
		{name: "healthy with a notice", healthy: true, notice: "CDI hook missing at /x", wantStatus: "True", wantReason: "CDIHookMissing",
			wantMessage: "all 1 GPUs are healthy; CDI hook missing at /x; " + remark},
		{name: "unhealthy", healthy: false, wantStatus: "False", wantReason: "GPUUnhealthy",
			wantMessage: "GPU-1 (index 0): xid=79; " + remark},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI()
			r, clk := newReporter(t, api, Options{NodeCondition: true})
			ctx := context.Background()
			reason := ""
			if !tt.healthy {
				reason = "xid=79"
			}
			r.Transition(resname.GPU, "GPU-1", label1, tt.healthy, reason)
			r.Synced(GPU)
			if tt.notice != "" {
				r.SetNotice(GPU, "CDIHookMissing", tt.notice)
			}
			r.SetRemark(GPU, remark)
			r.pump(ctx)
			c := lastCondition(t, api)
			if c.Status != tt.wantStatus || c.Reason != tt.wantReason || !strings.HasSuffix(c.Message, "; "+remark) {
				t.Fatalf("with the remark: %+v", c)
			}
			if tt.healthy && c.Message != tt.wantMessage {
				t.Errorf("message %q, want %q", c.Message, tt.wantMessage)
			}
			clk.advance(time.Minute)
			r.SetRemark(GPU, "")
			r.pump(ctx)
			if c := lastCondition(t, api); c.Status != tt.wantStatus || c.Reason != tt.wantReason || strings.Contains(c.Message, remark) {
				t.Fatalf("remark cleared: %+v", c)
			}
		})
	}
}

// An Event of its own (a remediation's) goes to the Node and the device's
// holders with its reason and message.
func TestEventOfItsOwn(t *testing.T) {
	api := newFakeAPI()
	r, _ := newReporter(t, api, Options{Events: true, Holders: holders(Pod{"ml", "trainer-0", "uid-t0"})})
	r.Event(resname.GPU, "GPU-1", label1, "GPUWithheld", "withheld until it is remediated: xid=48", true)
	r.Event(resname.GPU, "GPU-1", label1, "GPUGivenBack", "given back after 2m0s", false)
	r.pump(context.Background())
	creates := ops(api.take(), "create")
	if len(creates) != 4 {
		t.Fatalf("%d Events, want 4 (node and pod, twice): %+v", len(creates), creates)
	}
	for i, w := range []struct{ kind, reason, typ, msg string }{
		{"Node", "GPUWithheld", kubeapi.EventWarning, label1 + ": withheld until it is remediated: xid=48"},
		{"Pod", "GPUWithheld", kubeapi.EventWarning, label1 + ": withheld until it is remediated: xid=48"},
		{"Node", "GPUGivenBack", kubeapi.EventNormal, label1 + ": given back after 2m0s"},
		{"Pod", "GPUGivenBack", kubeapi.EventNormal, label1 + ": given back after 2m0s"},
	} {
		e := creates[i].event
		if e.InvolvedObject.Kind != w.kind || e.Reason != w.reason || e.Type != w.typ || e.Message != w.msg {
			t.Errorf("Event %d: %s %s %s %q, want %+v", i, e.InvolvedObject.Kind, e.Type, e.Reason, e.Message, w)
		}
	}
}

// An Event about the Node itself (the remediation's cordon) goes to the
// Node only, its message as given, and asks nobody who holds what.
func TestNodeEvent(t *testing.T) {
	api := newFakeAPI()
	asked := false
	r, _ := newReporter(t, api, Options{Events: true, Holders: HoldersFunc(func(context.Context, string, string) ([]Pod, error) {
		asked = true
		return nil, nil
	})})
	r.NodeEvent("NodeCordoned", "cordoned until the node is rebooted: GPU-1: gpu-lost", true)
	r.pump(context.Background())
	creates := ops(api.take(), "create")
	if len(creates) != 1 {
		t.Fatalf("%d Events, want 1: %+v", len(creates), creates)
	}
	e := creates[0].event
	if e.InvolvedObject.Kind != "Node" || e.Reason != "NodeCordoned" || e.Type != kubeapi.EventWarning || e.Message != "cordoned until the node is rebooted: GPU-1: gpu-lost" {
		t.Errorf("Event %+v", e)
	}
	if asked {
		t.Error("asked for the holders of no device")
	}
	off, _ := newReporter(t, api, Options{NodeCondition: true})
	off.NodeEvent("NodeCordoned", "x", true)
	off.pump(context.Background())
	if got := ops(api.take(), "create"); len(got) != 0 {
		t.Errorf("%d Events with events off", len(got))
	}
}

// While the node needs a reboot, GPUHealthy says so, whatever the GPUs'
// health; cleared, it is the GPUs' again.
func TestConditionNodeReboot(t *testing.T) {
	api := newFakeAPI()
	r, clk := newReporter(t, api, Options{NodeCondition: true})
	ctx := context.Background()
	r.Transition(resname.GPU, "GPU-1", label1, false, "remediation: needsReboot: gpu-lost")
	r.Synced(GPU)
	r.SetReboot(GPU, "1 GPU(s) need a node reboot: GPU-1: gpu-lost")
	r.pump(ctx)
	c := lastCondition(t, api)
	if c.Status != "False" || c.Reason != ReasonNodeRebootRequired || !strings.HasPrefix(c.Message, "the node needs a reboot: 1 GPU(s) need a node reboot: GPU-1: gpu-lost; "+label1) {
		t.Fatalf("condition %+v", c)
	}
	clk.advance(time.Minute)
	r.SetReboot(GPU, "")
	r.Transition(resname.GPU, "GPU-1", label1, true, "")
	r.pump(ctx)
	if c := lastCondition(t, api); c.Status != "True" || c.Reason != ReasonAllGPUsHealthy {
		t.Fatalf("condition %+v", c)
	}
}

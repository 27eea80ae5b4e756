package cordon

import (
	"context"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
)

// fakeAPI is one Node. A patch applies as a JSON merge patch does, and
// only to the resourceVersion it names, as the API server's does.
type fakeAPI struct {
	mu      sync.Mutex
	node    kubeapi.Node
	rv      int
	gets    int
	patches []kubeapi.SchedulingPatch
	getErr  error
	// between runs after a read, before the patch: someone else's write.
	between func(n *kubeapi.Node)
	// block, when set, holds every read until it is closed; reading is
	// told of each read that starts.
	block, reading chan struct{}
}

func newFake(unschedulable bool, annotations map[string]string) *fakeAPI {
	f := &fakeAPI{rv: 7}
	f.node.Metadata = kubeapi.ObjectMeta{Name: "n1", ResourceVersion: "7", Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}}
	maps.Copy(f.node.Metadata.Annotations, annotations)
	f.node.Spec.Unschedulable = unschedulable
	return f
}

func (f *fakeAPI) GetNode(ctx context.Context, name string) (kubeapi.Node, error) {
	f.mu.Lock()
	block, reading := f.block, f.reading
	f.mu.Unlock()
	if reading != nil {
		select {
		case reading <- struct{}{}:
		default:
		}
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return kubeapi.Node{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if f.getErr != nil {
		return kubeapi.Node{}, f.getErr
	}
	if name != f.node.Metadata.Name {
		return kubeapi.Node{}, &kubeapi.StatusError{Code: 404}
	}
	n := f.node
	n.Metadata.Annotations = maps.Clone(n.Metadata.Annotations)
	if f.between != nil {
		f.between(&f.node)
		f.between = nil
	}
	return n, nil
}

func (f *fakeAPI) write() {
	f.rv++
	f.node.Metadata.ResourceVersion = strconv.Itoa(f.rv)
}

func (f *fakeAPI) PatchNodeScheduling(_ context.Context, name string, p kubeapi.SchedulingPatch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches = append(f.patches, p)
	if p.ResourceVersion != "" && p.ResourceVersion != f.node.Metadata.ResourceVersion {
		return &kubeapi.StatusError{Code: 409, Reason: "Conflict", Message: "the object has been modified"}
	}
	if p.Unschedulable != nil {
		f.node.Spec.Unschedulable = *p.Unschedulable
	}
	for k, v := range p.Annotations {
		if v == nil {
			delete(f.node.Metadata.Annotations, k)
		} else {
			f.node.Metadata.Annotations[k] = *v
		}
	}
	f.write()
	return nil
}

func (f *fakeAPI) state() (unschedulable bool, mark string, ours bool, patches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mark, ours = f.node.Metadata.Annotations[Annotation]
	return f.node.Spec.Unschedulable, mark, ours, len(f.patches)
}

// The Writer cordons only a schedulable Node, and uncordons only a Node
// its annotation marks; every other annotation is left alone.
func TestWriter(t *testing.T) {
	mark := map[string]string{Annotation: "GPU-0: gpu-lost"}
	for _, tc := range []struct {
		name          string
		unschedulable bool
		annotations   map[string]string
		cordon        bool // Cordon, else Uncordon
		want          Outcome
		wantOff       bool // unschedulable after
		wantMark      bool
		wantPatches   int
	}{
		{"cordon a schedulable Node", false, nil, true, Cordoned, true, true, 1},
		{"not a Node someone else cordoned", true, nil, true, CordonedByOthers, true, false, 0},
		{"ours already", true, mark, true, AlreadyOurs, true, true, 0},
		{"not again once someone lifted ours", false, mark, true, LiftedByOthers, false, true, 0},
		{"uncordon ours", true, mark, false, Uncordoned, false, false, 1},
		{"not someone else's cordon", true, nil, false, NotOurs, true, false, 0},
		{"someone lifted ours: only the annotation goes", false, mark, false, LiftedByOthers, false, false, 1},
		{"nothing of ours", false, nil, false, NotOurs, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(tc.unschedulable, tc.annotations)
			w := Writer{API: f, Node: "n1"}
			var got Outcome
			var err error
			if tc.cordon {
				got, err = w.Cordon(context.Background(), "GPU-1: xid=79")
			} else {
				got, err = w.Uncordon(context.Background())
			}
			if err != nil || got != tc.want {
				t.Fatalf("%s, %v; want %s", got, err, tc.want)
			}
			off, m, ours, n := f.state()
			if off != tc.wantOff || ours != tc.wantMark || n != tc.wantPatches {
				t.Fatalf("unschedulable %v, annotation %v (%q), %d patches; want %v, %v, %d", off, ours, m, n, tc.wantOff, tc.wantMark, tc.wantPatches)
			}
			if tc.want == Cordoned && m != "GPU-1: xid=79" {
				t.Errorf("annotation %q, want the reason", m)
			}
			if f.node.Metadata.Annotations["node.alpha.kubernetes.io/ttl"] != "0" {
				t.Error("another annotation was touched")
			}
			for _, p := range f.patches {
				if p.ResourceVersion != "7" {
					t.Errorf("patch without the resourceVersion read: %+v", p)
				}
				if tc.want == LiftedByOthers && p.Unschedulable != nil {
					t.Errorf("removing a stale annotation touched spec.unschedulable: %+v", p)
				}
			}
		})
	}
}

// An operator's cordon made between the read and the patch is not taken
// over: the patch names the version read, and the server refuses it.
func TestWriterRace(t *testing.T) {
	f := newFake(false, nil)
	f.between = func(n *kubeapi.Node) {
		n.Spec.Unschedulable = true
		n.Metadata.ResourceVersion = "8"
	}
	_, err := Writer{API: f, Node: "n1"}.Cordon(context.Background(), "GPU-0: gpu-lost")
	if kubeapi.Classify(err) != kubeapi.Transient || !strings.Contains(err.Error(), "cordoning node n1") {
		t.Fatalf("err %v, want a conflict, said in context", err)
	}
	if _, _, ours, _ := f.state(); ours {
		t.Fatal("our annotation on an operator's cordon")
	}
	// The retry reads again, and leaves the operator's cordon alone.
	if got, err := (Writer{API: f, Node: "n1"}).Cordon(context.Background(), "GPU-0: gpu-lost"); err != nil || got != CordonedByOthers {
		t.Fatalf("retry: %s, %v", got, err)
	}
}

func TestReason(t *testing.T) {
	long := strings.Repeat("é", MaxReason+10)
	if got := Reason(long); len([]rune(got)) != MaxReason || !strings.HasSuffix(got, "…") {
		t.Errorf("%d characters", len([]rune(got)))
	}
	if got := Reason("GPU-0: gpu-lost"); got != "GPU-0: gpu-lost" {
		t.Errorf("%q", got)
	}
	if Reason("") == "" {
		t.Error("an empty annotation value")
	}
}

// fakeAfter is time.After under the test's control.
type fakeAfter struct {
	asked chan time.Duration
	fired chan time.Time
}

func (f *fakeAfter) after(d time.Duration) <-chan time.Time {
	f.asked <- d
	return f.fired
}

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) NodeEvent(reason, msg string, warning bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, reason+": "+msg)
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

type keeperRig struct {
	k      *Keeper
	f      *fakeAPI
	fa     *fakeAfter
	ev     *events
	passes chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func newKeeper(t *testing.T, f *fakeAPI) *keeperRig {
	t.Helper()
	r := &keeperRig{f: f, fa: &fakeAfter{asked: make(chan time.Duration), fired: make(chan time.Time)}, ev: &events{}, passes: make(chan struct{}, 16)}
	k, err := New(f, Options{Node: "n1", Events: r.ev, Backoff: backoff.Policy{Rand: func() float64 { return 1 }}, After: r.fa.after, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	k.passed = func() { r.passes <- struct{}{} }
	r.k = k
	return r
}

func (r *keeperRig) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { r.k.Run(ctx); close(r.done) }()
	t.Cleanup(func() { r.cancel(); <-r.done })
}

func (r *keeperRig) pass(t *testing.T) {
	t.Helper()
	select {
	case <-r.passes:
	case <-time.After(10 * time.Second):
		t.Fatal("no pass")
	}
}

// until waits for passes until cond holds after one.
func (r *keeperRig) until(t *testing.T, cond func() bool) {
	t.Helper()
	r.pass(t)
	for !cond() {
		r.pass(t)
	}
}

// A failed call is retried by the backoff policy, with what is owed by
// then; the cordon is logged once made, with an Event on the Node, and so
// is its undoing.
func TestKeeperRetries(t *testing.T) {
	f := newFake(false, nil)
	f.getErr = &kubeapi.StatusError{Code: 503, Message: "etcd leader changed"}
	r := newKeeper(t, f)
	r.k.Cordon("GPU-0: gpu-lost", true)
	r.run(t)
	r.pass(t)
	if d := <-r.fa.asked; d != 2*time.Second {
		t.Fatalf("wait after a 503: %v", d)
	}
	// Asked again while waiting: no call before the wait is over.
	r.k.Cordon("GPU-0: gpu-lost", true)
	f.mu.Lock()
	f.getErr = &kubeapi.StatusError{Code: 403, Reason: "Forbidden"}
	f.mu.Unlock()
	r.fa.fired <- time.Time{}
	r.pass(t)
	if d := <-r.fa.asked; d != 2*time.Minute {
		t.Fatalf("wait after a 403 (persistent, the second failure in a row): %v", d)
	}
	f.mu.Lock()
	f.getErr = nil
	f.mu.Unlock()
	r.fa.fired <- time.Time{}
	r.pass(t)
	if off, m, _, n := f.state(); !off || m != "GPU-0: gpu-lost" || n != 1 {
		t.Fatalf("unschedulable %v, annotation %q, %d patches", off, m, n)
	}
	if got := r.ev.list(); len(got) != 1 || !strings.HasPrefix(got[0], EventCordoned+": cordoned by gpu-device-plugin until the node is rebooted: GPU-0: gpu-lost") {
		t.Fatalf("events %q", got)
	}
	r.k.Cordon("", false)
	// A pass with nothing to do may come first: the second request's wake
	// can outlast the retry it came during.
	r.until(t, func() bool { off, _, _, _ := f.state(); return !off })
	if off, _, ours, n := f.state(); off || ours || n != 2 {
		t.Fatalf("after the uncordon: unschedulable %v, annotation %v, %d patches", off, ours, n)
	}
	if got := r.ev.list(); len(got) != 2 || !strings.HasPrefix(got[1], EventUncordoned+": ") {
		t.Fatalf("events %q", got)
	}
}

// Asking never waits for the API server, even one that does not answer;
// once it answers, what was asked last is done.
func TestKeeperNeverBlocks(t *testing.T) {
	f := newFake(false, nil)
	f.block, f.reading = make(chan struct{}), make(chan struct{}, 1)
	r := newKeeper(t, f)
	r.k.Cordon("GPU-0: gpu-lost", true)
	r.run(t)
	<-f.reading // the pass hangs in its read
	for range 100 {
		r.k.Cordon("", false)
		r.k.Cordon("GPU-1: xid=79", true)
	}
	f.mu.Lock()
	close(f.block)
	f.block = nil
	f.mu.Unlock()
	// The pass that hung, then one for what was asked meanwhile.
	r.pass(t)
	r.pass(t)
	if off, m, _, _ := f.state(); !off || m != "GPU-1: xid=79" {
		t.Fatalf("unschedulable %v, annotation %q; want the last request's cordon", off, m)
	}
}

// An uncordon and then a cordon asked before Run gets to them: the
// uncordon goes first. An annotation of ours left on a Node someone
// uncordoned by hand (a restart after the reboot) so does not stop the
// new cordon; a cordon then an uncordon is only the uncordon.
func TestKeeperOrder(t *testing.T) {
	t.Run("off then on", func(t *testing.T) {
		f := newFake(false, map[string]string{Annotation: "GPU-0: gpu-lost, last boot"})
		r := newKeeper(t, f)
		r.k.Cordon("", false)
		r.k.Cordon("GPU-1: xid=79", true)
		r.run(t)
		r.pass(t)
		if off, m, _, n := f.state(); !off || m != "GPU-1: xid=79" || n != 2 {
			t.Fatalf("unschedulable %v, annotation %q, %d patches", off, m, n)
		}
	})
	t.Run("on then off", func(t *testing.T) {
		f := newFake(false, nil)
		r := newKeeper(t, f)
		r.k.Cordon("GPU-1: xid=79", true)
		r.k.Cordon("", false)
		r.run(t)
		r.pass(t)
		if off, _, ours, n := f.state(); off || ours || n != 0 {
			t.Fatalf("unschedulable %v, annotation %v, %d patches", off, ours, n)
		}
	})
}

func TestNewChecks(t *testing.T) {
	if _, err := New(nil, Options{Node: "n1"}); err == nil {
		t.Error("no API accepted")
	}
	if _, err := New(newFake(false, nil), Options{}); err == nil {
		t.Error("no node accepted")
	}
}

package nodelabels

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
)

// fakeAPI is one Node, to which patches apply as a JSON merge patch does.
type fakeAPI struct {
	mu       sync.Mutex
	node     kubeapi.Node
	gets     int
	patches  []kubeapi.MetadataPatch
	getErr   error
	patchErr error
}

func (f *fakeAPI) GetNode(_ context.Context, name string) (kubeapi.Node, error) {
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
	n.Metadata.Labels = maps.Clone(n.Metadata.Labels)
	n.Metadata.Annotations = maps.Clone(n.Metadata.Annotations)
	return n, nil
}

func (f *fakeAPI) PatchNodeMetadata(_ context.Context, name string, p kubeapi.MetadataPatch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.patchErr != nil {
		return f.patchErr
	}
	f.patches = append(f.patches, p)
	apply := func(m *map[string]string, p map[string]*string) {
		for k, v := range p {
			if v == nil {
				delete(*m, k)
				continue
			}
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[k] = *v
		}
	}
	apply(&f.node.Metadata.Labels, p.Labels)
	apply(&f.node.Metadata.Annotations, p.Annotations)
	return nil
}

func (f *fakeAPI) counts() (gets, patches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets, len(f.patches)
}

// others are labels and annotations of other agents on a GPU node, several
// in nvidia.com/: the writer must never touch them.
func others() (map[string]string, map[string]string) {
	return map[string]string{
			"kubernetes.io/hostname":          "n1",
			"nvidia.com/gpu.present":          "true",
			"nvidia.com/gpu.deploy.driver":    "true",
			"nvidia.com/mig.config":           "all-1g.10gb",
			"nvidia.com/device-plugin.config": "h100",
		}, map[string]string{
			"node.alpha.kubernetes.io/ttl": "0",
		}
}

func h100Labels() labels.Labels {
	return labels.Labels{
		"nvidia.com/gpu.product":     "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.count":       "8",
		"nvidia.com/gpu.memory":      "81559",
		"nvidia.com/mig.capable":     "true",
		"nvidia.com/cuda.driver.rev": "15",
	}
}

func newFake() *fakeAPI {
	l, a := others()
	return &fakeAPI{node: kubeapi.Node{Metadata: kubeapi.ObjectMeta{Name: "n1", Labels: l, Annotations: a}}}
}

// checkOthers fails unless the other agents' labels and annotations are as
// they were.
func checkOthers(t *testing.T, f *fakeAPI) {
	t.Helper()
	l, a := others()
	for k, v := range l {
		if got, ok := f.node.Metadata.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q (present %v), want %q untouched", k, got, ok, v)
		}
	}
	for k, v := range a {
		if f.node.Metadata.Annotations[k] != v {
			t.Errorf("annotation %s changed", k)
		}
	}
	for _, p := range f.patches {
		for k := range p.Labels {
			if _, ok := l[k]; ok {
				t.Errorf("a patch names %s", k)
			}
		}
	}
}

func TestNodeWriter(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	w := NodeWriter{API: f, Node: "n1"}
	want := h100Labels()

	if wrote, err := w.Sync(ctx, want); err != nil || !wrote {
		t.Fatalf("first sync: %v, %v", wrote, err)
	}
	for k, v := range want {
		if f.node.Metadata.Labels[k] != v {
			t.Errorf("%s = %q, want %q", k, f.node.Metadata.Labels[k], v)
		}
	}
	if got := f.node.Metadata.Annotations[Annotation]; got != strings.Join(want.Keys(), ",") {
		t.Errorf("annotation %q, want the sorted keys", got)
	}
	checkOthers(t, f)

	// At rest: a read, no write.
	if wrote, err := w.Sync(ctx, want); err != nil || wrote {
		t.Fatalf("sync at rest: %v, %v", wrote, err)
	}
	if gets, patches := f.counts(); gets != 2 || patches != 1 {
		t.Errorf("%d reads, %d patches; want 2 and 1", gets, patches)
	}

	// A label removed by hand comes back, alone in the patch.
	delete(f.node.Metadata.Labels, "nvidia.com/gpu.count")
	if wrote, err := w.Sync(ctx, want); err != nil || !wrote {
		t.Fatalf("repair: %v, %v", wrote, err)
	}
	if p := f.patches[len(f.patches)-1]; len(p.Labels) != 1 || *p.Labels["nvidia.com/gpu.count"] != "8" || p.Annotations != nil {
		t.Errorf("repair patch %+v, want gpu.count alone", p)
	}

	// One value changes, one key goes, one comes: only those, and the list.
	next := maps.Clone(want)
	next["nvidia.com/gpu.count"] = "7"
	delete(next, "nvidia.com/cuda.driver.rev")
	next["nvidia.com/mig.strategy"] = "single"
	if wrote, err := w.Sync(ctx, next); err != nil || !wrote {
		t.Fatalf("change: %v, %v", wrote, err)
	}
	p := f.patches[len(f.patches)-1]
	if len(p.Labels) != 3 || *p.Labels["nvidia.com/gpu.count"] != "7" || *p.Labels["nvidia.com/mig.strategy"] != "single" || p.Labels["nvidia.com/cuda.driver.rev"] != nil {
		t.Errorf("change patch labels %v", p.Labels)
	}
	if _, ok := f.node.Metadata.Labels["nvidia.com/cuda.driver.rev"]; ok {
		t.Error("a key no longer computed is still on the Node")
	}
	if got := f.node.Metadata.Annotations[Annotation]; got != strings.Join(next.Keys(), ",") {
		t.Errorf("annotation %q after the change", got)
	}
	checkOthers(t, f)

	// No labels any more (every GPU left out): ours go, the list too.
	if wrote, err := w.Sync(ctx, nil); err != nil || !wrote {
		t.Fatalf("no labels: %v, %v", wrote, err)
	}
	for k := range next {
		if _, ok := f.node.Metadata.Labels[k]; ok {
			t.Errorf("%s left on the Node", k)
		}
	}
	if _, ok := f.node.Metadata.Annotations[Annotation]; ok {
		t.Error("annotation left on the Node")
	}
	checkOthers(t, f)
	if wrote, err := w.Sync(ctx, nil); err != nil || wrote {
		t.Errorf("no labels, at rest: %v, %v", wrote, err)
	}
}

// A key the annotation names is deleted only if it is one of ours: an
// edited annotation cannot make the plugin delete another agent's label.
func TestNodeWriterIgnoresForeignKeysInAnnotation(t *testing.T) {
	f := newFake()
	f.node.Metadata.Labels["nvidia.com/gpu.product"] = "NVIDIA-A100"
	f.node.Metadata.Annotations[Annotation] = "kubernetes.io/hostname, nvidia.com/mig.config,nvidia.com/gpu.deploy.driver,nvidia.com/gpu.product"
	if wrote, err := (NodeWriter{API: f, Node: "n1"}).Sync(context.Background(), labels.Labels{"nvidia.com/gpu.count": "1"}); err != nil || !wrote {
		t.Fatalf("sync: %v, %v", wrote, err)
	}
	p := f.patches[0]
	if len(p.Labels) != 2 || *p.Labels["nvidia.com/gpu.count"] != "1" || p.Labels["nvidia.com/gpu.product"] != nil {
		t.Errorf("patch labels %v, want gpu.count set and gpu.product deleted", p.Labels)
	}
	if got := f.node.Metadata.Annotations[Annotation]; got != "nvidia.com/gpu.count" {
		t.Errorf("annotation %q", got)
	}
	checkOthers(t, f)
}

// Labels already right are not patched, even the first time; the list
// alone is written so that they become ours to delete later.
func TestPatchOnlyWhatDiffers(t *testing.T) {
	m := kubeapi.ObjectMeta{Labels: map[string]string{"nvidia.com/gpu.count": "8"}}
	p := Patch(m, labels.Labels{"nvidia.com/gpu.count": "8"})
	if len(p.Labels) != 0 || p.Annotations[Annotation] == nil || *p.Annotations[Annotation] != "nvidia.com/gpu.count" {
		t.Errorf("patch %+v", p)
	}
	m.Annotations = map[string]string{Annotation: "nvidia.com/gpu.count"}
	if p := Patch(m, labels.Labels{"nvidia.com/gpu.count": "8"}); !p.Empty() {
		t.Errorf("patch %+v, want none", p)
	}
	if p := Patch(kubeapi.ObjectMeta{}, nil); !p.Empty() {
		t.Errorf("patch %+v for nothing on nothing", p)
	}
}

func TestNodeWriterErrors(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	f.getErr = errors.New("connection refused")
	_, err := NodeWriter{API: f, Node: "n1"}.Sync(ctx, h100Labels())
	if !errors.Is(err, f.getErr) || !strings.Contains(err.Error(), "node n1") {
		t.Errorf("read error: %v", err)
	}
	f.getErr, f.patchErr = nil, &kubeapi.StatusError{Code: 403, Message: "denied by the policy"}
	_, err = NodeWriter{API: f, Node: "n1"}.Sync(ctx, h100Labels())
	var se *kubeapi.StatusError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "labelling node n1") {
		t.Errorf("patch error: %v", err)
	}
}

// fakeAfter is time.After under the test's control: each wait asked for
// is sent on asked, and the keeper goes on when the test calls fire.
type fakeAfter struct {
	asked chan time.Duration
	fired chan time.Time
}

func newFakeAfter() *fakeAfter {
	return &fakeAfter{asked: make(chan time.Duration), fired: make(chan time.Time)}
}

func (f *fakeAfter) after(d time.Duration) <-chan time.Time {
	f.asked <- d
	return f.fired
}

func (f *fakeAfter) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-f.asked:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper asked for no wait")
		return 0
	}
}

func (f *fakeAfter) fire() { f.fired <- time.Time{} }

// The keeper writes at once, reads at rest, retries by the backoff policy
// after a failure (slowly when the error is persistent, never before the
// server's Retry-After), and stops with its context.
func TestKeepNode(t *testing.T) {
	f := newFake()
	f.getErr = &kubeapi.StatusError{Code: 403, Reason: "Forbidden", Message: "nodes is forbidden, for now"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	fa := newFakeAfter()
	k := nodeKeeper{
		w: NodeWriter{API: f, Node: "n1"}, interval: 10 * time.Minute, after: fa.after, log: log,
		policy: backoff.Policy{Rand: func() float64 { return 1 }},
	}
	go func() {
		defer close(done)
		k.keep(ctx, h100Labels())
	}()
	// A persistent refusal: 1 min, 2 min, then the cap. Each change to
	// the fake is made while the keeper waits, before it is let go.
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute} {
		if d := fa.next(t); d != want {
			t.Fatalf("wait %d after a 403: %v, want %v", i+1, d, want)
		}
		if i < 3 {
			fa.fire()
		}
	}
	// Throttled: the server's wait, spread by a quarter.
	f.mu.Lock()
	f.getErr = &kubeapi.StatusError{Code: 429, RetryAfter: 40 * time.Second}
	f.mu.Unlock()
	fa.fire()
	if d := fa.next(t); d != 50*time.Second {
		t.Fatalf("wait after a 429 with Retry-After 40s: %v", d)
	}
	f.mu.Lock()
	f.getErr = nil
	f.mu.Unlock()
	fa.fire()
	if d := fa.next(t); d != 10*time.Minute {
		t.Fatalf("wait after the labels were written: %v", d)
	}
	if g, p := f.counts(); g != 6 || p != 1 {
		t.Fatalf("%d reads, %d patches; want 6 and 1", g, p)
	}
	// At rest: a read per interval, no write.
	for range 6 {
		fa.fire()
		if d := fa.next(t); d != 10*time.Minute {
			t.Fatalf("wait at rest: %v", d)
		}
	}
	if g, p := f.counts(); g != 12 || p != 1 {
		t.Errorf("%d reads, %d patches after an hour at rest; want 12 and 1", g, p)
	}
	// A transient error starts the run over, at the first step.
	f.mu.Lock()
	f.getErr = errors.New("connection refused")
	f.mu.Unlock()
	fa.fire()
	if d := fa.next(t); d != 2*time.Second {
		t.Fatalf("wait after a transient error: %v", d)
	}
	cancel()
	<-done
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "class=persistent") || !strings.Contains(logs.String(), "class=throttled") {
		t.Errorf("the warnings do not classify the errors:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Keep picks the writer by mode: node needs an API client, and none does
// nothing.
func TestKeepModes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := Delivery{Mode: ModeNode, Node: "n1"}
	f := newFake()
	Keep(ctx, d, nil, h100Labels(), log) // no client: logs, returns
	d.Mode = ModeNone
	Keep(ctx, d, f, h100Labels(), log)
	if g, p := f.counts(); g+p != 0 {
		t.Errorf("none: %d reads, %d patches", g, p)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	d.Mode = ModeNode
	done := make(chan struct{})
	go func() { defer close(done); Keep(ctx, d, f, h100Labels(), log) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, p := f.counts(); p == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node: no patch")
		}
	}
	cancel()
	<-done
}

// The modes are the nodeLabels setting's values, which daemon copies.
func TestModesAreTheSettingsValues(t *testing.T) {
	for mode, setting := range map[string]string{ModeNFD: config.NodeLabelsNFD, ModeNode: config.NodeLabelsNode, ModeNone: config.NodeLabelsNone} {
		if mode != setting {
			t.Errorf("mode %q, setting %q", mode, setting)
		}
	}
}

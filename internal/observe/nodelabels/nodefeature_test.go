package nodelabels

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// fakeFeatures is a namespace of NodeFeatures and Pods as the API server
// keeps them: a create of an existing name is a 409, an update with a stale
// resourceVersion a 409, every write bumps the resourceVersion.
type fakeFeatures struct {
	mu      sync.Mutex
	objects map[string]kubeapi.NodeFeature
	pods    map[string]kubeapi.Pod
	version int
	gets    int
	writes  []string // "create <name>", "update <name>"
	podErr  error
}

func newFakeFeatures() *fakeFeatures {
	return &fakeFeatures{objects: map[string]kubeapi.NodeFeature{}, pods: map[string]kubeapi.Pod{
		"plugin-x7": {Metadata: kubeapi.ObjectMeta{Name: "plugin-x7", Namespace: "gpu", UID: "pod-uid",
			OwnerReferences: []kubeapi.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "plugin", UID: "ds-uid"}}}},
		"bare": {Metadata: kubeapi.ObjectMeta{Name: "bare", Namespace: "gpu", UID: "bare-uid"}},
	}}
}

func (f *fakeFeatures) GetPod(_ context.Context, ns, name string) (kubeapi.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.podErr != nil {
		return kubeapi.Pod{}, f.podErr
	}
	p, ok := f.pods[name]
	if !ok || ns != "gpu" {
		return kubeapi.Pod{}, &kubeapi.StatusError{Code: 404}
	}
	return p, nil
}

// clone is a deep copy through JSON, as a read from the server is.
func clone(o kubeapi.NodeFeature) kubeapi.NodeFeature {
	b, _ := json.Marshal(o)
	var c kubeapi.NodeFeature
	_ = json.Unmarshal(b, &c)
	return c
}

func (f *fakeFeatures) GetNodeFeature(_ context.Context, ns, name string) (kubeapi.NodeFeature, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	o, ok := f.objects[ns+"/"+name]
	if !ok {
		return kubeapi.NodeFeature{}, &kubeapi.StatusError{Code: 404}
	}
	return clone(o), nil
}

func (f *fakeFeatures) CreateNodeFeature(_ context.Context, o kubeapi.NodeFeature) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := o.Metadata.Namespace + "/" + o.Metadata.Name
	if _, ok := f.objects[key]; ok {
		return &kubeapi.StatusError{Code: 409}
	}
	f.version++
	o.Metadata.ResourceVersion = string(rune('0' + f.version))
	f.objects[key] = clone(o)
	f.writes = append(f.writes, "create "+o.Metadata.Name)
	return nil
}

func (f *fakeFeatures) UpdateNodeFeature(_ context.Context, o kubeapi.NodeFeature) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := o.Metadata.Namespace + "/" + o.Metadata.Name
	old, ok := f.objects[key]
	switch {
	case !ok:
		return &kubeapi.StatusError{Code: 404}
	case old.Metadata.ResourceVersion != o.Metadata.ResourceVersion:
		return &kubeapi.StatusError{Code: 409}
	}
	f.version++
	o.Metadata.ResourceVersion = string(rune('0' + f.version))
	f.objects[key] = clone(o)
	f.writes = append(f.writes, "update "+o.Metadata.Name)
	return nil
}

func (f *fakeFeatures) edit(key string, change func(*kubeapi.NodeFeature)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.objects[key]
	change(&o)
	f.version++
	o.Metadata.ResourceVersion = string(rune('0' + f.version))
	f.objects[key] = o
}

func (f *fakeFeatures) counts() (gets, writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets, len(f.writes)
}

// The writer creates GFD's object, owned by the plugin's DaemonSet and Pod
// as GFD's is, writes nothing at rest, puts back what someone changed, and
// recreates the object when it is deleted.
func TestFeatureWriterSync(t *testing.T) {
	ctx := context.Background()
	f := newFakeFeatures()
	w := &FeatureWriter{API: f, Namespace: "gpu", Node: "n1", Pod: "plugin-x7"}
	l := h100Labels()
	if wrote, err := w.Sync(ctx, l); err != nil || !wrote {
		t.Fatalf("first sync: %v, %v", wrote, err)
	}
	o := f.objects["gpu/nvidia-features-for-n1"]
	yes := true
	wantOwners := []kubeapi.OwnerReference{
		{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "plugin", UID: "ds-uid", Controller: &yes},
		{APIVersion: "v1", Kind: "Pod", Name: "plugin-x7", UID: "pod-uid"},
	}
	if o.APIVersion != "nfd.k8s-sigs.io/v1alpha1" || o.Kind != "NodeFeature" ||
		!maps.Equal(o.Metadata.Labels, map[string]string{"nfd.node.kubernetes.io/node-name": "n1"}) ||
		!reflect.DeepEqual(o.Metadata.OwnerReferences, wantOwners) || !maps.Equal(o.Spec.Labels, l) {
		t.Fatalf("object %+v", o)
	}
	// At rest: a read, no write.
	for range 5 {
		if wrote, err := w.Sync(ctx, l); err != nil || wrote {
			t.Fatalf("sync at rest: %v, %v", wrote, err)
		}
	}
	if g, wr := f.counts(); g != 6 || wr != 1 {
		t.Errorf("%d reads, %d writes; want 6 and 1", g, wr)
	}
	// Someone edits it: a label removed, features added, an annotation
	// set. The writer restores the first two and keeps the annotation.
	f.edit("gpu/nvidia-features-for-n1", func(o *kubeapi.NodeFeature) {
		delete(o.Spec.Labels, "nvidia.com/gpu.count")
		o.Spec.Features.Flags = map[string]json.RawMessage{"x": json.RawMessage(`{}`)}
		o.Metadata.Annotations = map[string]string{"note": "kept"}
	})
	if wrote, err := w.Sync(ctx, l); err != nil || !wrote {
		t.Fatalf("sync after an edit: %v, %v", wrote, err)
	}
	o = f.objects["gpu/nvidia-features-for-n1"]
	if !maps.Equal(o.Spec.Labels, l) || len(o.Spec.Features.Flags) != 0 || o.Metadata.Annotations["note"] != "kept" {
		t.Errorf("after repair: %+v", o)
	}
	// A change of the labels is written at once.
	l["nvidia.com/gpu.count"] = "7"
	if wrote, err := w.Sync(ctx, l); err != nil || !wrote || f.objects["gpu/nvidia-features-for-n1"].Spec.Labels["nvidia.com/gpu.count"] != "7" {
		t.Fatalf("sync of a change: %v, %v", wrote, err)
	}
	// Deleted: created again.
	f.mu.Lock()
	delete(f.objects, "gpu/nvidia-features-for-n1")
	f.mu.Unlock()
	if wrote, err := w.Sync(ctx, l); err != nil || !wrote {
		t.Fatalf("sync after a delete: %v, %v", wrote, err)
	}
	want := []string{"create nvidia-features-for-n1", "update nvidia-features-for-n1", "update nvidia-features-for-n1", "create nvidia-features-for-n1"}
	if !reflect.DeepEqual(f.writes, want) {
		t.Errorf("writes %v, want %v", f.writes, want)
	}
}

// Owners: none without a pod name or for a pod no DaemonSet controls, as
// GFD has it; a pod that cannot be read fails the sync (to be retried),
// and once read it is not read again.
func TestFeatureWriterOwners(t *testing.T) {
	ctx := context.Background()
	for _, pod := range []string{"", "bare"} {
		f := newFakeFeatures()
		w := &FeatureWriter{API: f, Namespace: "gpu", Node: "n1", Pod: pod}
		if _, err := w.Sync(ctx, h100Labels()); err != nil {
			t.Fatal(err)
		}
		if o := f.objects["gpu/nvidia-features-for-n1"]; o.Metadata.OwnerReferences != nil {
			t.Errorf("pod %q: owners %+v", pod, o.Metadata.OwnerReferences)
		}
	}
	f := newFakeFeatures()
	f.podErr = &kubeapi.StatusError{Code: 403}
	w := &FeatureWriter{API: f, Namespace: "gpu", Node: "n1", Pod: "plugin-x7"}
	if _, err := w.Sync(ctx, h100Labels()); !errors.Is(err, f.podErr) {
		t.Fatalf("unreadable pod: %v", err)
	}
	if _, wr := f.counts(); wr != 0 {
		t.Fatalf("wrote without its owners")
	}
	f.podErr = nil
	if _, err := w.Sync(ctx, h100Labels()); err != nil || len(f.objects["gpu/nvidia-features-for-n1"].Metadata.OwnerReferences) != 2 {
		t.Fatalf("after the pod read: %v", err)
	}
	f.podErr = errors.New("not asked again")
	if _, err := w.Sync(ctx, h100Labels()); err != nil {
		t.Errorf("the pod was read again: %v", err)
	}
}

// The keeper in nodefeature mode: a write at once, a read per interval at
// rest, a retry after a failure; and Keep refuses the mode without a
// namespace.
func TestKeepNodeFeature(t *testing.T) {
	f := newFakeFeatures()
	ctx, cancel := context.WithCancel(context.Background())
	fa := newFakeAfter()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	k := nodeKeeper{w: &FeatureWriter{API: f, Namespace: "gpu", Node: "n1", Pod: "plugin-x7"}, interval: 10 * time.Minute, after: fa.after, log: log}
	done := make(chan struct{})
	go func() { defer close(done); k.keep(ctx, h100Labels()) }()
	if d := fa.next(t); d != 10*time.Minute {
		t.Fatalf("wait after the first write: %v", d)
	}
	for range 6 {
		fa.fire()
		if d := fa.next(t); d != 10*time.Minute {
			t.Fatalf("wait at rest: %v", d)
		}
	}
	if g, wr := f.counts(); g != 7 || wr != 1 {
		t.Errorf("an hour at rest: %d reads, %d writes; want 7 and 1", g, wr)
	}
	cancel()
	<-done

	f = newFakeFeatures()
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	Keep(ctx, Delivery{Mode: ModeNodeFeature, Node: "n1"}, f, h100Labels(), log)
	if g, wr := f.counts(); g+wr != 0 {
		t.Errorf("no namespace: %d reads, %d writes", g, wr)
	}
}

package slicepub

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi/kubeapitest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
)

const (
	driver = "gpu-device-plugin.github.io"
	node   = "node-a"
)

type env struct {
	kube *fake.Clientset
	pub  *Publisher
	mu   sync.Mutex
	errs []string
}

func start(t *testing.T, objs ...runtime.Object) *env {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}
	e := &env{kube: fake.NewClientset(append([]runtime.Object{n}, objs...)...)}
	kc, err := kubeapi.New(kubeapitest.Serve(t, e.kube, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.pub = Start(ctx, Options{
		Driver: driver, Node: node, API: draapi.New(kc, 1e6, 1e6, "test"),
		OnError: func(_ context.Context, err error, msg string) {
			e.mu.Lock()
			e.errs = append(e.errs, msg+": "+err.Error())
			e.mu.Unlock()
		},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(tWriter{t}, nil)),
	})
	t.Cleanup(func() { cancel(); e.pub.Stop() })
	return e
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func (e *env) slices(t *testing.T) []resourceapi.ResourceSlice {
	t.Helper()
	l, err := e.kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := l.Items
	slices.SortFunc(out, func(a, b resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// writes counts the fake's create, update and delete actions on slices.
func (e *env) writes() int {
	n := 0
	for _, a := range e.kube.Actions() {
		if a.GetResource().Resource == "resourceslices" && (a.GetVerb() == "create" || a.GetVerb() == "update" || a.GetVerb() == "delete") {
			n++
		}
	}
	return n
}

// until polls ok until it holds or the deadline passes.
func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func devices(names ...string) []resourceapi.Device {
	out := make([]resourceapi.Device, len(names))
	for i, n := range names {
		out[i] = resourceapi.Device{Name: n}
	}
	return out
}

func resources(sl ...Slice) DriverResources {
	return DriverResources{Pools: map[string]Pool{node: {Slices: sl}}}
}

var nameRE = regexp.MustCompile(`^0000[0-9a-f]-` + regexp.QuoteMeta(driver) + `-` + node + `-[a-z0-9]+$`)

// The first publication creates each slice with the upstream controller's
// name, the Node as owner, the pool's count and a first generation; the
// same resources again write nothing.
func TestCreatesThenKeeps(t *testing.T) {
	e := start(t)
	want := resources(Slice{Devices: devices("gpu-0", "gpu-1")}, Slice{Devices: devices("gpu-2")})
	if err := e.pub.PublishResources(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	until(t, "two slices", func() bool { return len(e.slices(t)) == 2 })
	for i, s := range e.slices(t) {
		if !nameRE.MatchString(s.Name) || !strings.HasPrefix(s.Name, fmt.Sprintf("%05x-", i)) {
			t.Errorf("slice %d named %q", i, s.Name)
		}
		if s.Spec.Pool != (resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 2}) || s.Spec.Driver != driver ||
			s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			t.Errorf("slice %d spec %+v", i, s.Spec)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "node-uid" || s.OwnerReferences[0].Kind != "Node" {
			t.Errorf("slice %d owners %+v", i, s.OwnerReferences)
		}
	}
	n := e.writes()
	if err := e.pub.PublishResources(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	// A change after the repeat shows the repeat was handled first.
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0", "gpu-1")}, Slice{Devices: devices("gpu-3")})); err != nil {
		t.Fatal(err)
	}
	until(t, "gpu-3 published", func() bool { s := e.slices(t); return len(s) == 2 && s[1].Spec.Devices[0].Name == "gpu-3" })
	if got := e.writes() - n; got != 1 {
		t.Errorf("%d writes for one changed slice, want 1", got)
	}
	s := e.slices(t)
	if s[0].Spec.Pool.Generation != 1 || s[1].Spec.Pool.Generation != 1 {
		t.Errorf("one slice changed: generations %d %d, want 1 (unchanged)", s[0].Spec.Pool.Generation, s[1].Spec.Pool.Generation)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) > 0 {
		t.Errorf("errors %q", e.errs)
	}
}

// A slice deleted by someone else comes back, from the watch, under a
// new generation.
func TestPutsBackADeletedSlice(t *testing.T) {
	e := start(t)
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0")}, Slice{Devices: devices("gpu-1")})); err != nil {
		t.Fatal(err)
	}
	until(t, "two slices", func() bool { return len(e.slices(t)) == 2 })
	// The fake replays no deletion to a watch that starts after it, as
	// the API server would from the list's resourceVersion: delete once
	// the publisher watches.
	until(t, "the watch", func() bool {
		return slices.ContainsFunc(e.kube.Actions(), func(a k8stesting.Action) bool {
			return a.GetVerb() == "watch" && a.GetResource().Resource == "resourceslices"
		})
	})
	gone := e.slices(t)[1].Name
	if err := e.kube.ResourceV1().ResourceSlices().Delete(context.Background(), gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "the slice put back", func() bool {
		s := e.slices(t)
		return len(s) == 2 && s[1].Name != gone && s[1].Spec.Devices[0].Name == "gpu-1"
	})
	for _, s := range e.slices(t) {
		if s.Spec.Pool.Generation != 2 {
			t.Errorf("%s generation %d, want 2", s.Name, s.Spec.Pool.Generation)
		}
	}
}

// Fewer slices: the extra one goes, the rest take a new generation.
func TestShrinks(t *testing.T) {
	e := start(t)
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0")}, Slice{Devices: devices("gpu-1")}, Slice{Devices: devices("gpu-2")})); err != nil {
		t.Fatal(err)
	}
	until(t, "three slices", func() bool { return len(e.slices(t)) == 3 })
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0", "gpu-1")})); err != nil {
		t.Fatal(err)
	}
	until(t, "one slice", func() bool {
		s := e.slices(t)
		return len(s) == 1 && len(s[0].Spec.Devices) == 2 && s[0].Spec.Pool.ResourceSliceCount == 1
	})
}

// A taint published without a time keeps the one the slice has.
func TestKeepsTaintTime(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC))
	e := start(t)
	taint := resourceapi.DeviceTaint{Key: driver + "/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &at}
	d := devices("gpu-0")
	d[0].Taints = []resourceapi.DeviceTaint{taint}
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: d})); err != nil {
		t.Fatal(err)
	}
	until(t, "one slice", func() bool { return len(e.slices(t)) == 1 })
	d2 := devices("gpu-0")
	untimed := taint
	untimed.TimeAdded = nil
	d2[0].Taints = []resourceapi.DeviceTaint{untimed, {Key: driver + "/thermal", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: d2})); err != nil {
		t.Fatal(err)
	}
	until(t, "two taints", func() bool { s := e.slices(t); return len(s) == 1 && len(s[0].Spec.Devices[0].Taints) == 2 })
	got := e.slices(t)[0].Spec.Devices[0].Taints[0]
	if got.TimeAdded == nil || !got.TimeAdded.Equal(&at) {
		t.Errorf("taint time %v, want %v", got.TimeAdded, at)
	}
}

// A pool that would be refused (a device twice) is said once, not
// retried, and nothing is written.
func TestRefusesAnInvalidPool(t *testing.T) {
	e := start(t)
	if err := e.pub.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0", "gpu-0")})); err != nil {
		t.Fatal(err)
	}
	until(t, "the error", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.errs) == 1 })
	if n := e.writes(); n != 0 {
		t.Errorf("%d writes", n)
	}
}

// Slices the upstream ResourceSlice controller published (the previous
// release) are taken over as they are: the same resources write nothing.
func TestTakesOverUpstreamSlices(t *testing.T) {
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	// The fake does not name objects from generateName; the API server does.
	var seq int
	var mu sync.Mutex
	kube.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice).DeepCopy()
		if s.Name == "" {
			mu.Lock()
			seq++
			s.Name = fmt.Sprintf("%sx%d", s.GenerateName, seq)
			mu.Unlock()
		}
		if err := kube.Tracker().Create(resourceapi.SchemeGroupVersion.WithResource("resourceslices"), s, ""); err != nil {
			return true, nil, err
		}
		return true, s, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	up := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices("gpu-0")}, {Devices: devices("gpu-1")}}}}}
	ctl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: driver, KubeClient: kube, Resources: &up,
		Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node, UID: "node-uid"},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{kube: kube}
	until(t, "the upstream slices", func() bool { return len(e.slices(t)) == 2 })
	ctl.Stop()
	cancel()
	before := e.slices(t)
	kube.ClearActions()

	kc, err := kubeapi.New(kubeapitest.Serve(t, kube, nil))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	p := Start(pctx, Options{Driver: driver, Node: node, API: draapi.New(kc, 1e6, 1e6, "test"), MinBackoff: 10 * time.Millisecond})
	defer p.Stop()
	if err := p.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0")}, Slice{Devices: devices("gpu-1")})); err != nil {
		t.Fatal(err)
	}
	// Then a change, to know the first was handled.
	if err := p.PublishResources(context.Background(), resources(Slice{Devices: devices("gpu-0")}, Slice{Devices: devices("gpu-9")})); err != nil {
		t.Fatal(err)
	}
	until(t, "gpu-9", func() bool { s := e.slices(t); return len(s) == 2 && s[1].Spec.Devices[0].Name == "gpu-9" })
	if n := e.writes(); n != 1 {
		t.Errorf("%d writes after the take-over, want 1 (the change)", n)
	}
	after := e.slices(t)
	for i := range before {
		if before[i].Name != after[i].Name {
			t.Errorf("slice %d renamed %s -> %s", i, before[i].Name, after[i].Name)
		}
	}
}

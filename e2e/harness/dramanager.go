package harness

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// draWaitTimeout bounds every wait of DRAKubelet: generous for -race on
// a loaded two-core machine; waits normally end in milliseconds.
const draWaitTimeout = 20 * time.Second

// FakeAPIServer returns client-go's fake clientset holding objs, with
// the two things of the API server that the kubelet's DRA code and the
// kubeletplugin helper rely on and the fake lacks: a create with
// generateName gets a generated name (the ResourceSlice controller names
// its slices so), and deletecollection of ResourceSlices deletes those
// that its field selector (spec.nodeName, spec.driver) matches (the
// kubelet wipes a node's slices so).
func FakeAPIServer(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateActionImpl)
		if !ok || ca.GetSubresource() != "" {
			return false, nil, nil
		}
		m, err := meta.Accessor(ca.GetObject())
		if err != nil || m.GetName() != "" || m.GetGenerateName() == "" {
			return false, nil, nil
		}
		obj := ca.GetObject().DeepCopyObject()
		m, _ = meta.Accessor(obj)
		m.SetName(names.SimpleNameGenerator.GenerateName(m.GetGenerateName()))
		if err := c.Tracker().Create(ca.GetResource(), obj, ca.GetNamespace(), ca.CreateOptions); err != nil {
			return true, nil, err
		}
		got, err := c.Tracker().Get(ca.GetResource(), ca.GetNamespace(), m.GetName())
		return true, got, err
	})
	c.PrependReactor("delete-collection", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel := a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Fields
		if sel == nil {
			sel = fields.Everything()
		}
		gvr := a.GetResource()
		list, err := c.Tracker().List(gvr, resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), "")
		if err != nil {
			return true, nil, err
		}
		for _, s := range list.(*resourceapi.ResourceSliceList).Items {
			f := fields.Set{
				resourceapi.ResourceSliceSelectorDriver:   s.Spec.Driver,
				resourceapi.ResourceSliceSelectorNodeName: "",
			}
			if s.Spec.NodeName != nil {
				f[resourceapi.ResourceSliceSelectorNodeName] = *s.Spec.NodeName
			}
			if !sel.Matches(f) {
				continue
			}
			if err := c.Tracker().Delete(gvr, "", s.Name); err != nil {
				return true, nil, err
			}
		}
		return true, nil, nil
	})
	return c
}

// Registration is one call of the DRA registration handler: what the
// kubelet's plugin manager read from a registration socket, and what
// the handler answered.
type Registration struct {
	Driver, Endpoint string
	// Services is what the plugin advertised (its "versions").
	Services []string
	// Err is RegisterPlugin's answer; nil when the kubelet accepted it.
	Err error
	// Deregistered is set when the plugin manager later saw the
	// registration socket go and deregistered it.
	Deregistered bool
}

// DRAKubelet is the DRA side of a kubelet, in process: its DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) started as the container
// manager starts it, and its plugin manager (pkg/kubelet/pluginmanager)
// watching a registry directory with the DRA manager's registration
// handler, as kubelet.go wires them. The API server is Client.
type DRAKubelet struct {
	Manager *dra.Manager
	Client  *fake.Clientset
	Node    *v1.Node

	handler  cache.PluginHandler
	plugins  *draplugin.DRAPluginManager
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at every registration event
	regs     []Registration
	wipes    []string // field selectors of the kubelet's deletecollections
	podsMu   sync.Mutex
	running  map[string]*v1.Pod // what activePods returns
	stopOnce sync.Once
	stop     func()
}

// StartDRAKubelet is NewDRAKubelet for a test: it stops when the test
// ends, and a failure to start fails the test.
func StartDRAKubelet(t *testing.T, logger klog.Logger, registryDir, nodeName string, objs ...runtime.Object) *DRAKubelet {
	t.Helper()
	k, err := NewDRAKubelet(logger, registryDir, t.TempDir(), nodeName, objs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// NewDRAKubelet starts the kubelet's DRA manager (its checkpoint in
// stateDir) and plugin manager for node nodeName on registryDir, against
// a FakeAPIServer holding the node and objs. It returns once the DRA
// manager's start-up wipe of the node's ResourceSlices is done, as a
// kubelet has done before any plugin can register. Pods count as active
// (not to be unprepared by the manager's reconcile loop) between Run and
// Remove. Stop stops both.
func NewDRAKubelet(logger klog.Logger, registryDir, stateDir, nodeName string, objs ...runtime.Object) (*DRAKubelet, error) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: types.UID("node-uid-" + nodeName)}}
	k := &DRAKubelet{
		Client:  FakeAPIServer(append([]runtime.Object{node}, objs...)...),
		Node:    node,
		changed: make(chan struct{}),
		running: map[string]*v1.Pod{},
	}
	k.Client.PrependReactor("delete-collection", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel := a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Fields
		k.update(func() { k.wipes = append(k.wipes, fmt.Sprint(sel)) })
		return false, nil, nil // the FakeAPIServer reactor deletes
	})
	m, err := dra.NewManager(logger, k.Client, stateDir)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA manager: %w", err)
	}
	k.Manager = m
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	ready := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return true })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return k.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}
	if err := m.Start(ctx, k.activePods, getNode, ready); err != nil {
		cancel()
		return nil, fmt.Errorf("starting the DRA manager: %w", err)
	}
	k.plugins = m.GetWatcherHandler().(*draplugin.DRAPluginManager)
	k.handler = m.GetWatcherHandler()

	pm := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, recordingHandler{k})
	stopCh := make(chan struct{})
	done := make(chan struct{})
	k.stop = func() {
		k.stopOnce.Do(func() {
			close(stopCh)
			<-done
			cancel()
			m.Stop()
		})
	}
	go func() {
		defer close(done)
		pm.Run(ctx, ready, stopCh)
	}()
	if err := k.await("start-up wipe of ResourceSlices", func() bool { return len(k.wipes) > 0 }); err != nil {
		k.Stop()
		return nil, err
	}
	return k, nil
}

// Stop stops the plugin manager and the DRA manager; later calls do nothing.
func (k *DRAKubelet) Stop() { k.stop() }

func (k *DRAKubelet) activePods() []*v1.Pod {
	k.podsMu.Lock()
	defer k.podsMu.Unlock()
	out := make([]*v1.Pod, 0, len(k.running))
	for _, p := range k.running {
		out = append(out, p)
	}
	return out
}

// Run counts pod as active from now on.
func (k *DRAKubelet) Run(pod *v1.Pod) {
	k.podsMu.Lock()
	defer k.podsMu.Unlock()
	k.running[string(pod.UID)] = pod
}

// Remove counts pod as no longer active.
func (k *DRAKubelet) Remove(pod *v1.Pod) {
	k.podsMu.Lock()
	defer k.podsMu.Unlock()
	delete(k.running, string(pod.UID))
}

// update changes the recorded state and wakes every waiter.
func (k *DRAKubelet) update(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f()
	close(k.changed)
	k.changed = make(chan struct{})
}

// waitFor waits until cond, called with k.mu held, is true.
func (k *DRAKubelet) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := k.await(what, cond); err != nil {
		t.Fatal(err)
	}
}

// await waits up to draWaitTimeout until cond, called with k.mu held, is true.
func (k *DRAKubelet) await(what string, cond func() bool) error {
	deadline := time.NewTimer(draWaitTimeout)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		ok, changed := cond(), k.changed
		k.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("DRA kubelet: no %s within %v; registrations %+v", what, draWaitTimeout, k.Registrations())
		}
	}
}

// Registrations returns every registration the handler saw, in order.
func (k *DRAKubelet) Registrations() []Registration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.regs)
}

// WaitRegistered waits for the n-th (from 1) accepted registration of
// driver and returns it; the kubelet has it in its plugin store then.
func (k *DRAKubelet) WaitRegistered(t *testing.T, driver string, n int) Registration {
	t.Helper()
	r, err := k.AwaitRegistered(driver, n)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// AwaitRegistered is WaitRegistered outside a test.
func (k *DRAKubelet) AwaitRegistered(driver string, n int) (Registration, error) {
	var r Registration
	err := k.await(fmt.Sprintf("registration %d of %s", n, driver), func() bool {
		seen := 0
		for _, reg := range k.regs {
			if reg.Driver == driver && reg.Err == nil {
				if seen++; seen == n {
					r = reg
					return true
				}
			}
		}
		return false
	})
	if err != nil {
		return r, err
	}
	if _, err := k.plugins.GetPlugin(driver); err != nil {
		return r, fmt.Errorf("registered, but the DRA manager has no plugin: %w", err)
	}
	return r, nil
}

// WaitDeregistered waits until every accepted registration of driver
// has been deregistered.
func (k *DRAKubelet) WaitDeregistered(t *testing.T, driver string) {
	t.Helper()
	k.waitFor(t, "deregistration of "+driver, func() bool {
		for _, reg := range k.regs {
			if reg.Driver == driver && reg.Err == nil && !reg.Deregistered {
				return false
			}
		}
		return true
	})
}

// recordingHandler is the DRA manager's registration handler, recording
// what passes through it; it changes nothing.
type recordingHandler struct{ k *DRAKubelet }

func (h recordingHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return h.k.handler.ValidatePlugin(ctx, name, endpoint, versions)
}

func (h recordingHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.k.handler.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	h.k.update(func() {
		h.k.regs = append(h.k.regs, Registration{Driver: name, Endpoint: endpoint, Services: slices.Clone(versions), Err: err})
	})
	return err
}

func (h recordingHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.k.handler.DeRegisterPlugin(ctx, name, endpoint)
	h.k.update(func() {
		for i := range h.k.regs {
			if r := &h.k.regs[i]; r.Driver == name && r.Endpoint == endpoint && r.Err == nil {
				r.Deregistered = true
			}
		}
	})
}

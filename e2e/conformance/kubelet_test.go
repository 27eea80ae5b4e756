package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// waitTimeout bounds every wait. It is generous so that a loaded
// two-core machine running -race never trips it; waits normally end in
// milliseconds.
const waitTimeout = 15 * time.Second

// endpoint is one plugin connection the kubelet accepted.
type endpoint struct {
	resource    string
	plugin      v1beta1.DevicePlugin
	options     *api.DevicePluginOptions
	connectedAt time.Time
}

// kubelet is the kubelet's device-plugin registration server with a
// handler that records what the device manager would: connected
// endpoints, rejected connections and the latest device list per
// resource. Its handler methods mirror devicemanager.ManagerImpl's.
type kubelet struct {
	srv v1beta1.Server
	log klog.Logger

	mu sync.Mutex
	// changed is closed and replaced on every update, so waiters wake
	// without polling.
	changed     chan struct{}
	endpoints   map[string]*endpoint // by plugin socket path
	connects    []endpoint           // every accepted connection, in order
	rejected    []error
	disconnects int
	lists       map[string][]*api.Device // latest ListAndWatch list, by resource
	removed     []string                 // sockets CleanupPluginDirectory removed
}

// startKubelet starts a registration server on dir/kubelet.sock, as the
// kubelet does at boot: it wipes the plugin sockets from dir first. The
// server is stopped when the test ends; stopping it twice is harmless.
func startKubelet(t *testing.T, dir string) (*kubelet, time.Time) {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	k := &kubelet{
		log:       logger,
		changed:   make(chan struct{}),
		endpoints: map[string]*endpoint{},
		lists:     map[string][]*api.Device{},
	}
	srv, err := v1beta1.NewServer(logger, filepath.Join(dir, filepath.Base(api.KubeletSocket)), k, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(logger); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	k.srv = srv
	t.Cleanup(func() { k.stop(t) })
	return k, started
}

// stop stops the registration server, which disconnects every client.
func (k *kubelet) stop(t *testing.T) {
	t.Helper()
	if err := k.srv.Stop(k.log); err != nil {
		t.Errorf("stopping kubelet registration server: %v", err)
	}
}

// update changes the recorded state and wakes every waiter.
func (k *kubelet) update(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f()
	close(k.changed)
	k.changed = make(chan struct{})
}

// CleanupPluginDirectory removes every socket in dir, as the device
// manager does on start; that includes the plugins' sockets, which is
// how a plugin learns the kubelet restarted.
func (k *kubelet) CleanupPluginDirectory(logger klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	var removed []string
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		logger.V(2).Info("removed plugin socket", "name", e.Name())
		removed = append(removed, e.Name())
	}
	k.update(func() { k.removed = append(k.removed, removed...) })
	return errors.Join(errs...)
}

// PluginConnected asks the plugin for its options and refuses a second
// connection on a socket that is still connected, as the device manager
// does.
func (k *kubelet) PluginConnected(ctx context.Context, resource string, p v1beta1.DevicePlugin) error {
	opts, err := p.API().GetDevicePluginOptions(ctx, &api.Empty{})
	now := time.Now()
	var refused error
	k.update(func() {
		switch _, dup := k.endpoints[p.SocketPath()]; {
		case err != nil:
			refused = fmt.Errorf("failed to get device plugin options: %w", err)
		case dup:
			refused = fmt.Errorf("device plugin already connected: %s", p.SocketPath())
		default:
			e := &endpoint{resource: resource, plugin: p, options: opts, connectedAt: now}
			k.endpoints[p.SocketPath()] = e
			k.connects = append(k.connects, *e)
			return
		}
		k.rejected = append(k.rejected, refused)
	})
	return refused
}

func (k *kubelet) PluginDisconnected(_ klog.Logger, _, socketPath string) {
	k.update(func() {
		if _, ok := k.endpoints[socketPath]; ok {
			delete(k.endpoints, socketPath)
			k.disconnects++
		}
	})
}

func (k *kubelet) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *api.ListAndWatchResponse) {
	k.update(func() { k.lists[resource] = resp.Devices })
}

// waitFor waits until cond, called with k.mu held, is true.
func (k *kubelet) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		ok, changed := cond(), k.changed
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			k.mu.Lock()
			defer k.mu.Unlock()
			t.Fatalf("kubelet: no %s within %v; connected %d, rejected %v, lists %v", what, waitTimeout, len(k.endpoints), k.rejected, slices.Collect(maps.Keys(k.lists)))
		}
	}
}

// waitConnected returns the first connection accepted for resource.
func (k *kubelet) waitConnected(t *testing.T, resource string) endpoint {
	t.Helper()
	var e endpoint
	k.waitFor(t, resource+" connection", func() bool {
		for _, c := range k.connects {
			if c.resource == resource {
				e = c
				return true
			}
		}
		return false
	})
	return e
}

// waitDevices waits for a device list of resource that satisfies ok and
// returns it by ID.
func (k *kubelet) waitDevices(t *testing.T, resource, what string, ok func(map[string]*api.Device) bool) map[string]*api.Device {
	t.Helper()
	var got map[string]*api.Device
	k.waitFor(t, resource+" device list with "+what, func() bool {
		list, seen := k.lists[resource]
		if !seen {
			return false
		}
		got = make(map[string]*api.Device, len(list))
		for _, d := range list {
			got[d.ID] = d
		}
		return ok(got)
	})
	return got
}

// snapshot returns the connections, rejections and disconnections seen
// so far.
func (k *kubelet) snapshot() (connects []endpoint, rejected []error, disconnects int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.connects), slices.Clone(k.rejected), k.disconnects
}

// registeredTwice reports whether the plugin registered with k more
// than once, accepted or not.
func (k *kubelet) registeredTwice() bool {
	connects, rejected, _ := k.snapshot()
	return len(connects)+len(rejected) > 1
}

// removedSockets returns the sockets CleanupPluginDirectory removed.
func (k *kubelet) removedSockets() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.removed)
}

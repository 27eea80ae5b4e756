package harness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// The plugin's public contract, as a kubelet and a container see it.
const (
	ResourceName      = "nvidia.com/gpu"
	SocketName        = "nvidia.com_gpu.sock"
	VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
)

// Endpoint is one plugin connection the kubelet accepted.
type Endpoint struct {
	Resource string
	Plugin   v1beta1.DevicePlugin
	// Options is what GetDevicePluginOptions answered at connection.
	Options *api.DevicePluginOptions
	// ConnectedAt is when the device manager accepted the connection: the
	// plugin registered, the kubelet dialled it back and got its options.
	ConnectedAt time.Time
}

// Allocate asks the plugin for one container's devices, through the
// kubelet's own client.
func (e Endpoint) Allocate(ctx context.Context, ids ...string) (*api.ContainerAllocateResponse, error) {
	resp, err := e.Plugin.API().Allocate(ctx, &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, fmt.Errorf("allocate: %d container responses for one container", n)
	}
	return resp.ContainerResponses[0], nil
}

// GetPreferredAllocation asks the plugin which size devices of available,
// including mustInclude, it prefers for one container.
func (e Endpoint) GetPreferredAllocation(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	resp, err := e.Plugin.API().GetPreferredAllocation(ctx, &api.PreferredAllocationRequest{
		ContainerRequests: []*api.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs:   available,
			MustIncludeDeviceIDs: mustInclude,
			AllocationSize:       int32(size),
		}},
	})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, fmt.Errorf("preferred allocation: %d container responses for one container", n)
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// List is one ListAndWatch answer as the kubelet received it.
type List struct {
	// Devices by ID.
	Devices map[string]*api.Device
	// ReceivedAt is when the kubelet's client handed it to the device manager.
	ReceivedAt time.Time
	// Seq counts the answers for this resource since the kubelet started, from 1.
	Seq int
}

// Healthy returns the IDs of the list's healthy devices, sorted.
func (l List) Healthy() []string {
	var ids []string
	for id, d := range l.Devices {
		if d.Health == api.Healthy {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Kubelet is the kubelet's device-plugin side: its registration server on
// <dir>/kubelet.sock and the client it runs for each plugin that registers,
// with a handler that records what the device manager would (connections,
// refusals, the latest device list per resource). Restart stops it and
// starts a fresh one on the same directory, as a kubelet restart does.
// Its methods are safe for concurrent use.
type Kubelet struct {
	dir string
	log klog.Logger

	mu   sync.Mutex
	cur  *session
	past []*session // every session before cur, oldest first
}

// session is one run of the registration server and what its handler saw.
// A restart makes a new session, so a straggling callback from a stopped
// server cannot touch the new one's state.
type session struct {
	srv     v1beta1.Server
	started time.Time

	mu sync.Mutex
	// changed is closed and replaced on every update, so waiters wake
	// without polling.
	changed     chan struct{}
	endpoints   map[string]*Endpoint // connected, by plugin socket path
	connects    []Endpoint           // every accepted connection, in order
	rejected    []error
	disconnects int
	lists       map[string]List   // latest ListAndWatch answer, by resource
	history     map[string][]List // every ListAndWatch answer, by resource
	removed     []string          // sockets CleanupPluginDirectory removed
}

// StartKubelet starts a registration server on dir/kubelet.sock, as the
// kubelet does at boot: it wipes the plugin sockets in dir first. log may
// be the zero Logger, which discards. Stop it when done.
func StartKubelet(dir string, log klog.Logger) (*Kubelet, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("starting kubelet: %w", err)
	}
	if p := filepath.Join(abs, SocketName); len(p) >= maxSocketPath {
		return nil, fmt.Errorf("starting kubelet: %s is too long for a unix socket (%d bytes, limit %d); use ShortTempDir", p, len(p), maxSocketPath-1)
	}
	k := &Kubelet{dir: abs, log: log}
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *Kubelet) start() error {
	s := &session{
		changed:   make(chan struct{}),
		endpoints: map[string]*Endpoint{},
		lists:     map[string]List{},
		history:   map[string][]List{},
	}
	srv, err := v1beta1.NewServer(k.log, filepath.Join(k.dir, filepath.Base(api.KubeletSocket)), s, s)
	if err != nil {
		return fmt.Errorf("starting kubelet: %w", err)
	}
	s.srv = srv
	if err := srv.Start(k.log); err != nil {
		return fmt.Errorf("starting kubelet: %w", err)
	}
	s.started = time.Now()
	k.mu.Lock()
	if k.cur != nil {
		k.past = append(k.past, k.cur)
	}
	k.cur = s
	k.mu.Unlock()
	return nil
}

// Start starts a new registration server after Stop, as a kubelet coming
// back after being down does: it wipes the plugin sockets and listens.
func (k *Kubelet) Start() error { return k.start() }

func (k *Kubelet) session() *session {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cur
}

// Dir is the device-plugin directory.
func (k *Kubelet) Dir() string { return k.dir }

// Started is when the current registration server's Start returned: it
// had wiped the plugin sockets and was listening.
func (k *Kubelet) Started() time.Time { return k.session().started }

// Stop stops the registration server, which disconnects every client.
// Stopping twice is harmless.
func (k *Kubelet) Stop() error {
	if err := k.session().srv.Stop(k.log); err != nil {
		return fmt.Errorf("stopping kubelet: %w", err)
	}
	return nil
}

// Restart stops the kubelet and starts a new one on the same directory.
// The new one starts with no connections or lists, and removes the
// plugin's socket on start (RemovedSockets says which it found), which is
// how a plugin learns the kubelet restarted.
func (k *Kubelet) Restart() error {
	if err := k.Stop(); err != nil {
		return err
	}
	return k.start()
}

// RemovedSockets returns the sockets the current kubelet removed at start.
func (k *Kubelet) RemovedSockets() []string {
	s := k.session()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.removed)
}

// Stats is what the current kubelet has seen of plugin connections.
type Stats struct {
	Connects    []Endpoint // accepted, in order
	Rejected    []error    // refused by the device manager
	Connected   int        // connected now
	Disconnects int
}

// Stats returns the current kubelet's connection counts.
func (k *Kubelet) Stats() Stats { return k.session().stats() }

// History returns the Stats of every kubelet run since StartKubelet,
// oldest first, the current one last. A run's Stats keep growing while
// late callbacks from its server land.
func (k *Kubelet) History() []Stats {
	k.mu.Lock()
	all := append(slices.Clone(k.past), k.cur)
	k.mu.Unlock()
	out := make([]Stats, len(all))
	for i, s := range all {
		out[i] = s.stats()
	}
	return out
}

func (s *session) stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Connects: slices.Clone(s.connects), Rejected: slices.Clone(s.rejected), Connected: len(s.endpoints), Disconnects: s.disconnects}
}

// WaitStats waits until the current kubelet's Stats satisfy ok and
// returns them. what names the wait in the error.
func (k *Kubelet) WaitStats(ctx context.Context, what string, ok func(Stats) bool) (Stats, error) {
	var got Stats
	err := k.session().waitFor(ctx, what, func(s *session) bool {
		got = Stats{Connects: slices.Clone(s.connects), Rejected: slices.Clone(s.rejected), Connected: len(s.endpoints), Disconnects: s.disconnects}
		return ok(got)
	})
	return got, err
}

// Devices returns the latest device list of resource, if any arrived.
func (k *Kubelet) Devices(resource string) (List, bool) {
	s := k.session()
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.lists[resource]
	return l, ok
}

// Lists returns every device list of resource the current kubelet
// received, oldest first: a test that must show a device never changed
// looks at each, not only the latest.
func (k *Kubelet) Lists(resource string) []List {
	s := k.session()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.history[resource])
}

// Endpoint returns the connected endpoint of resource, if any.
func (k *Kubelet) Endpoint(resource string) (Endpoint, bool) {
	s := k.session()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.endpoints {
		if e.Resource == resource {
			return *e, true
		}
	}
	return Endpoint{}, false
}

// WaitConnected waits until the current kubelet has accepted a connection
// for resource and returns the first one.
func (k *Kubelet) WaitConnected(ctx context.Context, resource string) (Endpoint, error) {
	var e Endpoint
	err := k.session().waitFor(ctx, resource+" connection", func(s *session) bool {
		for _, c := range s.connects {
			if c.Resource == resource {
				e = c
				return true
			}
		}
		return false
	})
	return e, err
}

// WaitDevices waits until the latest device list of resource satisfies ok
// and returns it. what names the wait in the error.
func (k *Kubelet) WaitDevices(ctx context.Context, resource, what string, ok func(List) bool) (List, error) {
	var got List
	err := k.session().waitFor(ctx, resource+" device list with "+what, func(s *session) bool {
		l, seen := s.lists[resource]
		if seen && ok(l) {
			got = l
			return true
		}
		return false
	})
	return got, err
}

// DeviceHealth is a WaitDevices condition: device id is listed with health
// (api.Healthy or api.Unhealthy).
func DeviceHealth(id, health string) func(List) bool {
	return func(l List) bool { d := l.Devices[id]; return d != nil && d.Health == health }
}

// DeviceCount is a WaitDevices condition: n devices are listed.
func DeviceCount(n int) func(List) bool {
	return func(l List) bool { return len(l.Devices) == n }
}

// update changes the recorded state and wakes every waiter.
func (s *session) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitFor waits until cond, called with s.mu held, is true or ctx ends.
func (s *session) waitFor(ctx context.Context, what string, cond func(*session) bool) error {
	for {
		s.mu.Lock()
		ok, changed := cond(s), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s.mu.Lock()
			defer s.mu.Unlock()
			return fmt.Errorf("kubelet: no %s: %w (connected %d, refused %v, lists for %v)",
				what, context.Cause(ctx), len(s.endpoints), s.rejected, slices.Sorted(maps.Keys(s.lists)))
		}
	}
}

// CleanupPluginDirectory removes every socket in dir, as the device
// manager does on start; that includes the plugins' sockets.
func (s *session) CleanupPluginDirectory(logger klog.Logger, dir string) error {
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
	s.update(func() { s.removed = append(s.removed, removed...) })
	return errors.Join(errs...)
}

// PluginConnected asks the plugin for its options and refuses a second
// connection on a socket that is still connected, as the device manager
// (devicemanager.ManagerImpl) does.
func (s *session) PluginConnected(ctx context.Context, resource string, p v1beta1.DevicePlugin) error {
	opts, err := p.API().GetDevicePluginOptions(ctx, &api.Empty{})
	now := time.Now()
	var refused error
	s.update(func() {
		switch _, dup := s.endpoints[p.SocketPath()]; {
		case err != nil:
			refused = fmt.Errorf("failed to get device plugin options: %w", err)
		case dup:
			refused = fmt.Errorf("device plugin already connected: %s", p.SocketPath())
		default:
			e := &Endpoint{Resource: resource, Plugin: p, Options: opts, ConnectedAt: now}
			s.endpoints[p.SocketPath()] = e
			s.connects = append(s.connects, *e)
			return
		}
		s.rejected = append(s.rejected, refused)
	})
	return refused
}

func (s *session) PluginDisconnected(_ klog.Logger, _, socketPath string) {
	s.update(func() {
		if _, ok := s.endpoints[socketPath]; ok {
			delete(s.endpoints, socketPath)
			s.disconnects++
		}
	})
}

func (s *session) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *api.ListAndWatchResponse) {
	now := time.Now()
	byID := make(map[string]*api.Device, len(resp.Devices))
	for _, d := range resp.Devices {
		byID[d.ID] = d
	}
	s.update(func() {
		l := List{Devices: byID, ReceivedAt: now, Seq: s.lists[resource].Seq + 1}
		s.lists[resource] = l
		s.history[resource] = append(s.history[resource], l)
	})
}

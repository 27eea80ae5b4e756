package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// DefaultSocketDir is where the kubelet expects device-plugin sockets.
const DefaultSocketDir = api.DevicePluginPath

// Backend supplies what is specific to a resource. Allocate gets IDs the
// server has already checked: known, healthy, each once. Its answer is in
// the API-neutral device terms; the server translates it (see Response).
// An error wrapping device.ErrNotReady reaches the kubelet as Unavailable,
// which it retries, rather than Internal.
type Backend interface {
	Allocate(ids []string) (*device.Answer, error)
}

// PreferredAllocator is implemented by backends that can choose devices.
// The server advertises GetPreferredAllocation only when it is, and calls
// Preferred with known IDs, each once, mustInclude among available, and
// len(mustInclude) < size <= len(available).
type PreferredAllocator interface {
	Preferred(available, mustInclude []string, size int) ([]string, error)
}

// Options configure a Server.
type Options struct {
	// ResourceName is the full extended-resource name, e.g. nvidia.com/gpu.
	ResourceName string
	// SocketDir is the kubelet's device-plugin directory.
	SocketDir string
	Backend   Backend
	Log       *slog.Logger

	// RegisterRetryMax caps the wait between registration attempts while
	// no kubelet answers. Zero means 5s.
	RegisterRetryMax time.Duration

	// Ready, when set, is told whether the kubelet holds this resource's
	// registration: "" once it took it, else why not (readiness).
	Ready func(why string)
}

// Server serves one resource to the kubelet.
type Server struct {
	resource   string
	dir        string
	socketPath string
	kubelet    string
	backend    Backend
	log        *slog.Logger
	retryMax   time.Duration
	ready      func(why string)

	mu   sync.Mutex
	snap *snapshot

	// regMu guards serving, which Run replaces each time it listens and
	// the register loop reads.
	regMu   sync.Mutex
	serving serving

	// handled, when set (tests), gets every directory event once Run has
	// acted on it: events are handled in order, so a marker event handled
	// means every earlier one was.
	handled func(dirEvent)
}

// New checks the options and returns a Server with no devices yet.
func New(o Options) (*Server, error) {
	if o.ResourceName == "" || !strings.Contains(o.ResourceName, "/") {
		return nil, fmt.Errorf("resource name %q must be a full extended-resource name such as nvidia.com/gpu", o.ResourceName)
	}
	if o.Backend == nil {
		return nil, errors.New("deviceplugin: Options.Backend is nil")
	}
	if o.SocketDir == "" {
		o.SocketDir = DefaultSocketDir
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.RegisterRetryMax <= 0 {
		o.RegisterRetryMax = 5 * time.Second
	}
	if o.Ready == nil {
		o.Ready = func(string) {}
	}
	o.Ready("not yet registered with the kubelet")
	return &Server{
		resource:   o.ResourceName,
		dir:        o.SocketDir,
		socketPath: filepath.Join(o.SocketDir, SocketName(o.ResourceName)),
		kubelet:    filepath.Join(o.SocketDir, filepath.Base(api.KubeletSocket)),
		backend:    o.Backend,
		log:        o.Log.With("resource", o.ResourceName),
		retryMax:   o.RegisterRetryMax,
		ready:      o.Ready,
		snap:       newSnapshot(nil),
	}, nil
}

// SocketName is the file name of a resource's socket in the plugin directory.
func SocketName(resource string) string {
	return strings.ReplaceAll(resource, "/", "_") + ".sock"
}

// SocketPath is where the server listens.
func (s *Server) SocketPath() string { return s.socketPath }

// Resource is the extended-resource name served.
func (s *Server) Resource() string { return s.resource }

func (s *Server) current() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

// replace installs a new snapshot and wakes every ListAndWatch stream.
func (s *Server) replace(devices []device.Device) {
	next := newSnapshot(devices)
	s.mu.Lock()
	prev := s.snap
	s.snap = next
	s.mu.Unlock()
	close(prev.changed)
}

// Devices returns a copy of the current device list.
func (s *Server) Devices() []device.Device {
	return slices.Clone(s.current().devices)
}

// SetDevices replaces the device list.
func (s *Server) SetDevices(devices []device.Device) {
	s.replace(slices.Clone(devices))
}

// Drop removes the devices drop says to, in one change that no health
// change made meanwhile is lost to, and reports whether it removed any.
func (s *Server) Drop(drop func(id string) bool) bool {
	s.mu.Lock()
	cur := s.snap
	devices := slices.DeleteFunc(slices.Clone(cur.devices), func(d device.Device) bool { return drop(d.ID) })
	if len(devices) == len(cur.devices) {
		s.mu.Unlock()
		return false
	}
	s.snap = newSnapshot(devices)
	s.mu.Unlock()
	close(cur.changed)
	return true
}

// SetHealth changes one device's health and reports whether anything
// changed. Unknown IDs are ignored and reported as no change.
func (s *Server) SetHealth(id string, healthy bool, reason string) bool {
	return s.SetHealthOf([]string{id}, healthy, reason)
}

// SetHealthOf changes the health of several devices at once (the
// replicas of one shared GPU), so the kubelet hears of all of them in one
// ListAndWatch answer. It reports whether anything changed; unknown IDs
// are ignored.
func (s *Server) SetHealthOf(ids []string, healthy bool, reason string) bool {
	if healthy {
		reason = ""
	}
	s.mu.Lock()
	cur := s.snap
	var devices []device.Device
	for _, id := range ids {
		i, ok := cur.byID[id]
		if !ok || (cur.devices[i].Healthy == healthy && cur.devices[i].Reason == reason) {
			continue
		}
		if devices == nil {
			devices = slices.Clone(cur.devices)
		}
		devices[i].Healthy, devices[i].Reason = healthy, reason
	}
	if devices == nil {
		s.mu.Unlock()
		return false
	}
	next := newSnapshot(devices)
	s.snap = next
	s.mu.Unlock()
	close(cur.changed)
	return true
}

func (s *Server) options() api.DevicePluginOptions {
	_, pref := s.backend.(PreferredAllocator)
	return api.DevicePluginOptions{GetPreferredAllocationAvailable: pref}
}

// Run serves the resource until ctx ends. It (re)starts the gRPC server
// whenever its socket disappears (the kubelet wipes the directory when it
// starts) and registers again whenever a kubelet socket appears. Device
// state lives in the Server, so it survives every restart.
func (s *Server) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return fmt.Errorf("creating device-plugin directory: %w", err)
	}
	watcher, err := watchDir(s.dir)
	if err != nil {
		return fmt.Errorf("watching %s: %w", s.dir, err)
	}
	defer watcher.Close()

	ctx, cancel := context.WithCancel(ctx)
	kick := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() { s.registerLoop(ctx, kick) })
	defer wg.Wait()
	defer cancel()

	// A missed inotify event must not leave the plugin unreachable forever.
	check := time.NewTicker(5 * time.Second)
	defer check.Stop()

	for {
		srv, served, id, err := s.serve()
		if err != nil {
			return err
		}
		sctx, stopServing := context.WithCancel(ctx)
		s.regMu.Lock()
		s.serving = serving{gen: s.serving.gen + 1, socket: id, ctx: sctx}
		s.regMu.Unlock()
		s.log.Info("serving", "socket", s.socketPath)
		poke(kick)
		var foreign fileID // a file not ours at our path, reported once
		restart := false
		for !restart {
			select {
			case <-ctx.Done():
				stopServing()
				srv.Stop()
				s.removeSocket(id)
				return nil
			case ev, ok := <-watcher.Events():
				if !ok {
					stopServing()
					srv.Stop()
					return errors.New("socket directory watcher closed")
				}
				switch {
				case ev.name == s.socketPath && ev.op == removed:
					// Only the loss of the socket this serving created
					// counts: the event may be for a stale file that serve
					// removed itself, and re-serving on it would remove our
					// own socket, and so on without end.
					restart = s.lost(id, &foreign, "socket removed; serving again")
				case ev.name == s.kubelet && ev.op == created:
					// The register loop tells a new kubelet from the one it
					// announced to.
					poke(kick)
				}
				if s.handled != nil {
					s.handled(ev)
				}
			case err := <-watcher.Errors():
				s.log.Warn("socket directory watcher", "err", err)
			case err := <-served:
				s.log.Error("gRPC server stopped; serving again", "err", err)
				restart = true
			case <-check.C:
				restart = s.lost(id, &foreign, "socket missing; serving again")
				// A kubelet.sock created while events were lost.
				poke(kick)
			}
		}
		stopServing()
		srv.Stop()
	}
}

// lost reports whether the socket file id is gone from our path, logging
// why. A file at our path that is not ours (another instance serving the
// same resource) is reported once and left alone: taking it back would
// make the two fight over the path.
func (s *Server) lost(id fileID, foreign *fileID, why string) bool {
	now, err := statID(s.socketPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		s.log.Info(why, "socket", s.socketPath)
		return true
	case err != nil:
		s.log.Warn(why, "socket", s.socketPath, "err", err)
		return true
	case now == id:
		return false
	case now != *foreign:
		*foreign = now
		s.log.Warn("another file replaced our socket; leaving it to its owner", "socket", s.socketPath)
	}
	return false
}

// removeSocket removes our socket on shutdown, unless it is no longer ours.
func (s *Server) removeSocket(id fileID) {
	if now, err := statID(s.socketPath); err != nil || now != id {
		return
	}
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing socket", "socket", s.socketPath, "err", err)
	}
}

// serve removes a stale socket (a crashed run's, say), listens on a fresh
// one and starts the gRPC server. It returns the identity of the socket
// file it created and a channel that yields Serve's error if it ends on
// its own.
func (s *Server) serve() (*grpcwire.Server, <-chan error, fileID, error) {
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fileID{}, fmt.Errorf("removing stale socket %s: %w", s.socketPath, err)
	}
	ln, err := net.Listen("unix", s.socketPath)
	if err != nil {
		return nil, nil, fileID{}, fmt.Errorf("listening on %s: %w", s.socketPath, err)
	}
	// Closing an old listener must never unlink the socket a newer one
	// created at the same path.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	// If the kubelet wiped it already, the zero identity matches nothing
	// and the pending removal event serves again.
	id, _ := statID(s.socketPath)
	srv := (&service{s: s}).rpcServer()
	served := make(chan error, 1)
	go func() {
		if err := srv.Serve(ln); err != nil {
			served <- err
		}
	}()
	return srv, served, id, nil
}

func poke(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

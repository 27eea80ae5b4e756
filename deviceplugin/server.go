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

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DefaultSocketDir is where the kubelet expects device-plugin sockets.
const DefaultSocketDir = pluginapi.DevicePluginPath

// Backend supplies what is specific to a resource. Allocate gets IDs the
// server has already checked: known and healthy.
type Backend interface {
	Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

// ErrNotReady, wrapped in a Backend's Allocate error, says the devices
// cannot be handed out yet (their CDI spec is not written, say): the
// kubelet gets Unavailable rather than Internal.
var ErrNotReady = errors.New("not ready")

// PreferredAllocator is implemented by backends that can choose devices.
// The server advertises GetPreferredAllocation only when it is.
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

	mu   sync.Mutex
	snap *snapshot

	// regMu makes "which serving is current" and "does its socket exist"
	// one observation for the register loop; Run holds it while it
	// creates a socket and names its serving.
	regMu  sync.Mutex
	served serving
	// servedWith is the kubelet socket present when the current serving
	// began (zero if none); registeredWith the one that answered the last
	// registration.
	servedWith, registeredWith fileID
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
	return &Server{
		resource:   o.ResourceName,
		dir:        o.SocketDir,
		socketPath: filepath.Join(o.SocketDir, SocketName(o.ResourceName)),
		kubelet:    filepath.Join(o.SocketDir, filepath.Base(pluginapi.KubeletSocket)),
		backend:    o.Backend,
		log:        o.Log.With("resource", o.ResourceName),
		retryMax:   o.RegisterRetryMax,
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
func (s *Server) replace(devices []Device) {
	next := newSnapshot(devices)
	s.mu.Lock()
	prev := s.snap
	s.snap = next
	s.mu.Unlock()
	close(prev.changed)
}

// Devices returns a copy of the current device list.
func (s *Server) Devices() []Device {
	return slices.Clone(s.current().devices)
}

// SetDevices replaces the device list.
func (s *Server) SetDevices(devices []Device) {
	s.replace(slices.Clone(devices))
}

// SetHealth changes one device's health and reports whether anything
// changed. Unknown IDs are ignored and reported as no change.
func (s *Server) SetHealth(id string, healthy bool, reason string) bool {
	if healthy {
		reason = ""
	}
	s.mu.Lock()
	cur := s.snap
	i, ok := cur.byID[id]
	if !ok || (cur.devices[i].Healthy == healthy && cur.devices[i].Reason == reason) {
		s.mu.Unlock()
		return false
	}
	devices := slices.Clone(cur.devices)
	devices[i].Healthy, devices[i].Reason = healthy, reason
	next := newSnapshot(devices)
	s.snap = next
	s.mu.Unlock()
	close(cur.changed)
	return true
}

func (s *Server) options() *pluginapi.DevicePluginOptions {
	_, pref := s.backend.(PreferredAllocator)
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: pref}
}

// Run serves the resource until ctx ends. It (re)starts the gRPC server
// whenever its socket disappears (the kubelet wipes the directory when it
// starts) and registers again whenever a kubelet socket appears. Device
// state lives in the Server, so it survives every restart.
func (s *Server) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return fmt.Errorf("creating device-plugin directory: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", s.dir, err)
	}
	defer watcher.Close()
	if err := watcher.Add(s.dir); err != nil {
		return fmt.Errorf("watching %s: %w", s.dir, err)
	}

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
		s.regMu.Lock()
		srv, served, err := s.serve()
		if err == nil {
			s.served.gen++
			s.servedWith, _ = statID(s.kubelet)
		}
		s.regMu.Unlock()
		if err != nil {
			return err
		}
		s.log.Info("serving", "socket", s.socketPath)
		poke(kick)
		restart := false
		for !restart {
			select {
			case <-ctx.Done():
				srv.Stop()
				if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
					s.log.Warn("removing socket", "socket", s.socketPath, "err", err)
				}
				return nil
			case ev, ok := <-watcher.Events:
				if !ok {
					return errors.New("socket directory watcher closed")
				}
				switch {
				case ev.Name == s.socketPath && ev.Has(fsnotify.Remove|fsnotify.Rename):
					s.log.Info("socket removed; serving again", "socket", s.socketPath)
					restart = true
				case ev.Name == s.kubelet && ev.Has(fsnotify.Create):
					// A starting kubelet wipes our socket before it listens,
					// so serving again covers most restarts. Only a kubelet
					// socket newer than this serving, that we have not
					// registered with, needs announcing again.
					s.regMu.Lock()
					id, err := statID(s.kubelet)
					if err == nil && id != s.servedWith && id != s.registeredWith {
						s.servedWith = id
						s.served.epoch++
						s.log.Info("kubelet socket created; registering again", "kubelet", s.kubelet)
					}
					s.regMu.Unlock()
					poke(kick)
				}
			case err := <-watcher.Errors:
				s.log.Warn("socket directory watcher", "err", err)
			case err := <-served:
				s.log.Error("gRPC server stopped; serving again", "err", err)
				restart = true
			case <-check.C:
				if _, err := os.Stat(s.socketPath); err != nil {
					s.log.Warn("socket missing; serving again", "socket", s.socketPath, "err", err)
					restart = true
				}
			}
		}
		srv.Stop()
	}
}

// serve listens on the socket and starts the gRPC server. The returned
// channel yields Serve's error if it ends on its own.
func (s *Server) serve() (*grpc.Server, <-chan error, error) {
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("removing stale socket %s: %w", s.socketPath, err)
	}
	ln, err := net.Listen("unix", s.socketPath)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", s.socketPath, err)
	}
	// Closing an old listener must never unlink the socket a newer one
	// created at the same path.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &service{s: s})
	served := make(chan error, 1)
	go func() {
		if err := srv.Serve(ln); err != nil {
			served <- err
		}
	}()
	return srv, served, nil
}

func poke(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

const waitFor = 10 * time.Second

// fakeKubelet is a registration server standing in for the kubelet.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv  *grpc.Server
	reqs chan *pluginapi.RegisterRequest
	ln   *net.UnixListener
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer(), reqs: make(chan *pluginapi.RegisterRequest, 16), ln: ln.(*net.UnixListener)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(ln)
	t.Cleanup(k.srv.Stop)
	return k
}

// replaceKubelet starts a kubelet whose socket replaces old's in one
// rename, as a kubelet that does not wipe the directory would. The new
// socket is made while the old one still exists, so it cannot reuse the
// old inode, which a fast restart on a coarse-clock file system could
// make indistinguishable.
func replaceKubelet(t *testing.T, dir string, old *fakeKubelet) *fakeKubelet {
	t.Helper()
	tmp := filepath.Join(dir, "kubelet.sock.new")
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	old.ln.SetUnlinkOnClose(false)
	if err := os.Rename(tmp, filepath.Join(dir, "kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	old.srv.Stop()
	k := &fakeKubelet{srv: grpc.NewServer(), reqs: make(chan *pluginapi.RegisterRequest, 16), ln: ln.(*net.UnixListener)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(ln)
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) next(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(waitFor):
		t.Fatal("no registration arrived")
		return nil
	}
}

// recordingBackend returns one env var naming the IDs it got.
type recordingBackend struct{}

func (recordingBackend) Allocate(ids []string) (*device.Answer, error) {
	return &device.Answer{Env: map[string]string{"IDS": strings.Join(ids, ",")}}, nil
}

type preferringBackend struct{ recordingBackend }

func (preferringBackend) Preferred(available, mustInclude []string, size int) ([]string, error) {
	out := slices.Clone(mustInclude)
	for _, id := range available {
		if len(out) == size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	if len(out) < size {
		return nil, fmt.Errorf("only %d available", len(out))
	}
	return out, nil
}

// failingPreferrer cannot choose.
type failingPreferrer struct{ recordingBackend }

func (failingPreferrer) Preferred([]string, []string, int) ([]string, error) {
	return nil, errors.New("no choice")
}

func testDevices() []device.Device {
	return []device.Device{
		{ID: "GPU-a", NUMANode: 0, Healthy: true},
		{ID: "GPU-b", NUMANode: 1, Healthy: true},
		{ID: "GPU-c", NUMANode: device.NoNUMANode, Healthy: true},
	}
}

// startServer runs a Server in a fresh directory until the test ends.
func startServer(t *testing.T, b Backend) (*Server, string, <-chan error) {
	t.Helper()
	dir := t.TempDir()
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: b, RegisterRetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.SetDevices(testDevices())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, dir, done
}

func dial(t testing.TB, path string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func listAndWatch(t testing.TB, c pluginapi.DevicePluginClient) pluginapi.DevicePlugin_ListAndWatchClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

func recv(t *testing.T, stream pluginapi.DevicePlugin_ListAndWatchClient) map[string]*pluginapi.Device {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*pluginapi.Device{}
	for _, d := range resp.Devices {
		out[d.ID] = d
	}
	return out
}

func TestRegistersAfterServing(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: preferringBackend{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)

	r := k.next(t)
	if r.Version != pluginapi.Version || r.ResourceName != "example.com/gpu" || r.Endpoint != "example.com_gpu.sock" {
		t.Fatalf("register request = %+v", r)
	}
	if !r.Options.GetGetPreferredAllocationAvailable() {
		t.Error("registration does not advertise GetPreferredAllocation")
	}
	// The kubelet dials back as soon as it accepts; the socket must be live.
	opts, err := dial(t, filepath.Join(dir, r.Endpoint)).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options = %v, %v", opts, err)
	}
}

func TestListAndWatchSendsTopologyAndEveryChangeToEveryStream(t *testing.T) {
	s, _, _ := startServer(t, recordingBackend{})
	c := dial(t, s.SocketPath())
	streams := []pluginapi.DevicePlugin_ListAndWatchClient{listAndWatch(t, c), listAndWatch(t, c), listAndWatch(t, c)}
	for _, st := range streams {
		got := recv(t, st)
		if len(got) != 3 {
			t.Fatalf("first list has %d devices, want 3", len(got))
		}
		if n := got["GPU-b"].Topology.GetNodes(); len(n) != 1 || n[0].ID != 1 {
			t.Errorf("GPU-b topology = %v, want NUMA node 1", got["GPU-b"].Topology)
		}
		if got["GPU-c"].Topology != nil {
			t.Errorf("GPU-c with unknown NUMA node has topology %v", got["GPU-c"].Topology)
		}
	}
	if !s.SetHealth("GPU-a", false, "xid=79") {
		t.Fatal("SetHealth reported no change")
	}
	if s.SetHealth("GPU-a", false, "xid=79") {
		t.Error("repeating a health state reported a change")
	}
	for _, st := range streams {
		if h := recv(t, st)["GPU-a"].Health; h != pluginapi.Unhealthy {
			t.Errorf("GPU-a health = %s after XID", h)
		}
	}
	s.SetHealth("GPU-a", true, "")
	for _, st := range streams {
		if h := recv(t, st)["GPU-a"].Health; h != pluginapi.Healthy {
			t.Errorf("GPU-a health = %s after recovery", h)
		}
	}
}

func TestAllocateValidatesEveryID(t *testing.T) {
	s, _, _ := startServer(t, recordingBackend{})
	s.SetHealth("GPU-b", false, "thermal")
	c := dial(t, s.SocketPath())
	tests := []struct {
		name    string
		ids     [][]string
		code    codes.Code
		mention string
		env     string
	}{
		{name: "healthy devices", ids: [][]string{{"GPU-a", "GPU-c"}}, code: codes.OK, env: "GPU-a,GPU-c"},
		{name: "unknown device", ids: [][]string{{"GPU-a", "GPU-zz"}}, code: codes.InvalidArgument, mention: "GPU-zz"},
		{name: "unhealthy device", ids: [][]string{{"GPU-b"}}, code: codes.InvalidArgument, mention: "thermal"},
		{name: "bad second container", ids: [][]string{{"GPU-a"}, {"nope"}}, code: codes.InvalidArgument, mention: "nope"},
		{name: "empty container request", ids: [][]string{{}}, code: codes.InvalidArgument, mention: "no device"},
		{name: "repeated device", ids: [][]string{{"GPU-a", "GPU-c", "GPU-a"}}, code: codes.InvalidArgument, mention: `"GPU-a" is requested more than once`},
		{name: "one device ten thousand times", ids: [][]string{slices.Repeat([]string{"GPU-c"}, 10000)}, code: codes.InvalidArgument, mention: `"GPU-c" is requested more than once`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &pluginapi.AllocateRequest{}
			for _, ids := range tt.ids {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := c.Allocate(context.Background(), req, grpc.WaitForReady(true))
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.code)
			}
			if err != nil && !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("error %q does not mention %q", err, tt.mention)
			}
			if tt.env != "" && resp.ContainerResponses[0].Envs["IDS"] != tt.env {
				t.Errorf("backend got %q, want %q", resp.ContainerResponses[0].Envs["IDS"], tt.env)
			}
		})
	}
}

func TestPreferredAllocation(t *testing.T) {
	// A hint never fails the pod: the kubelet gives up on an error.
	hints := []struct {
		name            string
		available, must []string
		size            int32
		want            []string
	}{
		{name: "unknown ids are dropped", available: []string{"GPU-a", "bogus", "GPU-b"}, must: []string{"nope"}, size: 1, want: []string{"GPU-a"}},
		{name: "repeated ids count once", available: []string{"GPU-b", "GPU-b", "GPU-a"}, must: []string{"GPU-a", "GPU-a"}, size: 2, want: []string{"GPU-a", "GPU-b"}},
		{name: "size beyond available is clamped", available: []string{"GPU-a"}, size: 2, want: []string{"GPU-a"}},
		{name: "negative size gives the must-includes", available: []string{"GPU-a", "GPU-b"}, must: []string{"GPU-b"}, size: -3, want: []string{"GPU-b"}},
		{name: "must-include not available is dropped", available: []string{"GPU-a"}, must: []string{"GPU-b"}, size: 1, want: []string{"GPU-a"}},
		{name: "nothing known", available: []string{"x", "y"}, size: 1, want: nil},
	}
	for _, tt := range hints {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := startServer(t, preferringBackend{})
			resp, err := dial(t, s.SocketPath()).GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: tt.available, MustIncludeDeviceIDs: tt.must, AllocationSize: tt.size}},
			}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, tt.want) {
				t.Errorf("preferred = %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("backend answer is returned", func(t *testing.T) {
		s, _, _ := startServer(t, preferringBackend{})
		resp, err := dial(t, s.SocketPath()).GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"GPU-a", "GPU-b", "GPU-c"}, MustIncludeDeviceIDs: []string{"GPU-c"}, AllocationSize: 2}},
		}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"GPU-c", "GPU-a"}) {
			t.Errorf("preferred = %v", got)
		}
	})
	t.Run("backend error falls back to the first available", func(t *testing.T) {
		s, _, _ := startServer(t, failingPreferrer{})
		resp, err := dial(t, s.SocketPath()).GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"GPU-c", "GPU-a", "GPU-b"}, MustIncludeDeviceIDs: []string{"GPU-b"}, AllocationSize: 2}},
		}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"GPU-b", "GPU-c"}) {
			t.Errorf("preferred = %v", got)
		}
	})
	t.Run("not offered without an allocator", func(t *testing.T) {
		s, _, _ := startServer(t, recordingBackend{})
		c := dial(t, s.SocketPath())
		opts, err := c.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}, grpc.WaitForReady(true))
		if err != nil || opts.GetPreferredAllocationAvailable {
			t.Fatalf("options = %v, %v", opts, err)
		}
		_, err = c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestRegistersOnceKubeletAppears(t *testing.T) {
	_, dir, _ := startServer(t, recordingBackend{})
	// No kubelet yet: the server retries in the background.
	k := startKubelet(t, dir)
	k.next(t)
}

// A restarting kubelet wipes the plugin directory, then listens again.
// The plugin must serve on a fresh socket, register again, and keep the
// health it knew.
func TestKubeletRestart(t *testing.T) {
	s, dir, _ := startServer(t, recordingBackend{})
	k := startKubelet(t, dir)
	k.next(t)
	s.SetHealth("GPU-b", false, "xid=48")

	for round := range 3 {
		k.srv.Stop()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		k = startKubelet(t, dir)
		r := k.next(t)
		if r.ResourceName != "example.com/gpu" {
			t.Fatalf("round %d: registered %q", round, r.ResourceName)
		}
		got := recv(t, listAndWatch(t, dial(t, filepath.Join(dir, r.Endpoint))))
		if got["GPU-b"].Health != pluginapi.Unhealthy || got["GPU-a"].Health != pluginapi.Healthy {
			t.Fatalf("round %d: health lost across restart: %v", round, got)
		}
	}
}

func TestOwnSocketRemovedServesAgain(t *testing.T) {
	s, dir, _ := startServer(t, recordingBackend{})
	k := startKubelet(t, dir)
	k.next(t)
	if err := os.Remove(s.SocketPath()); err != nil {
		t.Fatal(err)
	}
	k.next(t)
	if _, err := dial(t, s.SocketPath()).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownRemovesSocket(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: recordingBackend{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	c := dial(t, s.SocketPath())
	stream := listAndWatch(t, c)
	recv(t, stream)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after shutdown: %v", err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Error("ListAndWatch stream still open after shutdown")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{ResourceName: "gpu", Backend: recordingBackend{}}); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu") {
		t.Errorf("short resource name: err = %v", err)
	}
	if _, err := New(Options{ResourceName: "example.com/gpu"}); err == nil {
		t.Error("nil backend accepted")
	}
}

// A kubelet that restarts without wiping the directory still gets a
// registration; one that wipes it gets exactly one.
func TestRegistersOncePerKubeletStart(t *testing.T) {
	dir := t.TempDir()
	logs := &messages{ch: make(chan string, 64)}
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: recordingBackend{}, Log: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	k := startKubelet(t, dir)
	k.next(t)
	// The plugin notes which kubelet answered once Register returns; a
	// kubelet restarting before then could not be told from this one.
	logs.wait(t, "registered with kubelet")

	k = replaceKubelet(t, dir, k) // leaves our socket alone
	k.next(t)

	// A kubelet that wipes the directory, as real ones do.
	k.srv.Stop()
	for _, name := range []string{"kubelet.sock", "example.com_gpu.sock"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	k = startKubelet(t, dir)
	k.next(t)
	// Prove the absence of a second registration by a later one: a
	// deliberate re-serve must be the next request this kubelet sees.
	if err := os.Remove(filepath.Join(dir, "example.com_gpu.sock")); err != nil {
		t.Fatal(err)
	}
	k.next(t)
	select {
	case r := <-k.reqs:
		t.Fatalf("extra registration %+v", r)
	default:
	}
}

// messages is a slog handler that passes each record's message on.
type messages struct{ ch chan string }

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	select {
	case m.ch <- r.Message:
	default:
	}
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) wait(t *testing.T, msg string) {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case got := <-m.ch:
			if got == msg {
				return
			}
		case <-timeout:
			t.Fatalf("no log %q", msg)
		}
	}
}

// counter is a slog handler that counts records by message.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: map[string]int{}} }

func (c *counter) Enabled(context.Context, slog.Level) bool { return true }
func (c *counter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.n[r.Message]++
	c.mu.Unlock()
	return nil
}
func (c *counter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *counter) WithGroup(string) slog.Handler      { return c }

func (c *counter) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[msg]
}

// A run killed by SIGKILL leaves its socket behind. Removing it must not
// read as the kubelet wiping ours: the plugin would serve again, remove
// its own new socket, and so on hundreds of times a second.
func TestStaleSocketIsReplacedOnce(t *testing.T) {
	dir := t.TempDir()
	stale, err := net.Listen("unix", filepath.Join(dir, "example.com_gpu.sock"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	k := startKubelet(t, dir)
	logs := newCounter()
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: recordingBackend{}, Log: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	barrier := eventBarrier(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	k.next(t)
	first, err := statID(s.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	// Every event so far, the stale socket's removal among them, has been
	// acted on once the marker's has.
	barrier(t, dir)
	if n := logs.count("serving"); n != 1 {
		t.Errorf("served %d times, want once", n)
	}
	if now, err := statID(s.SocketPath()); err != nil || now != first {
		t.Errorf("socket re-created: %v, %v; want %v", now, err, first)
	}
	select {
	case r := <-k.reqs:
		t.Errorf("extra registration %+v", r)
	default:
	}
	if _, err := dial(t, s.SocketPath()).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); err != nil {
		t.Fatal(err)
	}
}

// A file another process put at our path is left alone: taking the path
// back would make two instances fight over it.
func TestForeignSocketIsLeftAlone(t *testing.T) {
	logs := newCounter()
	dir := t.TempDir()
	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: recordingBackend{}, Log: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	barrier := eventBarrier(s)
	k := startKubelet(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	k.next(t)
	tmp := filepath.Join(dir, "other.sock")
	other, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatal(err)
	}
	other.(*net.UnixListener).SetUnlinkOnClose(false)
	defer other.Close()
	if err := os.Rename(tmp, s.SocketPath()); err != nil {
		t.Fatal(err)
	}
	want, _ := statID(s.SocketPath())
	barrier(t, dir) // the replacement's events have been acted on
	if got, _ := statID(s.SocketPath()); got != want || logs.count("serving") != 1 {
		t.Errorf("took the path back: served %d times", logs.count("serving"))
	}
}

// Each kubelet start wipes the directory, then listens: exactly one
// registration reaches each kubelet, however fast they come and go.
func TestRestartStormRegistersOncePerKubelet(t *testing.T) {
	_, dir, _ := startServer(t, recordingBackend{})
	k := startKubelet(t, dir)
	k.next(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 100 {
		k.srv.Stop()
		// Registrations that arrived before Stop returned are queued.
		if len(k.reqs) > 0 {
			t.Fatalf("round %d: kubelet got %d registrations more than one", round, len(k.reqs))
		}
		if d := time.Duration(rng.IntN(3)) * time.Millisecond; d > 0 {
			time.Sleep(d) // the kubelet is down; not a synchronisation
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		k = startKubelet(t, dir)
		k.next(t)
	}
	k.srv.Stop()
	if len(k.reqs) > 0 {
		t.Fatalf("last kubelet got %d registrations more than one", len(k.reqs))
	}
}

// eventBarrier makes s report handled events; the returned func creates
// and removes a marker file in dir and waits until Run has handled its
// removal, and so every event before it.
func eventBarrier(s *Server) func(t *testing.T, dir string) {
	seen := make(chan string, 64)
	s.handled = func(ev dirEvent) {
		if ev.op == removed {
			select {
			case seen <- filepath.Base(ev.name):
			default:
			}
		}
	}
	n := 0
	return func(t *testing.T, dir string) {
		t.Helper()
		n++
		marker := fmt.Sprintf("marker-%d", n)
		p := filepath.Join(dir, marker)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(10 * time.Second)
		for {
			select {
			case name := <-seen:
				if name == marker {
					return
				}
			case <-deadline:
				t.Fatalf("the watch never handled %s's removal", marker)
			}
		}
	}
}

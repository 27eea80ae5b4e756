package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// The test binary runs the MPS control daemons confined, as the plugin's
// own executable does.
func TestMain(m *testing.M) {
	mpsexec.RunIfHelper()
	launcher.RunIfHelper()
	os.Exit(m.Run())
}

// A GPU shared through MPS is served once its daemon, run confined in the
// driver root, answers; a container gets its pipe directory, shared memory
// and limits; the daemon outlives the plugin, and the next plugin, which
// no longer shares the GPU, stops it and gives the GPU its compute mode
// back.
func TestMPSSharing(t *testing.T) {
	mpstest.NeedConfinement(t)
	root, _ := mpstest.DriverRoot(t)
	// The stand-in records what it is told at /etc/mockmps/record in the
	// driver root, which it is confined to with an environment of its own.
	if err := os.MkdirAll(filepath.Join(root, "etc", "mockmps"), 0o755); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(root, "etc", "mockmps", "record")
	t.Setenv("MOCKMPS_RECORD", "/not-passed-on")
	lib := nvmltest.NewDGXA100()
	open := func(string) (nvml.Library, error) { return lib, nil }
	shared := lib.Devices[0].(interface {
		GetUUID() (string, gonvml.Return)
	})
	uuid, _ := shared.GetUUID()

	cfg := testConfig(t)
	cfg.DriverRoot = root
	// The daemon needs a host's /dev (null, shm), bound into the root in
	// its own mount namespace only.
	cfg.DevRoot = "/dev"
	// The default: one share per container, which the daemon holds.
	cfg.Sharing.MPS = config.MPS{Resources: []config.SharedResource{
		{Name: "nvidia.com/gpu", Replicas: 4, Rename: "nvidia.com/gpu.mps", Devices: []string{uuid}},
	}}
	testLog := slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, open, testLog) }()

	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.mps.sock"))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for healthy := 0; healthy != 4; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		healthy = 0
		for _, d := range resp.Devices {
			if d.Health == pluginapi.Healthy {
				healthy++
			}
		}
	}
	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{uuid + "::2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	c := alloc.ContainerResponses[0]
	dir := filepath.Join(cfg.MPSRoot, uuid)
	if c.Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || c.Envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" || c.Envs["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" {
		t.Errorf("env %v", c.Envs)
	}
	want := []string{"/tmp/nvidia-mps " + filepath.Join(dir, "pipe"), "/dev/shm " + filepath.Join(dir, "shm")}
	var mounts []string
	for _, m := range c.Mounts {
		mounts = append(mounts, m.ContainerPath+" "+m.HostPath)
	}
	if !slices.Equal(mounts, want) {
		t.Errorf("mounts %q, want %q", mounts, want)
	}
	// The mounted directory is where the confined daemon listens.
	if _, err := os.Stat(filepath.Join(dir, "pipe", "control")); err != nil {
		t.Errorf("the daemon's socket: %v", err)
	}
	said := strings.Join(readLines(t, record), "\n")
	if !strings.Contains(said, "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 0 10240M") {
		t.Errorf("the daemon was told:\n%s", said)
	}
	if mode, _ := lib.Devices[0].GetComputeMode(); mode != gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode %v", mode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pipe", "control")); err != nil {
		t.Errorf("the daemon did not outlive the plugin: %v", err)
	}

	// The next plugin shares nothing: it stops the daemon before it serves.
	cfg.Sharing.MPS = config.MPS{}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	go func() { done <- Run(ctx, cfg, open, testLog) }()
	stream, err = dialPlugin(t, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.sock")).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.Devices) != 8 {
		t.Fatalf("after MPS was turned off: %v, %v", resp, err)
	}
	if lines := readLines(t, record); !strings.HasPrefix(lines[len(lines)-1], "quit -t ") {
		t.Errorf("the daemon was not told quit: %q", lines)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("its directories: %v", err)
	}
	if mode, _ := lib.Devices[0].GetComputeMode(); mode != gonvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode %v after MPS was turned off", mode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// With mpsLauncherSocket set, the plugin asks the launcher for each daemon
// instead of starting it; with no launcher answering, the GPU's shares are
// withheld and the log says what to check.
func TestMPSThroughLauncher(t *testing.T) {
	self := mpstest.NeedConfinement(t)
	root, _ := mpstest.DriverRoot(t)
	lib := nvmltest.NewDGXA100()
	open := func(string) (nvml.Library, error) { return lib, nil }
	uuid, _ := lib.Devices[0].(interface {
		GetUUID() (string, gonvml.Return)
	}).GetUUID()
	cfg := testConfig(t)
	cfg.DriverRoot, cfg.DevRoot = root, "/dev"
	cfg.MPSLauncherSocket = filepath.Join(t.TempDir(), "launcher.sock")
	cfg.Sharing.MPS = config.MPS{FailRequestsGreaterThanOne: true, Resources: []config.SharedResource{
		{Name: "nvidia.com/gpu", Replicas: 4, Rename: "nvidia.com/gpu.mps", Devices: []string{uuid}},
	}}
	dir := filepath.Join(cfg.MPSRoot, uuid)
	t.Cleanup(func() { // the daemon outlives the plugin: stop it
		cfg.Sharing.MPS = config.MPS{}
		cfg.MPSLauncherSocket = ""
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, open, slog.New(slog.DiscardHandler)) }()
		_, _ = dialPlugin(t, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.sock")).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
		cancel()
		<-done
	})
	testLog := slog.New(slog.NewTextHandler(t.Output(), nil))

	lctx, stopLauncher := context.WithCancel(context.Background())
	launched := make(chan error, 1)
	go func() {
		launched <- launcher.New(launcher.Options{Socket: cfg.MPSLauncherSocket, Root: cfg.MPSRoot, DriverRoot: root, DevRoot: "/dev", Self: self, Log: testLog}).Serve(lctx)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, open, testLog) }()
	waitHealthy(t, ctx, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.mps.sock"), 4)
	if _, err := os.Stat(filepath.Join(dir, "log", "launcher-start.log")); err != nil {
		t.Errorf("the daemon was not started by the launcher: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopLauncher()
	if err := <-launched; err != nil {
		t.Fatal(err)
	}

	// No launcher, and no daemon to adopt: the shares stay withheld, and
	// the plugin says why.
	quitDaemon(t, filepath.Join(dir, "pipe", "control"))
	said := make(chan string, 16)
	log := slog.New(watchHandler{Handler: testLog.Handler(), said: said})
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { done <- Run(ctx, cfg, open, log) }()
	for msg := ""; !strings.Contains(msg, "the MPS launcher at "+cfg.MPSLauncherSocket+" does not answer"); {
		select {
		case msg = <-said:
		case <-ctx.Done():
			t.Fatal("the plugin did not say the launcher does not answer")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// quitDaemon tells the stand-in daemon listening on sock to quit, and
// waits until it has.
func quitDaemon(t *testing.T, sock string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(c, "quit"); err != nil {
		t.Fatal(err)
	}
	// It answers, then closes its socket and exits: the read ends at
	// the close.
	_, _ = io.ReadAll(c)
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not quit")
		}
		<-time.After(10 * time.Millisecond) // another process: asked again shortly
	}
}

// watchHandler sends each record's err attribute to said.
type watchHandler struct {
	slog.Handler
	said chan<- string
}

func (h watchHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			select {
			case h.said <- a.Value.String():
			default:
			}
		}
		return true
	})
	return h.Handler.Handle(ctx, r)
}

func (h watchHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return watchHandler{Handler: h.Handler.WithAttrs(as), said: h.said}
}

func (h watchHandler) WithGroup(name string) slog.Handler {
	return watchHandler{Handler: h.Handler.WithGroup(name), said: h.said}
}

// waitHealthy waits until the plugin at sock lists want healthy devices.
func waitHealthy(t *testing.T, ctx context.Context, sock string, want int) {
	t.Helper()
	stream, err := dialPlugin(t, sock).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for healthy := 0; healthy != want; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		healthy = 0
		for _, d := range resp.Devices {
			if d.Health == pluginapi.Healthy {
				healthy++
			}
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

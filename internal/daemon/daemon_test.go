package daemon

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan *pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{reqs: make(chan *pluginapi.RegisterRequest, 16)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return k
}

func testConfig(t *testing.T) config.Config {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.DeviceInfoDir = t.TempDir() // never the machine's own
	cfg.DevicePluginDir = t.TempDir()
	cfg.SysfsRoot = t.TempDir()
	cfg.DevRoot = t.TempDir()
	cfg.MPSRoot = filepath.Join(t.TempDir(), "mps")
	cfg.RuntimeConfigRoot = t.TempDir()
	cfg.NVMLRetryInterval = config.Duration{Duration: 5 * time.Millisecond}
	return cfg
}

// A node whose driver arrives late starts serving GPUs without a restart.
func TestServesGPUsOnceDriverArrives(t *testing.T) {
	cfg := testConfig(t)
	k := startKubelet(t, cfg.DevicePluginDir)
	var attempts atomic.Int32
	open := func(path string) (nvml.Library, error) {
		if attempts.Add(1) < 3 {
			return nil, nvml.ErrNoDriver
		}
		return nvmltest.NewDGXA100(), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, open, nil) }()

	var r *pluginapi.RegisterRequest
	select {
	case r = <-k.reqs:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	if r.ResourceName != "nvidia.com/gpu" || attempts.Load() < 3 {
		t.Fatalf("registered %q after %d NVML attempts", r.ResourceName, attempts.Load())
	}
	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, r.Endpoint))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 8 {
		t.Fatalf("ListAndWatch sent %d devices, want 8", len(resp.Devices))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// An XID on one GPU reaches the kubelet's ListAndWatch stream, for that
// GPU alone.
func TestXIDReachesListAndWatch(t *testing.T) {
	cfg := testConfig(t)
	lib := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(lib)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, nil) }()

	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.sock"))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	target := first.Devices[5].ID
	events <- gonvml.EventData{Device: lib.Devices[5], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		unhealthy := 0
		for _, d := range resp.Devices {
			if d.Health == pluginapi.Unhealthy {
				unhealthy++
				if d.ID != target {
					t.Fatalf("XID on %s made %s unhealthy", target, d.ID)
				}
			}
		}
		if unhealthy == 1 {
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestStopsWhileWaitingForDriver(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var attempts atomic.Int32
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) {
			if attempts.Add(1) == 2 {
				cancel()
			}
			return nil, nvml.ErrNoDriver
		}, nil)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// dialPlugin connects to a plugin socket as the kubelet does; the
// connection closes when the test ends.
func dialPlugin(t *testing.T, path string) pluginapi.DevicePluginClient {
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

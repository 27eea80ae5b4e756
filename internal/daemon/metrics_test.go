package daemon

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
)

// addressHandler passes on the address "serving metrics" logs.
type addressHandler struct{ addr chan string }

func (h addressHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h addressHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h addressHandler) WithGroup(string) slog.Handler            { return h }
func (h addressHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "serving metrics" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "address" {
				h.addr <- a.Value.String()
			}
			return true
		})
	}
	return nil
}

// /metrics has every GPU's facts and health, and who holds them through
// either kubelet API, from the kubelet's PodResources socket.
func TestMetricsServed(t *testing.T) {
	cfg := testConfig(t)
	cfg.MetricsAddress = "127.0.0.1:0"
	cfg.NodeName = "node-1"
	kubelet := prt.Start(t)
	cfg.PodResourcesSocket = kubelet.Socket
	openDoor(t, cfg.RuntimeConfigRoot)
	lib := nvmltest.NewDGXA100()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	addr := make(chan string, 1)
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, slog.New(addressHandler{addr}))
	}()

	// The first device list comes after the GPUs' facts are recorded.
	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, "nvidia.com_gpu.sock"))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	uuid0, uuid3 := first.Devices[0].ID, first.Devices[3].ID
	kubelet.Set(
		prt.Pod("ml", "train", prt.Container("main", prt.Devices("nvidia.com/gpu", uuid0))),
		prt.Pod("ml", "dra", prt.ClaimContainer("c", prt.Claim("ml", "gpus", "gpu-device-plugin.github.io", "node-1", "gpu-3"))),
	)

	resp, err := http.Get("http://" + <-addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q, want the text format 0.0.4's", ct)
	}
	// The Go runtime's and the process's figures are served beside ours.
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("Prometheus's parser refuses /metrics: %v", err)
	}
	for _, name := range []string{"go_goroutines", "go_gc_duration_seconds", "process_resident_memory_bytes", "process_start_time_seconds"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	for _, want := range []string{
		`gpu_device_plugin_device_allocated{container="main",device="` + uuid0 + `",namespace="ml",pod="train",resource="nvidia.com/gpu"} 1`,
		`gpu_device_plugin_device_allocated{container="c",device="` + uuid3 + `",namespace="ml",pod="dra",resource="nvidia.com/gpu"} 1`,
		`gpu_device_plugin_device_healthy{device="` + uuid3 + `",reason="",resource="nvidia.com/gpu"} 1`,
		`gpu_device_plugin_device_info{device="` + uuid3 + `",index="3",model="` + nvmltest.Device(lib, 3).Name,
		`gpu_device_plugin_runtime_envvar_door_open{reason="envvarAccepted",runtime="containerd"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := strings.Count(string(body), "gpu_device_plugin_device_info{"); n != len(first.Devices) {
		t.Errorf("%d info series, want one per GPU (%d)", n, len(first.Devices))
	}
	if n := strings.Count(string(body), "gpu_device_plugin_device_allocated{"); n != 2 {
		t.Errorf("%d allocation series, want 2:\n%s", n, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// openDoor writes a containerd config under root whose default runtime is
// NVIDIA's, with the toolkit's defaults: any pod can set
// NVIDIA_VISIBLE_DEVICES.
func openDoor(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "etc", "containerd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const cfg = `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/usr/bin/nvidia-container-runtime"
`
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
}

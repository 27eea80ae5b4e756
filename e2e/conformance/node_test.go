package conformance

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

// maxSocketPath is the room sun_path leaves for a unix socket path,
// counting its terminating NUL.
const maxSocketPath = 108

// node is the plugin side: a mock DGX A100 discovered through fake sysfs
// and /dev trees, served as nvidia.com/gpu.
type node struct {
	inv     *nvml.Inventory
	devRoot string
	plugin  *deviceplugin.Server
}

// pluginDir returns an empty device-plugin directory whose socket paths
// fit in sun_path.
func pluginDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(filepath.Join(dir, deviceplugin.SocketName(resname.GPU))) >= maxSocketPath {
		t.Fatalf("plugin directory %s is too long for a unix socket; shorten the test name or TMPDIR", dir)
	}
	return dir
}

// startNode discovers the mock GPUs and runs the plugin on dir until the
// test ends.
func startNode(t *testing.T, dir string) *node {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))

	inv, err := nvml.Discover(nvmltest.NewDGXA100(), dgxSysfs(t), log.With("component", "discovery"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 8 {
		t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
	}
	n := &node{inv: inv, devRoot: devTree(t, inv.GPUs)}
	res, err := gpu.New(inv.GPUs, inv.Topology, gpu.Options{DevRoot: n.devRoot})
	if err != nil {
		t.Fatal(err)
	}
	n.plugin, err = deviceplugin.New(deviceplugin.Options{ResourceName: resname.GPU, SocketDir: dir, Backend: res, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	n.plugin.SetDevices(res.Devices())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.plugin.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin Run: %v", err)
		}
	})
	return n
}

// uuid returns the device ID of GPU i.
func (n *node) uuid(i int) string { return n.inv.GPUs[i].UUID }

// numa returns the NUMA node discovery gave the GPU with ID id, or -1.
func (n *node) numa(id string) int {
	for _, g := range n.inv.GPUs {
		if g.UUID == id {
			return g.NUMANode
		}
	}
	return -1
}

// dgxSysfs is the kernel's view of the mock: GPUs 0-3 on NUMA node 0,
// 4-7 on node 1.
func dgxSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for i := range 8 {
		dir := filepath.Join(root, "bus", "pci", "devices", nvmltest.GPUAddress(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(i/4)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// devTree is a /dev with a node per GPU minor and the control nodes a
// loaded driver creates.
func devTree(t *testing.T, gpus []nvml.GPU) string {
	t.Helper()
	root := t.TempDir()
	names := []string{"nvidiactl", "nvidia-uvm"}
	for _, g := range gpus {
		names = append(names, "nvidia"+strconv.Itoa(g.Minor))
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(root, name), nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// testWriter sends the plugin's log lines to the test log, so a failure
// shows what the plugin did.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

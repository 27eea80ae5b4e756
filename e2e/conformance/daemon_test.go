package conformance

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

// The NIC pools of internal/config/testdata/example-nics.yaml.
const (
	rdmaNUMA0 = "example.com/rdma_numa0"
	rdmaNUMA1 = "example.com/rdma_numa1"
)

// shortPluginDir returns an empty device-plugin directory outside
// t.TempDir, whose path carries the test name: the NIC resources' socket
// names are long enough for that to overflow sun_path.
func shortPluginDir(t *testing.T, resources ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, r := range resources {
		if p := filepath.Join(dir, deviceplugin.SocketName(r)); len(p) >= maxSocketPath {
			t.Fatalf("socket %s is too long for sun_path; shorten TMPDIR", p)
		}
	}
	return dir
}

// exampleNICResources are the NIC pools of the example config: ConnectX-7
// RDMA NICs, one pool per NUMA node.
func exampleNICResources(t *testing.T) []config.NICResource {
	t.Helper()
	c, err := config.Load("../../internal/config/testdata/example-nics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.NICResources) != 2 || c.NICResources[0].Name != rdmaNUMA0 || c.NICResources[1].Name != rdmaNUMA1 {
		t.Fatalf("example config's NIC pools are %v, want %s and %s", c.NICResources, rdmaNUMA0, rdmaNUMA1)
	}
	return c.NICResources
}

// startDaemon runs the whole serve process, daemon.Run (RunWith when
// opts are given), on cfg with lib as NVML (an nvmltest mock: its UUIDs
// are random, so a test that needs them discovers the same instance
// first). stop cancels it and returns what Run returned; it is also
// called when the test ends, and calling it again is harmless.
func startDaemon(t *testing.T, cfg config.Config, lib nvml.Library, opts ...daemon.Option) (stop func() error) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	open := func(string) (nvml.Library, error) { return lib, nil }
	// Never the machine's own directories.
	if cfg.StateDir == config.DefaultStateDir {
		cfg.StateDir = t.TempDir()
	}
	if cfg.DeviceInfoDir == config.DefaultDeviceInfoDir {
		cfg.DeviceInfoDir = t.TempDir()
	}
	go func() { done <- daemon.RunWith(ctx, cfg, open, log, opts...) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			deadline := time.NewTimer(waitTimeout)
			defer deadline.Stop()
			select {
			case err = <-done:
			case <-deadline.C:
				// Its goroutines may still log; the test cannot end cleanly.
				t.Fatalf("daemon.Run did not return within %v of being cancelled", waitTimeout)
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
	})
	return stop
}

package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// syncBuffer is a log sink tests can read while the daemon writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func gpus(t *testing.T) []nvml.GPU {
	t.Helper()
	inv, err := nvml.Discover(nvmltest.NewDGXA100(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return inv.GPUs
}

// The whole daemon with an unwritable spec dir: Allocate answers
// Unavailable, naming the spec, instead of a name nothing defines.
func TestAllocateRefusedWhileSpecUnwritable(t *testing.T) {
	cfg := testConfig(t)
	blocker := filepath.Join(t.TempDir(), "cdi")
	writeFile(t, blocker, "")
	cfg.CDISpecDir = filepath.Join(blocker, "specs")
	cfg.DeviceListStrategy = []string{"cdi-cri"}
	cfg.DriverRoot = t.TempDir()
	cfg.CDIHookPath = ""
	k := startKubelet(t, cfg.DevicePluginDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lib := nvmltest.NewDGXA100()
	inv, err := nvml.Discover(lib, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, nil)
	}()
	var r *pluginapi.RegisterRequest
	select {
	case r = <-k.reqs:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, r.Endpoint))
	ids := []string{inv.GPUs[0].UUID}
	_, err = client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "CDI spec of "+gpu.ResourceName) {
		t.Fatalf("Allocate with an unwritable spec dir: %v, want Unavailable naming the spec", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

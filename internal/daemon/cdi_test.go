package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
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
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "CDI spec of "+resname.GPU) {
		t.Fatalf("Allocate with an unwritable spec dir: %v, want Unavailable naming the spec", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

package wholebinary

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// An excluded GPU is not served, gets no CDI device, and its faults are
// not the plugin's business: an XID on it changes nothing, while one on a
// served GPU still does.
func TestExcludedGPU(t *testing.T) {
	path, err := harness.ProfilePath("pcie-4gpu")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := harness.ShortTempDir("gdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	logger, _ := ktesting.NewTestContext(t)
	k, err := harness.StartKubelet(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Stop() })
	specs := t.TempDir()
	// GPU 0 by its PCI address in NVML's long form.
	p := startPlugin(t, library, path, dir, "--exclude-gpus", "00000000:4f:00.0",
		"--cdi-spec-dir", specs, "--device-list-strategy", "cdi-cri", "--cdi-hook-path", "")
	excluded, served := p.Profile.GPUs[0].UUID, p.Profile.GPUs[1].UUID
	l, err := k.WaitDevices(ctx(t), harness.ResourceName, "three GPUs", harness.DeviceCount(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Devices[excluded]; ok {
		t.Fatalf("the excluded GPU %s is served", excluded)
	}
	files, _ := filepath.Glob(filepath.Join(specs, "*-gpu.json"))
	if len(files) != 1 {
		t.Fatalf("GPU CDI specs in %s: %v", specs, files)
	}
	spec, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(spec), excluded) || !strings.Contains(string(spec), served) {
		t.Errorf("the CDI spec names the excluded GPU, or not the served one:\n%s", spec)
	}
	if err := p.Inject("xid 0 79"); err != nil {
		t.Fatal(err)
	}
	if err := p.Inject("xid 1 79"); err != nil {
		t.Fatal(err)
	}
	l, err = k.WaitDevices(ctx(t), harness.ResourceName, "GPU 1 unhealthy", harness.DeviceHealth(served, api.Unhealthy))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Devices) != 3 {
		t.Errorf("%d devices after the XIDs", len(l.Devices))
	}
	for _, e := range p.LogEntries() {
		if e.String("device") == excluded && e.String("level") != "INFO" {
			t.Errorf("the plugin spoke of the excluded GPU: %v", e)
		}
	}
}

package wholebinary

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
)

// TestMIGLayoutChangeUnderRunningPlugin changes the MIG layout of a
// running plugin the way mig-manager or nvidia-smi does, through NVML on
// the same mock driver state: a 3g.40gb instance a pod holds is
// destroyed, and a 4g.40gb instance, a profile the node had none of, is
// created on the GPU in MIG mode with none. The kubelet gets the new
// resource and device without a restart, the held device stays Unhealthy
// until its pod ends, a fatal XID on a whole GPU is still reported, and
// the node labels count the new profile.
func TestMIGLayoutChangeUnderRunningPlugin(t *testing.T) {
	const (
		res3g, res4g = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-4g.40gb"
		held         = "MIG-2769e927-e4bf-4564-8537-2ef440e5c51e" // GPU 0, gi 2
		emptyGPU     = 2
	)
	path, err := harness.ProfilePath("dgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	prof, err := mocknvml.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	proc, labels := t.TempDir(), t.TempDir()
	if err := prof.WriteProc(proc); err != nil {
		t.Fatal(err)
	}
	migState := filepath.Join(t.TempDir(), "mig-state")
	env := []string{"MOCK_NVML_PROC_ROOT=" + proc, "MOCK_NVML_MIG_STATE=" + migState}
	pods := podresourcestest.Start(t)
	pods.Set(podresourcestest.Pod("default", "train", podresourcestest.Container("main", podresourcestest.Devices(res3g, held))))
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
	t.Cleanup(func() { _ = k.Stop() })
	p := startPluginEnv(t, library, path, dir, env,
		"--mig-strategy", "mixed", "--mig-layout-poll-interval", "1s", "--proc-root", proc,
		"--pod-resources-socket", pods.Socket, "--node-labels", "nfd", "--nfd-features-dir", labels)
	if _, err := k.WaitDevices(ctx(t), res3g, "the held 3g.40gb", harness.DeviceHealth(held, api.Healthy)); err != nil {
		t.Fatal(err)
	}
	whole := prof.GPUs[5].UUID
	if _, err := k.WaitDevices(ctx(t), harness.ResourceName, "every whole GPU", harness.DeviceCount(4)); err != nil {
		t.Fatal(err)
	}
	// A fatal XID on a whole GPU before the change.
	if err := p.Inject("xid 5 79"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.WaitDevices(ctx(t), harness.ResourceName, "GPU 5 Unhealthy", harness.DeviceHealth(whole, api.Unhealthy)); err != nil {
		t.Fatal(err)
	}

	// mig-manager's part, in this process on the same driver state.
	t.Setenv("MOCK_NVML_PROFILE", path)
	t.Setenv("MOCK_NVML_PROC_ROOT", proc)
	t.Setenv("MOCK_NVML_MIG_STATE", migState)
	t.Setenv("MOCK_NVML_CONTROL", "")
	lib := gonvml.New(gonvml.WithLibraryPath(library))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	gpu0, ret := lib.DeviceGetHandleByIndex(0)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := gpu0.GetGpuInstanceById(2)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetGpuInstanceById(2): %v", ret)
	}
	ci, ret := gi.GetComputeInstanceById(0)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetComputeInstanceById(0): %v", ret)
	}
	if ret := ci.Destroy(); ret != gonvml.SUCCESS {
		t.Fatalf("ComputeInstance.Destroy: %v", ret)
	}
	if ret := gi.Destroy(); ret != gonvml.SUCCESS {
		t.Fatalf("GpuInstance.Destroy: %v", ret)
	}
	empty, ret := lib.DeviceGetHandleByIndex(emptyGPU)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := empty.GetGpuInstanceProfileInfo(gonvml.GPU_INSTANCE_PROFILE_4_SLICE)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(4 slices): %v", ret)
	}
	ngi, ret := empty.CreateGpuInstance(&info)
	if ret != gonvml.SUCCESS {
		t.Fatalf("CreateGpuInstance(4g): %v", ret)
	}
	ciInfo, ret := ngi.GetComputeInstanceProfileInfo(gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo(4 slices): %v", ret)
	}
	if _, ret := ngi.CreateComputeInstance(&ciInfo); ret != gonvml.SUCCESS {
		t.Fatalf("CreateComputeInstance: %v", ret)
	}
	changed := time.Now()

	// The new profile registers, its device Healthy.
	l, err := k.WaitDevices(ctx(t), res4g, "a healthy 4g.40gb", func(l harness.List) bool { return len(l.Healthy()) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("layout changed to the kubelet's new device: %s", l.ReceivedAt.Sub(changed).Round(time.Millisecond))
	// The destroyed device a pod holds stays, Unhealthy.
	l3, err := k.WaitDevices(ctx(t), res3g, "the held 3g.40gb Unhealthy", harness.DeviceHealth(held, api.Unhealthy))
	if err != nil {
		t.Fatal(err)
	}
	if len(l3.Devices) != 1 {
		t.Errorf("%s lists %d devices, want the held one alone", res3g, len(l3.Devices))
	}
	// GPU 5's fatal XID is carried over.
	if l, _ := k.Devices(harness.ResourceName); l.Devices[whole] == nil || l.Devices[whole].Health != api.Unhealthy {
		t.Errorf("GPU 5 after the change: %+v, want Unhealthy (xid=79 carried)", l.Devices[whole])
	}
	// The labels count the new profile.
	eventually(t, "the labels count 4g.40gb", func() bool {
		b, _ := os.ReadFile(filepath.Join(labels, "gpu-device-plugin"))
		if len(b) == 0 {
			matches, _ := filepath.Glob(filepath.Join(labels, "*"))
			for _, m := range matches {
				if c, _ := os.ReadFile(m); strings.Contains(string(c), "mig-4g.40gb.count=1") {
					return true
				}
			}
			return false
		}
		return strings.Contains(string(b), "mig-4g.40gb.count=1")
	})
	// The pod ends: the device goes.
	pods.Set()
	if _, err := k.WaitDevices(ctx(t), res3g, "no device", harness.DeviceCount(0)); err != nil {
		t.Fatal(err)
	}
	if l, _ := k.Devices(harness.ResourceName); l.Devices[whole] == nil || l.Devices[whole].Health != api.Unhealthy {
		t.Errorf("GPU 5 at the end: %+v, want Unhealthy", l.Devices[whole])
	}
}

package mocknvml

import (
	"os"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

func TestFabricInfo(t *testing.T) {
	for _, profile := range []string{"gb200-split", "gb200-tray", "dgx-h100"} {
		t.Run(profile, func(t *testing.T) {
			runChild(t, "TestChildFabricInfo", "MOCK_NVML_PROFILE="+profilePath(profile))
		})
	}
}

// TestChildFabricInfo: both fabric calls answer what the profile says
// through go-nvml's real binding, in NVML's layouts (v1, and the versioned
// call's v2 and v3), NOT_SUPPORTED for a GPU
// without fabric; and the plugin's discovery reads the same.
func TestChildFabricInfo(t *testing.T) {
	childOnly(t)
	prof, err := LoadProfile(os.Getenv("MOCK_NVML_PROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	inv, err := nvml.Discover(lib, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range prof.GPUs {
		h, _ := lib.DeviceGetHandleByIndex(i)
		v1, ret1 := h.GetGpuFabricInfo()
		v2, ret2 := h.GetGpuFabricInfoV().V2()
		v3, ret3 := h.GetGpuFabricInfoV().V3()
		if g.Fabric == nil {
			if ret1 != gonvml.ERROR_NOT_SUPPORTED || ret2 != gonvml.ERROR_NOT_SUPPORTED || ret3 != gonvml.ERROR_NOT_SUPPORTED {
				t.Errorf("GPU %d without fabric: %v, %v, %v; want NOT_SUPPORTED", i, ret1, ret2, ret3)
			}
			if inv.GPUs[i].Fabric != nil {
				t.Errorf("GPU %d: discovery found fabric %+v", i, *inv.GPUs[i].Fabric)
			}
			continue
		}
		if ret1 != gonvml.SUCCESS || ret2 != gonvml.SUCCESS || ret3 != gonvml.SUCCESS {
			t.Fatalf("GPU %d: %v, %v, %v", i, ret1, ret2, ret3)
		}
		uuid := v1.ClusterUuid
		if v1.CliqueId != g.Fabric.CliqueID || v1.State != gonvml.GPU_FABRIC_STATE_COMPLETED || v1.Status != uint32(gonvml.SUCCESS) {
			t.Errorf("GPU %d v1: %+v", i, v1)
		}
		if v2.ClusterUuid != uuid || v2.CliqueId != v1.CliqueId || v2.State != v1.State || v2.Status != v1.Status || v2.HealthMask == 0 {
			t.Errorf("GPU %d v2: %+v, v1 %+v", i, v2, v1)
		}
		if v3.ClusterUuid != uuid || v3.CliqueId != v1.CliqueId || v3.HealthMask != v2.HealthMask || v3.HealthSummary != 1 {
			t.Errorf("GPU %d v3: %+v", i, v3)
		}
		want := nvml.Fabric{ClusterUUID: g.Fabric.ClusterUUID, CliqueID: g.Fabric.CliqueID, State: nvml.FabricCompleted, HealthMask: v2.HealthMask}
		if f := inv.GPUs[i].Fabric; f == nil || *f != want || !f.Registered() {
			t.Errorf("GPU %d: discovery found %+v, want %+v", i, f, want)
		}
	}
}

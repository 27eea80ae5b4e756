package mocknvml

import (
	"os"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestQueries(t *testing.T) {
	for _, profile := range []string{"dgx-h100", "pcie-4gpu"} {
		t.Run(profile, func(t *testing.T) {
			runChild(t, "TestChildQueries", "MOCK_NVML_PROFILE="+profilePath(profile))
		})
	}
}

func cstr(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// TestChildQueries pins answers discovery does not look at closely: the
// exact strings NVML writes, lookups by other keys, and the per-link calls.
func TestChildQueries(t *testing.T) {
	childOnly(t)
	prof, err := LoadProfile(os.Getenv("MOCK_NVML_PROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.InitWithFlags(0); ret != gonvml.SUCCESS {
		t.Fatalf("InitWithFlags: %v", ret)
	}
	// A second Init is counted: one Shutdown leaves NVML usable.
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	if ret := lib.Shutdown(); ret != gonvml.SUCCESS {
		t.Fatalf("Shutdown: %v", ret)
	}
	defer lib.Shutdown()

	if v, ret := lib.SystemGetCudaDriverVersion_v2(); ret != gonvml.SUCCESS || v != 12040 {
		t.Errorf("SystemGetCudaDriverVersion_v2 = %d, %v", v, ret)
	}
	if s := lib.ErrorString(gonvml.ERROR_GPU_IS_LOST); s != "GPU is lost" {
		t.Errorf("ErrorString(GPU_IS_LOST) = %q", s)
	}
	h := make([]gonvml.Device, len(prof.GPUs))
	for i := range h {
		h[i], _ = lib.DeviceGetHandleByIndex(i)
	}
	if _, ret := lib.DeviceGetHandleByIndex(len(h)); ret != gonvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex past the end: %v", ret)
	}

	last := len(h) - 1
	g := prof.GPUs[last]
	pci, ret := h[last].GetPciInfo()
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetPciInfo: %v", ret)
	}
	// NVML writes upper-case hex, with an 8-digit domain in busId.
	wantBus := map[string]string{"dgx-h100": "00000000:DB:00.0", "pcie-4gpu": "00000000:D1:00.0"}[prof.Name]
	if cstr(pci.BusId[:]) != wantBus || cstr(pci.BusIdLegacy[:]) != wantBus[4:] || pci.Domain != 0 || pci.Device != 0 ||
		pci.PciDeviceId != g.PCIDeviceID {
		t.Errorf("GetPciInfo = busId %q legacy %q domain %d device %d id %#x, want %s", cstr(pci.BusId[:]),
			cstr(pci.BusIdLegacy[:]), pci.Domain, pci.Device, pci.PciDeviceId, wantBus)
	}
	for _, id := range []string{wantBus, wantBus[4:], g.BusID} {
		if d, ret := lib.DeviceGetHandleByPciBusId(id); ret != gonvml.SUCCESS || d != h[last] {
			t.Errorf("DeviceGetHandleByPciBusId(%q) = %v, %v; want GPU %d", id, d, ret, last)
		}
	}
	if _, ret := lib.DeviceGetHandleByPciBusId("0000:01:00.0"); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByPciBusId of no GPU: %v, want NOT_FOUND", ret)
	}
	if d, ret := lib.DeviceGetHandleByUUID(g.UUID); ret != gonvml.SUCCESS || d != h[last] {
		t.Errorf("DeviceGetHandleByUUID = %v, %v", d, ret)
	}
	if _, ret := lib.DeviceGetHandleByUUID("GPU-nope"); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID of no GPU: %v, want NOT_FOUND", ret)
	}
	if i, ret := h[last].GetIndex(); ret != gonvml.SUCCESS || i != last {
		t.Errorf("GetIndex = %d, %v", i, ret)
	}
	if mem, ret := h[last].GetMemoryInfo_v2(); ret != gonvml.SUCCESS || mem.Total != g.MemoryBytes() || mem.Free != g.MemoryBytes() {
		t.Errorf("GetMemoryInfo_v2 = %+v, %v", mem, ret)
	}
	if n, ret := h[last].GetNumaNodeId(); ret != gonvml.SUCCESS || n != 1 {
		t.Errorf("GetNumaNodeId = %d, %v; want 1", n, ret)
	}
	if l, ret := h[0].GetTopologyCommonAncestor(h[0]); ret != gonvml.SUCCESS || l != gonvml.TOPOLOGY_INTERNAL {
		t.Errorf("GetTopologyCommonAncestor with itself = %v, %v", l, ret)
	}
	if l, ret := h[0].GetTopologyCommonAncestor(h[last]); ret != gonvml.SUCCESS || l != gonvml.TOPOLOGY_SYSTEM {
		t.Errorf("GetTopologyCommonAncestor across sockets = %v, %v", l, ret)
	}

	switch prof.Name {
	case "dgx-h100":
		if a, ret := h[0].GetArchitecture(); ret != gonvml.SUCCESS || a != gonvml.DEVICE_ARCH_HOPPER {
			t.Errorf("GetArchitecture = %v, %v", a, ret)
		}
		if mj, mn, ret := h[0].GetCudaComputeCapability(); ret != gonvml.SUCCESS || mj != 9 || mn != 0 {
			t.Errorf("GetCudaComputeCapability = %d.%d, %v", mj, mn, ret)
		}
		if b, ret := h[0].GetBrand(); ret != gonvml.SUCCESS || b != gonvml.BRAND_NVIDIA {
			t.Errorf("GetBrand = %v, %v", b, ret)
		}
		// Links 0-4 lead to nvs0, 5-8 to nvs1, 9-12 to nvs2, 13-17 to nvs3.
		for link, want := range map[int]string{0: "00000000:05:00.0", 4: "00000000:05:00.0", 5: "00000000:06:00.0", 17: "00000000:08:00.0"} {
			if s, ret := h[2].GetNvLinkState(link); ret != gonvml.SUCCESS || s != gonvml.FEATURE_ENABLED {
				t.Errorf("GetNvLinkState(%d) = %v, %v", link, s, ret)
			}
			if r, ret := h[2].GetNvLinkRemotePciInfo(link); ret != gonvml.SUCCESS || cstr(r.BusId[:]) != want || r.PciDeviceId != 0x22a310de {
				t.Errorf("GetNvLinkRemotePciInfo(%d) = %q %#x, %v; want %s", link, cstr(r.BusId[:]), r.PciDeviceId, ret, want)
			}
			if typ, ret := h[2].GetNvLinkRemoteDeviceType(link); ret != gonvml.SUCCESS || typ != gonvml.NVLINK_DEVICE_TYPE_SWITCH {
				t.Errorf("GetNvLinkRemoteDeviceType(%d) = %v, %v", link, typ, ret)
			}
		}
		if _, ret := h[2].GetNvLinkState(18); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("GetNvLinkState past the last link: %v, want INVALID_ARGUMENT", ret)
		}
		if s, ret := h[0].GetP2PStatus(h[last], gonvml.P2P_CAPS_INDEX_NVLINK); ret != gonvml.SUCCESS || s != gonvml.P2P_STATUS_OK {
			t.Errorf("GetP2PStatus NVLINK = %v, %v", s, ret)
		}
	case "pcie-4gpu":
		if _, ret := h[0].GetNvLinkState(0); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetNvLinkState without NVLink: %v, want NOT_SUPPORTED", ret)
		}
		if _, ret := h[0].GetNvLinkRemotePciInfo(0); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetNvLinkRemotePciInfo without NVLink: %v, want NOT_SUPPORTED", ret)
		}
		for _, c := range []struct {
			j    int
			caps gonvml.GpuP2PCapsIndex
			want gonvml.GpuP2PStatus
		}{
			{1, gonvml.P2P_CAPS_INDEX_NVLINK, gonvml.P2P_STATUS_NOT_SUPPORTED},
			{1, gonvml.P2P_CAPS_INDEX_READ, gonvml.P2P_STATUS_OK},
			{2, gonvml.P2P_CAPS_INDEX_READ, gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED},
		} {
			if s, ret := h[0].GetP2PStatus(h[c.j], c.caps); ret != gonvml.SUCCESS || s != c.want {
				t.Errorf("GetP2PStatus(0, %d, caps %d) = %v, %v; want %v", c.j, c.caps, s, ret, c.want)
			}
		}
		if l, ret := h[0].GetTopologyCommonAncestor(h[1]); ret != gonvml.SUCCESS || l != gonvml.TOPOLOGY_SINGLE {
			t.Errorf("GetTopologyCommonAncestor(0, 1) = %v, %v", l, ret)
		}
	}
}

package nvml

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// MIG device memory (MiB) as NVML's attributes give it, per profile.
const (
	h100MiB1g = 9984
	h100MiB2g = 20096
	h100MiB3g = 40448
	h100MiB7g = 81152
	a100MiB1g = 4864
	a100MiB2g = 9856
	a100MiB3g = 19968
	a100MiB7g = 40192
)

// h100 makes mock GPU i an H100 80GB.
func h100(srv *dgxa100.Server, i int) {
	d := nvmltest.Device(srv, i)
	d.Name = "NVIDIA H100 80GB HBM3"
	d.MemoryInfo.Total = nvmltest.MemoryH100
}

func TestMIGProfileNames(t *testing.T) {
	tests := []struct {
		name     string
		h100     bool
		mig      nvmltest.MIG
		noMemory bool // the parent's memory cannot be read
		want     string
	}{
		{name: "H100 1g", h100: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE}, want: "1g.10gb"},
		// ID 20 is no profile's index: a suffix read from the ID was lost.
		{name: "H100 1g with media extensions (ID 20) keeps +me", h100: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1}, want: "1g.10gb+me"},
		// ID 15 is the index of 1_SLICE_ALL_ME.
		{name: "H100 1g with double memory (ID 15) has no +me.all", h100: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2}, want: "1g.20gb"},
		// ID 14 is the index of 2_SLICE_NO_ME.
		{name: "H100 2g (ID 14) has no -me", h100: true, mig: nvmltest.MIG{GISlices: 2, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE}, want: "2g.20gb"},
		{name: "H100 3g", h100: true, mig: nvmltest.MIG{GISlices: 3, MemoryMiB: h100MiB3g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE}, want: "3g.40gb"},
		{name: "H100 2g with media extensions", h100: true, mig: nvmltest.MIG{GISlices: 2, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1}, want: "2g.20gb+me"},
		{name: "H100 1g without media engines", h100: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME}, want: "1g.10gb-me"},
		{name: "H100 1g with all media engines", h100: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME}, want: "1g.10gb+me.all"},
		{name: "H100 3g with graphics", h100: true, mig: nvmltest.MIG{GISlices: 3, MemoryMiB: h100MiB3g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX}, want: "3g.40gb+gfx"},
		{name: "H100 1c of a 3g", h100: true, mig: nvmltest.MIG{GISlices: 3, CISlices: 1, MemoryMiB: h100MiB3g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE}, want: "1c.3g.40gb"},
		{name: "H100 7g", h100: true, mig: nvmltest.MIG{GISlices: 7, MemoryMiB: h100MiB7g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_7_SLICE}, want: "7g.80gb"},
		{name: "A100 1g", mig: nvmltest.MIG{GISlices: 1, MemoryMiB: a100MiB1g}, want: "1g.5gb"},
		{name: "A100 2g", mig: nvmltest.MIG{GISlices: 2, MemoryMiB: a100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE}, want: "2g.10gb"},
		{name: "A100 3g", mig: nvmltest.MIG{GISlices: 3, MemoryMiB: a100MiB3g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE}, want: "3g.20gb"},
		{name: "A100 7g", mig: nvmltest.MIG{GISlices: 7, MemoryMiB: a100MiB7g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_7_SLICE}, want: "7g.40gb"},
		{name: "A100 2c of a 7g", mig: nvmltest.MIG{GISlices: 7, CISlices: 2, MemoryMiB: a100MiB7g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_7_SLICE}, want: "2c.7g.40gb"},
		{name: "parent memory unknown rounds the device's own up", noMemory: true, mig: nvmltest.MIG{GISlices: 1, MemoryMiB: a100MiB1g}, want: "1g.5gb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			if tt.h100 {
				h100(srv, 0)
			}
			if tt.noMemory {
				nvmltest.Device(srv, 0).GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, gonvml.ERROR_UNKNOWN }
			}
			nvmltest.WithMIG(srv, 0, &tt.mig)
			inv, log := discover(t, srv, dgxSysfs(t))
			if len(inv.GPUs) != 8 || len(inv.GPUs[0].MIG) != 1 {
				t.Fatalf("GPU 0 MIG = %+v, want one device\nlog:\n%s", inv.GPUs[0].MIG, log)
			}
			if got := inv.GPUs[0].MIG[0].Profile; got != tt.want {
				t.Errorf("profile = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestProfileSuffix(t *testing.T) {
	for index, want := range map[int]string{
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE:        "",
		gonvml.GPU_INSTANCE_PROFILE_7_SLICE:        "",
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me",
		gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2:   "",
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
		gonvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "+gfx",
		gonvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
		gonvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
		gonvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
		gonvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
		999: "",
	} {
		if got := profileSuffix(index); got != want {
			t.Errorf("profileSuffix(%d) = %q, want %q", index, got, want)
		}
	}
}

func TestMIGMemoryGB(t *testing.T) {
	tests := []struct {
		migMiB, parentBytes, want uint64
	}{
		{a100MiB1g, nvmltest.MemoryA100, 5},
		{h100MiB1g, nvmltest.MemoryH100, 10},
		// H100 NVL (95830 MiB, 94 GB): 1/8 of 94 is 11.75.
		{11008, 95830 << 20, 12},
		// H200 (143771 MiB, 141 GB): 1/8 is 17.6.
		{16384, 143771 << 20, 18},
		// A whole eighth is not rounded up to the next one.
		{5120, 40 << 30, 5},
		{5121, 40 << 30, 10},
		{4864, 0, 5},
	}
	for _, tt := range tests {
		if got := migMemoryGB(tt.migMiB, tt.parentBytes); got != tt.want {
			t.Errorf("migMemoryGB(%d MiB, %d) = %d, want %d", tt.migMiB, tt.parentBytes, got, tt.want)
		}
	}
}

// TestDiscoverMIGDevices: every MIG device of a MIG GPU, by MIG index,
// empty slots skipped; the GPU itself and the other GPUs stay as they were.
func TestDiscoverMIGDevices(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	h100(srv, 2)
	nvmltest.WithMIG(srv, 2,
		&nvmltest.MIG{UUID: "MIG-a", GPUInstance: 2, ComputeInstance: 0, GISlices: 3, MemoryMiB: h100MiB3g, Multiprocessors: 60, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE},
		nil,
		&nvmltest.MIG{UUID: "MIG-b", GPUInstance: 9, ComputeInstance: 0, GISlices: 1, MemoryMiB: h100MiB1g, Multiprocessors: 16, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1},
		&nvmltest.MIG{UUID: "MIG-c", GPUInstance: 1, ComputeInstance: 0, GISlices: 3, CISlices: 1, MemoryMiB: h100MiB3g, Multiprocessors: 20, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE},
		&nvmltest.MIG{UUID: "MIG-d", GPUInstance: 1, ComputeInstance: 1, GISlices: 3, CISlices: 2, MemoryMiB: h100MiB3g, Multiprocessors: 40, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE},
	)
	inv, log := discover(t, srv, dgxSysfs(t))

	if len(inv.GPUs) != 8 {
		t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
	}
	g := inv.GPUs[2]
	if !g.MIGEnabled || g.UUID != nvmltest.Device(srv, 2).UUID {
		t.Errorf("GPU 2 = %+v, want it in MIG mode", g)
	}
	want := []MIGDevice{
		{UUID: "MIG-a", Index: 0, GPUInstance: 2, ComputeInstance: 0, Profile: "3g.40gb", MemoryBytes: h100MiB3g << 20, Multiprocessors: 60, Slices: Slices{3, 3}},
		{UUID: "MIG-b", Index: 2, GPUInstance: 9, ComputeInstance: 0, Profile: "1g.10gb+me", MemoryBytes: h100MiB1g << 20, Multiprocessors: 16, Slices: Slices{1, 1}},
		{UUID: "MIG-c", Index: 3, GPUInstance: 1, ComputeInstance: 0, Profile: "1c.3g.40gb", MemoryBytes: h100MiB3g << 20, Multiprocessors: 20, Slices: Slices{3, 1}},
		{UUID: "MIG-d", Index: 4, GPUInstance: 1, ComputeInstance: 1, Profile: "2c.3g.40gb", MemoryBytes: h100MiB3g << 20, Multiprocessors: 40, Slices: Slices{3, 2}},
	}
	if !reflect.DeepEqual(g.MIG, want) {
		t.Errorf("MIG =\n%+v\nwant\n%+v", g.MIG, want)
	}
	for i, g := range inv.GPUs {
		if i != 2 && (g.MIGEnabled || g.MIG != nil) {
			t.Errorf("GPU %d = %+v, want MIG off", i, g)
		}
	}
	if !strings.Contains(log, "GPU is in MIG mode") || !strings.Contains(log, "migDevices=4") ||
		!strings.Contains(log, "profiles=3g.40gb,1g.10gb+me,1c.3g.40gb,2c.3g.40gb") {
		t.Errorf("log does not list the MIG devices:\n%s", log)
	}
	if strings.Contains(log, "level=WARN msg=\"MIG") || strings.Contains(log, "level=ERROR") {
		t.Errorf("unexpected MIG warning:\n%s", log)
	}
}

func TestDiscoverMIGWithoutInstances(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	nvmltest.WithMIG(srv, 5)
	inv, log := discover(t, srv, dgxSysfs(t))
	if g := inv.GPUs[5]; !g.MIGEnabled || len(g.MIG) != 0 {
		t.Errorf("GPU 5 = %+v, want MIG on with no MIG devices", g)
	}
	// Whether that serves nothing depends on the MIG strategy or DRA: the
	// serving side says it, once (gpu.Layout); discovery only at debug.
	if strings.Contains(log, "level=INFO msg=\"GPU is in MIG mode with") || strings.Contains(log, "level=WARN msg=\"MIG") {
		t.Errorf("discovery reported the GPU without MIG devices above debug:\n%s", log)
	}
}

// TestDiscoverMIGSkipsUnreadableDevice: a MIG device whose identity or
// attributes cannot be read is logged and left out, and only it.
func TestDiscoverMIGSkipsUnreadableDevice(t *testing.T) {
	tests := []struct {
		name   string
		breakd func(h *mock.Device)
		reason string
	}{
		{name: "UUID", breakd: func(h *mock.Device) {
			h.GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
		}, reason: "reading UUID: ERROR_UNKNOWN"},
		{name: "GPU instance id", breakd: func(h *mock.Device) {
			h.GetGpuInstanceIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NO_PERMISSION }
		}, reason: "reading GPU instance id of MIG-1: ERROR_NO_PERMISSION"},
		{name: "compute instance id", breakd: func(h *mock.Device) {
			h.GetComputeInstanceIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
		}, reason: "reading compute instance id of MIG-1"},
		{name: "attributes", breakd: func(h *mock.Device) {
			h.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
				return gonvml.DeviceAttributes{}, gonvml.ERROR_UNKNOWN
			}
		}, reason: "reading attributes of MIG-1"},
		{name: "attributes without slices", breakd: func(h *mock.Device) {
			h.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) { return gonvml.DeviceAttributes{}, gonvml.SUCCESS }
		}, reason: "naming the profile of MIG-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			hs := nvmltest.WithMIG(srv, 1,
				&nvmltest.MIG{UUID: "MIG-0", GPUInstance: 1, GISlices: 1, MemoryMiB: a100MiB1g},
				&nvmltest.MIG{UUID: "MIG-1", GPUInstance: 2, GISlices: 1, MemoryMiB: a100MiB1g},
				&nvmltest.MIG{UUID: "MIG-2", GPUInstance: 3, GISlices: 1, MemoryMiB: a100MiB1g},
			)
			tt.breakd(hs[1])
			inv, log := discover(t, srv, dgxSysfs(t))
			if len(inv.GPUs) != 8 {
				t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
			}
			var uuids []string
			for _, m := range inv.GPUs[1].MIG {
				uuids = append(uuids, m.UUID)
			}
			if !reflect.DeepEqual(uuids, []string{"MIG-0", "MIG-2"}) {
				t.Errorf("MIG devices %v, want MIG-0 and MIG-2", uuids)
			}
			if n := strings.Count(log, "skipping MIG device"); n != 1 || !strings.Contains(log, "migIndex=1") || !strings.Contains(log, tt.reason) {
				t.Errorf("skip logged %d times, want once for index 1 with %q:\n%s", n, tt.reason, log)
			}
		})
	}
}

// TestDiscoverMIGListingFails: whatever fails in listing MIG devices, the
// GPU stays in the inventory, in MIG mode.
func TestDiscoverMIGListingFails(t *testing.T) {
	tests := []struct {
		name  string
		setup func(srv *dgxa100.Server)
		log   string
	}{
		{name: "slot count fails", setup: func(srv *dgxa100.Server) {
			nvmltest.Device(srv, 4).GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
		}, log: "counting MIG device slots"},
		{name: "every handle fails", setup: func(srv *dgxa100.Server) {
			nvmltest.Device(srv, 4).GetMigDeviceHandleByIndexFunc = func(int) (gonvml.Device, gonvml.Return) { return nil, gonvml.ERROR_NO_PERMISSION }
		}, log: "none of its MIG devices could be read"},
		{name: "driver cannot list MIG devices", setup: func(srv *dgxa100.Server) {
			nvmltest.WithoutSymbols(srv, "nvmlDeviceGetMaxMigDeviceCount")
			// A real binding would die calling it; the mock panics.
			nvmltest.Device(srv, 4).GetMaxMigDeviceCountFunc = nil
		}, log: "cannot list MIG devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			nvmltest.WithMIG(srv, 4, &nvmltest.MIG{GISlices: 1, MemoryMiB: a100MiB1g})
			tt.setup(srv)
			inv, log := discover(t, srv, dgxSysfs(t))
			if len(inv.GPUs) != 8 {
				t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
			}
			if g := inv.GPUs[4]; !g.MIGEnabled || len(g.MIG) != 0 {
				t.Errorf("GPU 4 = %+v, want MIG on with no MIG devices", g)
			}
			if !strings.Contains(log, tt.log) {
				t.Errorf("log does not say %q:\n%s", tt.log, log)
			}
			if strings.Contains(log, "create instances") {
				t.Errorf("a failure is not blamed on missing instances:\n%s", log)
			}
		})
	}
}

// TestDiscoverMIGProfileUnreadable: without the GPU instance's profile
// (no permission, vGPU) names lack the suffix, said once per discovery.
func TestDiscoverMIGProfileUnreadable(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	for _, i := range []int{0, 1} {
		nvmltest.WithMIG(srv, i,
			&nvmltest.MIG{GPUInstance: 1, GISlices: 1, MemoryMiB: a100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1},
			&nvmltest.MIG{GPUInstance: 2, GISlices: 2, MemoryMiB: a100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE},
		)
		nvmltest.Device(srv, i).GetGpuInstanceByIdFunc = func(int) (gonvml.GpuInstance, gonvml.Return) {
			return nil, gonvml.ERROR_NO_PERMISSION
		}
	}
	inv, log := discover(t, srv, dgxSysfs(t))
	for _, i := range []int{0, 1} {
		profiles := migProfiles(inv.GPUs[i])
		if want := []string{"1g.5gb", "2g.10gb"}; !reflect.DeepEqual(profiles, want) {
			t.Errorf("GPU %d profiles %v, want %v", i, profiles, want)
		}
	}
	if n := strings.Count(log, "reading the GPU instance profile"); n != 1 || !strings.Contains(log, "ERROR_NO_PERMISSION") || !strings.Contains(log, "gpuInstance=1") {
		t.Errorf("profile failure logged %d times, want once with its context:\n%s", n, log)
	}
}

// TestDiscoverMIGProfileIDUnknown: a GPU instance whose profile ID matches
// none of the GPU's profile indices (a profile newer than the plugin)
// keeps its MIG devices, named without a suffix, warned once per GPU and ID.
func TestDiscoverMIGProfileIDUnknown(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	for _, i := range []int{0, 1} {
		h100(srv, i)
		nvmltest.WithMIG(srv, i,
			&nvmltest.MIG{GPUInstance: 1, GISlices: 2, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1},
			&nvmltest.MIG{GPUInstance: 2, GISlices: 2, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1},
			&nvmltest.MIG{GPUInstance: 3, GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1},
		)
		// The driver lists 2_SLICE_REV1 past the indices go-nvml knows.
		d := nvmltest.Device(srv, i)
		known := d.GetGpuInstanceProfileInfoFunc
		d.GetGpuInstanceProfileInfoFunc = func(index int) (gonvml.GpuInstanceProfileInfo, gonvml.Return) {
			if index == gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 {
				return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_NOT_SUPPORTED
			}
			return known(index)
		}
	}
	inv, log := discover(t, srv, dgxSysfs(t))
	for _, i := range []int{0, 1} {
		profiles := migProfiles(inv.GPUs[i])
		if want := []string{"2g.20gb", "2g.20gb", "1g.10gb+me"}; !reflect.DeepEqual(profiles, want) {
			t.Errorf("GPU %d profiles %v, want %v", i, profiles, want)
		}
	}
	id := nvmltest.GIProfileIDs[gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1]
	for _, i := range []int{0, 1} {
		line := fmt.Sprintf("device=%s profileID=%d", nvmltest.Device(srv, i).UUID, id)
		if n := strings.Count(log, line); n != 1 {
			t.Errorf("GPU %d: unknown profile ID warned %d times, want once naming the GPU and the ID (%q):\n%s", i, n, line, log)
		}
	}
	if n := strings.Count(log, "matches no profile index"); n != 2 {
		t.Errorf("unknown profile ID warned %d times, want once per GPU:\n%s", n, log)
	}
}

// TestDiscoverMIGProfileIndicesReadOncePerGPU: the profile indices are
// read once per GPU, whatever its instance count; indices the GPU lacks
// (NOT_SUPPORTED) or the driver does not know (INVALID_ARGUMENT) are no
// failure.
func TestDiscoverMIGProfileIndicesReadOncePerGPU(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	calls := map[int]int{}
	for _, i := range []int{3, 4} {
		h100(srv, i)
		var migs []*nvmltest.MIG
		for gi := range 7 {
			migs = append(migs, &nvmltest.MIG{GPUInstance: gi + 1, GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE})
		}
		nvmltest.WithMIG(srv, i, migs...)
		d := nvmltest.Device(srv, i)
		known := d.GetGpuInstanceProfileInfoFunc
		d.GetGpuInstanceProfileInfoFunc = func(index int) (gonvml.GpuInstanceProfileInfo, gonvml.Return) {
			calls[i]++
			switch {
			case index >= gonvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:
				return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_INVALID_ARGUMENT
			case index != gonvml.GPU_INSTANCE_PROFILE_1_SLICE:
				return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_NOT_SUPPORTED
			}
			return known(index)
		}
	}
	inv, log := discover(t, srv, dgxSysfs(t))
	for _, i := range []int{3, 4} {
		if len(inv.GPUs[i].MIG) != 7 || inv.GPUs[i].MIG[6].Profile != "1g.10gb" {
			t.Errorf("GPU %d MIG = %+v, want seven 1g.10gb", i, inv.GPUs[i].MIG)
		}
		if calls[i] != gonvml.GPU_INSTANCE_PROFILE_COUNT {
			t.Errorf("GPU %d: %d profile info reads, want one per index (%d)", i, calls[i], gonvml.GPU_INSTANCE_PROFILE_COUNT)
		}
	}
	if strings.Contains(log, "level=WARN") || strings.Contains(log, "level=ERROR") {
		t.Errorf("unexpected warning:\n%s", log)
	}
}

// TestDiscoverMIGProfileIndexUnreadable: a profile index that cannot be
// read is said once per discovery when an ID is then not found; an ID
// found among the other indices names its device as usual.
func TestDiscoverMIGProfileIndexUnreadable(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	for _, i := range []int{0, 1} {
		h100(srv, i)
		nvmltest.WithMIG(srv, i,
			&nvmltest.MIG{GPUInstance: 1, GISlices: 1, MemoryMiB: h100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1},
			&nvmltest.MIG{GPUInstance: 2, GISlices: 2, MemoryMiB: h100MiB2g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE},
		)
		d := nvmltest.Device(srv, i)
		known := d.GetGpuInstanceProfileInfoFunc
		d.GetGpuInstanceProfileInfoFunc = func(index int) (gonvml.GpuInstanceProfileInfo, gonvml.Return) {
			if index == gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 {
				return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_NO_PERMISSION
			}
			return known(index)
		}
	}
	inv, log := discover(t, srv, dgxSysfs(t))
	for _, i := range []int{0, 1} {
		profiles := migProfiles(inv.GPUs[i])
		if want := []string{"1g.10gb", "2g.20gb"}; !reflect.DeepEqual(profiles, want) {
			t.Errorf("GPU %d profiles %v, want %v", i, profiles, want)
		}
	}
	if n := strings.Count(log, "reading the GPU instance profile"); n != 1 ||
		!strings.Contains(log, "reading GPU instance profile 7: ERROR_NO_PERMISSION") || !strings.Contains(log, "gpuInstance=1") {
		t.Errorf("profile failure logged %d times, want once with its context:\n%s", n, log)
	}
}

// migProfiles lists the profile names of g's MIG devices, in order.
func migProfiles(g GPU) []string {
	var profiles []string
	for _, m := range g.MIG {
		profiles = append(profiles, m.Profile)
	}
	return profiles
}

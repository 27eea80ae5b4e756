package dra

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// mixedGPUs is an H100 node with every MIG state: GPU 0 split 3g.40gb +
// 2×2g.20gb, GPU 1 split 7×1g.10gb, GPU 2 in MIG mode with no instance,
// GPU 3 whole.
func mixedGPUs() draslice.GPUs {
	addrs := []string{"0000:07:00.0", "0000:0f:00.0", "0000:87:00.0", "0000:0c:00.0"}
	gpu := func(i int) nvml.GPU {
		return nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Minor: i, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			PCIBusID: addrs[i], NUMANode: i / 2, Brand: "nvidia", Architecture: "hopper", CUDAComputeCapability: "9.0", MIGEnabled: i < 3}
	}
	g0, g1, g2, g3 := gpu(0), gpu(1), gpu(2), gpu(3)
	g0.MIG = []nvml.MIGDevice{migDevice(0, 0, 2, "3g.40gb", 40448, 60), migDevice(0, 1, 3, "2g.20gb", 20096, 32), migDevice(0, 2, 4, "2g.20gb", 20096, 32)}
	for k := range 7 {
		g1.MIG = append(g1.MIG, migDevice(1, k, 7+k, "1g.10gb", 9856, 16))
	}
	nv := nvml.Link{NVLinks: 18}
	return draslice.GPUs{
		GPUs:          []nvml.GPU{g0, g1, g2, g3},
		Topology:      nvml.Topology{Links: [][]nvml.Link{{{}, nv, nv, nv}, {nv, {}, nv, nv}, {nv, nv, {}, nv}, {nv, nv, nv, {}}}},
		DriverVersion: "580.65.06", CUDADriverVersion: 13000,
	}
}

func migDevice(parent, idx, gi int, profile string, mib uint64, sms int) nvml.MIGDevice {
	return nvml.MIGDevice{UUID: fmt.Sprintf("MIG-%d-%d", parent, gi), Index: idx, GPUInstance: gi, Profile: profile,
		MemoryBytes: mib << 20, Multiprocessors: sms, CapMinors: []int{1000*parent + 2*gi, 1000*parent + 2*gi + 1}}
}

func TestMIGDevices(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	d.SetGPUs(context.Background(), mixedGPUs())
	devs := pub.last(t)
	var names []string
	for _, dv := range devs {
		names = append(names, dv.Name)
	}
	want := []string{"gpu-0-mig-2-0", "gpu-0-mig-3-0", "gpu-0-mig-4-0"}
	for gi := 7; gi < 14; gi++ {
		want = append(want, fmt.Sprintf("gpu-1-mig-%d-0", gi))
	}
	want = append(want, "gpu-3")
	if !slices.Equal(names, want) {
		t.Fatalf("published\n got  %v\n want %v", names, want)
	}
	all := byName(devs)
	m := all["gpu-0-mig-2-0"]
	wantAttrs := map[resourceapi.QualifiedName]string{
		"type": "mig", "uuid": "MIG-0-2", "profile": "3g.40gb", "parentUUID": "GPU-0", "parentIndex": "i0",
		"gpuInstance": "i2", "computeInstance": "i0", "productName": "NVIDIA H100 80GB HBM3", "brand": "nvidia",
		"architecture": "hopper", "cudaComputeCapability": "v9.0.0", "driverVersion": "v580.65.6", "cudaDriverVersion": "v13.0.0",
		"resource.kubernetes.io/pciBusID": "0000:07:00.0", "resource.kubernetes.io/pcieRoot": "pci0000:00",
		"resource.kubernetes.io/numaNode": "i0",
	}
	got := map[resourceapi.QualifiedName]string{}
	for k, a := range m.Attributes {
		got[k] = str(a)
	}
	if !maps.Equal(got, wantAttrs) {
		t.Errorf("gpu-0-mig-2-0 attributes\n got  %v\n want %v", got, wantAttrs)
	}
	for name, want := range map[string][2]int64{
		"gpu-0-mig-2-0": {40448 << 20, 60}, "gpu-0-mig-3-0": {20096 << 20, 32}, "gpu-1-mig-11-0": {9856 << 20, 16},
	} {
		c := all[name].Capacity
		mem, sms := c["memory"].Value, c["multiprocessors"].Value
		if mem.Value() != want[0] || sms.Value() != want[1] || len(c) != 2 {
			t.Errorf("%s capacity %v, want memory %d and %d multiprocessors", name, c, want[0], want[1])
		}
	}
	g3 := all["gpu-3"]
	if str(g3.Attributes["type"]) != "gpu" || str(g3.Attributes["nvlinkClique"]) != "GPU-0" {
		t.Errorf("gpu-3 attributes %v", g3.Attributes)
	}
	if _, ok := m.Attributes["nvlinkClique"]; ok {
		t.Error("a MIG device carries nvlinkClique")
	}
}

func TestPrepareMIGDevice(t *testing.T) {
	ctx := context.Background()
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1, Specs: &testSpecs{}})
	d.SetGPUs(ctx, mixedGPUs())
	got, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{
		claim("uid-1", "slices", result("a", "gpu-1-mig-9-0"), result("b", "gpu-0-mig-2-0"), result("c", "gpu-3")),
	})
	if err != nil || got["uid-1"].Err != nil {
		t.Fatalf("Prepare: %v %v", err, got["uid-1"].Err)
	}
	var ids []string
	for _, dv := range got["uid-1"].Devices {
		ids = append(ids, dv.CDIDeviceIDs...)
	}
	want := []string{"gpu-device-plugin.github.io/gpu=MIG-1-9", "gpu-device-plugin.github.io/gpu=MIG-0-2", "gpu-device-plugin.github.io/gpu=GPU-3"}
	if !slices.Equal(ids, want) {
		t.Errorf("CDI IDs %v, want %v", ids, want)
	}
	// A MIG-enabled GPU is not a device, whole or with no MIG device.
	for _, name := range []string{"gpu-0", "gpu-2"} {
		c := claim("uid-"+name, name, result("g", name))
		got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if got[c.UID].Err == nil {
			t.Errorf("prepared %s, a GPU in MIG mode", name)
		}
	}
}

func TestMIGHealth(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1, HealthResend: time.Hour})
	d.SetGPUs(context.Background(), mixedGPUs())
	if !d.SetHealth("MIG-1-9", false, "xid=79") {
		t.Fatal("SetHealth reported no change")
	}
	pub.settle()
	for _, dv := range pub.last(t) {
		ts := dv.Taints
		if dv.Name != "gpu-1-mig-9-0" {
			if len(ts) != 0 {
				t.Errorf("%s tainted %+v", dv.Name, ts)
			}
			continue
		}
		if len(ts) != 1 || ts[0].Key != testDriver+"/xid" || ts[0].Value != "79" {
			t.Errorf("gpu-1-mig-9-0 taints %+v, want %s/xid=79", ts, testDriver)
		}
	}
	// A whole GPU's UUID still reaches its device.
	d.SetHealth("GPU-3", false, "gpu-lost")
	pub.settle()
	if ts := byName(pub.last(t))["gpu-3"].Taints; len(ts) != 1 || ts[0].Key != testDriver+"/gpu-lost" {
		t.Errorf("gpu-3 taints %+v", ts)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := make(chan kubelet.DeviceHealthReport)
	go func() { _ = d.WatchHealthStatus(ctx, reports) }()
	rep := <-reports
	unhealthy := map[string]string{}
	for _, h := range rep.Devices {
		if h.Health != kubelet.HealthStatusHealthy {
			unhealthy[h.DeviceName] = h.Message
		}
	}
	if len(unhealthy) != 2 || unhealthy["gpu-1-mig-9-0"] != "xid=79: fallen off the bus" || unhealthy["gpu-3"] == "" {
		t.Errorf("unhealthy in the health stream: %v", unhealthy)
	}
}

// TestMIGSliceLimits publishes 16 GPUs of 7 MIG devices each, one of them
// tainted, within the API's limits on slices and devices.
func TestMIGSliceLimits(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	in := mixedGPUs()
	in.GPUs, in.Topology = nil, nvml.Topology{}
	for i := range 16 {
		g := nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Minor: i, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			PCIBusID: "0000:07:00.0", NUMANode: i / 8, Brand: "nvidia", Architecture: "hopper", CUDAComputeCapability: "9.0", MIGEnabled: true}
		for k := range 7 {
			g.MIG = append(g.MIG, migDevice(i, k, 7+k, "1g.10gb", 9856, 16))
		}
		in.GPUs = append(in.GPUs, g)
	}
	d.SetGPUs(context.Background(), in)
	d.SetHealth("MIG-15-13", false, "xid=48, xid=79")
	pub.settle()
	pub.mu.Lock()
	sl := pub.pubs[len(pub.pubs)-1].Pools[testNode].Slices
	pub.mu.Unlock()
	total := 0
	for i, s := range sl {
		tainted := slices.ContainsFunc(s.Devices, func(dv resourceapi.Device) bool { return len(dv.Taints) > 0 })
		limit := resourceapi.ResourceSliceMaxDevices
		if tainted {
			limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
		if len(s.Devices) > limit {
			t.Errorf("slice %d holds %d devices (tainted: %v), over the API's %d", i, len(s.Devices), tainted, limit)
		}
		for _, dv := range s.Devices {
			total++
			if n := len(dv.Attributes) + len(dv.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("%s has %d attributes and capacities, over %d", dv.Name, n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
			}
			if len(dv.Taints) > resourceapi.DeviceTaintsMaxLength {
				t.Errorf("%s has %d taints", dv.Name, len(dv.Taints))
			}
		}
	}
	if total != 16*7 {
		t.Errorf("published %d devices, want %d", total, 16*7)
	}
}

package draslice

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

func TestTaintsOf(t *testing.T) {
	for reason, want := range map[string]string{
		"xid=79":                                "d/xid=79",
		"gpu-lost":                              "d/gpu-lost=",
		"hw-slowdown+hw-power-brake":            "d/hw-slowdown=;d/hw-power-brake=",
		"nvml: ERROR_UNKNOWN: bad, mig-enabled": "d/nvml=ERROR_UNKNOWN-bad;d/mig-enabled=",
		"RDMA port down: mlx5_1/1":              "d/rdma-port-down=mlx5_1-1",
		"recovery-action=reset, xid=48":         "d/recovery-action=reset;d/xid=48",
		"xid=1, xid=2":                          "d/xid=1",
		"remediation: draining: xid=48: double-bit ECC error, a reset clears it; row-remap-pending: x": "d/remediation=draining",
	} {
		var got []string
		for _, tt := range TaintsOf("d", reason) {
			got = append(got, tt.Key+"="+tt.Value)
		}
		if strings.Join(got, ";") != want {
			t.Errorf("taintsOf(%q) = %v, want %s", reason, got, want)
		}
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{"535.104.05": "535.104.5", "9.0": "9.0.0", "550": "550.0.0", "": "", "1.2.3.4": "", "r550": ""} {
		if got := Semver(in); got != want {
			t.Errorf("Semver(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDeviceNames(t *testing.T) {
	if got := NICDeviceName("0000:3B:00.1"); got != "nic-0000-3b-00-1" {
		t.Errorf("NICDeviceName = %q", got)
	}
	if got := GPUDeviceName(nvml.GPU{Index: 7}); got != "gpu-7" {
		t.Errorf("GPUDeviceName = %q", got)
	}
}

func TestStampKeepsTimes(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 700, time.UTC)
	first := Stamp(TaintsOf("d", "xid=79"), nil, t0)
	if len(first) != 1 || !first[0].TimeAdded.Equal(t0.Truncate(time.Second)) || first[0].Effect != EffectNoSchedule {
		t.Fatalf("first = %+v", first)
	}
	next := Stamp(TaintsOf("d", "xid=79, gpu-lost"), first, t0.Add(time.Hour))
	if !next[0].TimeAdded.Equal(*first[0].TimeAdded) || !next[1].TimeAdded.Equal(t0.Add(time.Hour).Truncate(time.Second)) {
		t.Errorf("next = %+v", next)
	}
	if Stamp(nil, next, t0) != nil {
		t.Error("no conditions, but taints")
	}
}

// A restart's seeds (the taints the previous process published) keep an
// unchanged condition's earlier time; another value, a later or missing
// seed time, leave the fresh one.
func TestBackdate(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	now := Stamp(TaintsOf("d", "xid=79, gpu-lost, thermal=95C"), nil, t0.Add(time.Hour))
	earlier, later := t0, t0.Add(2*time.Hour)
	seeds := []Taint{
		{Key: "d/xid", Value: "79", Effect: EffectNoSchedule, TimeAdded: &later},
		{Key: "d/xid", Value: "79", Effect: EffectNoSchedule, TimeAdded: &earlier},
		{Key: "d/gpu-lost", Effect: EffectNoSchedule},
		{Key: "d/thermal", Value: "90C", Effect: EffectNoSchedule, TimeAdded: &earlier},
	}
	got := Backdate(now, seeds)
	if !got[0].TimeAdded.Equal(earlier) {
		t.Errorf("xid=79 seeded earlier: %v, want %v", got[0].TimeAdded, earlier)
	}
	for _, i := range []int{1, 2} {
		if !got[i].TimeAdded.Equal(*now[i].TimeAdded) {
			t.Errorf("%s: %v, want its own %v", got[i].Key, got[i].TimeAdded, now[i].TimeAdded)
		}
	}
	if !now[0].TimeAdded.Equal(t0.Add(time.Hour)) {
		t.Error("Backdate changed its argument")
	}
	if Backdate(nil, seeds) != nil {
		t.Error("no taints, but some")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{80 << 30: "80Gi", 40960 << 20: "40Gi", 1536 << 20: "1536Mi", 1000: "1000", 0: "0"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// mixedGPUs is an H100 node with every MIG state: GPU 0 split 3g.40gb +
// 2×2g.20gb, GPU 1 split 7×1g.10gb, GPU 2 in MIG mode with no instance,
// GPU 3 whole.
func mixedGPUs() GPUs {
	gpu := func(i int) nvml.GPU {
		return nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Minor: i, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)), NUMANode: i / 2, Brand: "nvidia", Architecture: "hopper", CUDAComputeCapability: "9.0", MIGEnabled: i < 3}
	}
	mig := func(parent, idx, gi int, profile string, mib uint64, sms int) nvml.MIGDevice {
		return nvml.MIGDevice{UUID: fmt.Sprintf("MIG-%d-%d", parent, gi), Index: idx, GPUInstance: gi, Profile: profile,
			MemoryBytes: mib << 20, Multiprocessors: sms, CapMinors: []int{100*parent + 2*gi, 100*parent + 2*gi + 1}}
	}
	g0, g1, g2, g3 := gpu(0), gpu(1), gpu(2), gpu(3)
	g0.MIG = []nvml.MIGDevice{mig(0, 0, 2, "3g.40gb", 40448, 60), mig(0, 1, 3, "2g.20gb", 20096, 32), mig(0, 2, 4, "2g.20gb", 20096, 32)}
	for k := range 7 {
		g1.MIG = append(g1.MIG, mig(1, k, 7+k, "1g.10gb", 9856, 16))
	}
	return GPUs{GPUs: []nvml.GPU{g0, g1, g2, g3}, DriverVersion: "580.65.06", CUDADriverVersion: 13000}
}

func attrString(a Attribute) string {
	switch {
	case a.String != nil:
		return *a.String
	case a.Version != nil:
		return "v" + *a.Version
	case a.Int != nil:
		return "i" + strconv.FormatInt(*a.Int, 10)
	case a.Bool != nil:
		return strconv.FormatBool(*a.Bool)
	}
	return "?"
}

func TestGPUDevicesMIG(t *testing.T) {
	in := mixedGPUs()
	// GPU 1's last MIG device has no known capabilities: not published.
	in.GPUs[1].MIG = append(in.GPUs[1].MIG, nvml.MIGDevice{UUID: "MIG-nocaps", GPUInstance: 14, Profile: "1g.10gb"})
	devs := GPUDevices(in, t.TempDir(), func(uuid string) string { return "k/gpu=" + uuid }, nil)
	var names []string
	byName := map[string]Device{}
	for _, d := range devs {
		names = append(names, d.Name)
		byName[d.Name] = d
	}
	want := []string{"gpu-0-mig-2-0", "gpu-0-mig-3-0", "gpu-0-mig-4-0"}
	for gi := 7; gi < 14; gi++ {
		want = append(want, fmt.Sprintf("gpu-1-mig-%d-0", gi))
	}
	want = append(want, "gpu-3")
	if !slices.Equal(names, want) {
		t.Fatalf("devices\n got  %v\n want %v", names, want)
	}

	m := byName["gpu-0-mig-3-0"]
	wantAttrs := map[string]string{
		"type": "mig", "uuid": "MIG-0-3", "profile": "2g.20gb", "parentUUID": "GPU-0", "parentIndex": "i0",
		"gpuInstance": "i3", "computeInstance": "i0", "productName": "NVIDIA H100 80GB HBM3", "brand": "nvidia",
		"architecture": "hopper", "cudaComputeCapability": "v9.0.0", "driverVersion": "v580.65.6", "cudaDriverVersion": "v13.0.0",
		AttrPCIBusID: "0000:10:00.0", AttrNUMANode: "i0",
	}
	got := map[string]string{}
	for k, a := range m.Attributes {
		got[k] = attrString(a)
	}
	if !maps.Equal(got, wantAttrs) {
		t.Errorf("gpu-0-mig-3-0 attributes\n got  %v\n want %v", got, wantAttrs)
	}
	if m.ID != "MIG-0-3" || m.Type != TypeMIG || !slices.Equal(m.CDIIDs, []string{"k/gpu=MIG-0-3"}) {
		t.Errorf("gpu-0-mig-3-0 ID %q type %q CDI %v", m.ID, m.Type, m.CDIIDs)
	}
	for name, want := range map[string]map[string]string{
		"gpu-0-mig-2-0":  {"memory": "40448Mi", "multiprocessors": "60"},
		"gpu-0-mig-4-0":  {"memory": "20096Mi", "multiprocessors": "32"},
		"gpu-1-mig-13-0": {"memory": "9856Mi", "multiprocessors": "16"},
		"gpu-3":          {"memory": "80Gi"},
	} {
		got := map[string]string{}
		for k, c := range byName[name].Capacity {
			got[k] = c.Value
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s capacity %v, want %v", name, got, want)
		}
	}
	if p := attrString(byName["gpu-1-mig-9-0"].Attributes["parentIndex"]); p != "i1" {
		t.Errorf("gpu-1-mig-9-0 parentIndex = %s", p)
	}
	g3 := byName["gpu-3"]
	if attrString(g3.Attributes["type"]) != "gpu" || attrString(g3.Attributes["uuid"]) != "GPU-3" || g3.Type != TypeGPU {
		t.Errorf("gpu-3 = %+v", g3)
	}
	for _, k := range []string{"profile", "parentUUID", "gpuInstance"} {
		if _, ok := g3.Attributes[k]; ok {
			t.Errorf("whole GPU gpu-3 has MIG attribute %s", k)
		}
	}
}

func TestMIGCliqueOnlyOnWholeGPUs(t *testing.T) {
	in := mixedGPUs()
	nv := nvml.Link{NVLinks: 18}
	in.Topology = nvml.Topology{Links: [][]nvml.Link{{{}, nv, nv, nv}, {nv, {}, nv, nv}, {nv, nv, {}, nv}, {nv, nv, nv, {}}}}
	for _, d := range GPUDevices(in, t.TempDir(), func(string) string { return "" }, nil) {
		_, has := d.Attributes["nvlinkClique"]
		if has != (d.Type == TypeGPU) {
			t.Errorf("%s (%s) has nvlinkClique: %v", d.Name, d.Type, has)
		}
	}
}

func TestMIGDeviceName(t *testing.T) {
	if got := MIGDeviceName(nvml.GPU{Index: 5}, nvml.MIGDevice{GPUInstance: 13, ComputeInstance: 1, Index: 6}); got != "gpu-5-mig-13-1" {
		t.Errorf("MIGDeviceName = %q", got)
	}
}

// A GPU sharing.memoryShares selects allows several allocations, its
// memory consumed whole by default and at least the minimum; list's JSON
// says so in these keys.
func TestMemoryShares(t *testing.T) {
	in := GPUs{GPUs: []nvml.GPU{{Index: 0, UUID: "GPU-a", MemoryBytes: 80 << 30}, {Index: 1, UUID: "GPU-b", MemoryBytes: 80 << 30}},
		MemoryShares: func(g nvml.GPU) bool { return g.Index == 0 }, ShareMinimum: 2 << 30}
	devs := GPUDevices(in, t.TempDir(), func(uuid string) string { return "k=" + uuid }, slog.New(slog.DiscardHandler))
	if len(devs) != 2 || !devs[0].AllowMultipleAllocations || devs[1].AllowMultipleAllocations || devs[1].Capacity["memory"].RequestPolicy != nil {
		t.Fatalf("devices = %+v", devs)
	}
	b, err := json.Marshal(Device{Name: devs[0].Name, Capacity: devs[0].Capacity, AllowMultipleAllocations: true})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"gpu-0","capacity":{"memory":{"value":"80Gi","requestPolicy":{"default":"80Gi","min":"2Gi"}}},"allowMultipleAllocations":true}`
	if string(b) != want {
		t.Errorf("JSON\n got %s\nwant %s", b, want)
	}
}

// A device the API would refuse makes it refuse the node's whole slice:
// taints beyond its limit are dropped, the first kept.
func TestTaintsOfCapped(t *testing.T) {
	var conds []string
	for i := range TaintsMax + 4 {
		conds = append(conds, fmt.Sprintf("cond%d=v", i))
	}
	got := TaintsOf("d", strings.Join(conds, ", "))
	if len(got) != TaintsMax || got[0].Key != "d/cond0" || got[TaintsMax-1].Key != fmt.Sprintf("d/cond%d", TaintsMax-1) {
		t.Errorf("TaintsOf with %d conditions = %d taints (%v), want the first %d", len(conds), len(got), got, TaintsMax)
	}
}

// A NIC with so many netdevs their list passes the API's 64 bytes has no
// netdev attribute rather than a slice the API refuses.
func TestNICLongAttributeLeftOut(t *testing.T) {
	short := sysfs.NIC{Address: "0000:3b:00.0", Vendor: "15b3", Device: "101d", NUMANode: -1, Netdevs: []string{"eth0"}, IBDevices: []string{"mlx5_0"}}
	long := short
	long.Address = "0000:3b:00.1"
	long.Netdevs = []string{"enp59s0f1np1", "enp59s0f1np1v0", "enp59s0f1np1v1", "enp59s0f1np1v2", "enp59s0f1np1v3"}
	devs := NICDevices(NICPool{Name: "rdma", NICs: []sysfs.NIC{short, long}}, t.TempDir(), func(string, string) string { return "" }, slog.New(slog.DiscardHandler))
	if len(devs) != 2 {
		t.Fatalf("NICDevices = %d devices, want 2", len(devs))
	}
	if a, ok := devs[0].Attributes["netdev"]; !ok || a.String == nil || *a.String != "eth0" {
		t.Errorf("short NIC netdev = %+v, want eth0", a)
	}
	if a, ok := devs[1].Attributes["netdev"]; ok {
		t.Errorf("long NIC netdev = %q (%d bytes), want it left out", *a.String, len(*a.String))
	}
	if a, ok := devs[1].Attributes["rdmaDevice"]; !ok || *a.String != "mlx5_0" {
		t.Errorf("long NIC rdmaDevice = %+v, want mlx5_0", a)
	}
}

// A whole GPU registered in a multi-node NVLink domain carries cliqueID
// ("<cluster UUID>.<clique ID>", the gpu.clique label's value) and
// fabricClusterUUID; one still registering, or without a fabric, carries
// neither, and MIG devices never do.
func TestFabricAttributes(t *testing.T) {
	const cluster = "5a1c0000-0000-0000-0000-000000000001"
	for _, tc := range []struct {
		name   string
		fabric *nvml.Fabric
		want   bool
	}{
		{"registered", &nvml.Fabric{ClusterUUID: cluster, CliqueID: 3, State: nvml.FabricCompleted}, true},
		{"registering", &nvml.Fabric{State: nvml.FabricInProgress}, false},
		{"registration failed", &nvml.Fabric{ClusterUUID: cluster, CliqueID: 3, State: nvml.FabricCompleted, Status: "ERROR_INSUFFICIENT_RESOURCES"}, false},
		{"no fabric", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := mixedGPUs()
			for i := range in.GPUs {
				in.GPUs[i].Fabric = tc.fabric
			}
			whole := 0
			for _, d := range GPUDevices(in, t.TempDir(), func(string) string { return "" }, nil) {
				clique, hasClique := d.Attributes["cliqueID"]
				uuid, hasUUID := d.Attributes["fabricClusterUUID"]
				if d.Type != TypeGPU || !tc.want {
					if hasClique || hasUUID {
						t.Errorf("%s (%s) has fabric attributes %q %q", d.Name, d.Type, attrString(clique), attrString(uuid))
					}
					continue
				}
				whole++
				if attrString(clique) != cluster+".3" || attrString(uuid) != cluster {
					t.Errorf("%s: cliqueID %q, fabricClusterUUID %q", d.Name, attrString(clique), attrString(uuid))
				}
			}
			if tc.want && whole == 0 {
				t.Error("no whole GPU published")
			}
		})
	}
}

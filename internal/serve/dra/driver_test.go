package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

const (
	testDriver = "gpu-device-plugin.github.io"
	testNode   = "node-a"
)

type fakePublisher struct {
	mu   sync.Mutex
	pubs []slicepub.DriverResources
	// clock runs the driver's debounce timers.
	clock *fakeClock
}

// settle lets every debounced publication out.
func (f *fakePublisher) settle() { f.clock.advance(DefaultPublishMaxDelay) }

func (f *fakePublisher) PublishResources(_ context.Context, r slicepub.DriverResources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pubs = append(f.pubs, r)
	return nil
}

func (f *fakePublisher) last(t *testing.T) []resourceapi.Device {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pubs) == 0 {
		t.Fatal("nothing published")
	}
	var out []resourceapi.Device
	for _, s := range f.pubs[len(f.pubs)-1].Pools[testNode].Slices {
		out = append(out, s.Devices...)
	}
	return out
}

func (f *fakePublisher) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pubs)
}

// fakeSysfs links two GPUs and a NIC under PCIe root pci0000:00 and one
// GPU under pci0000:80, as /sys/bus/pci/devices does.
func fakeSysfs(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for addr, rc := range map[string]string{"0000:07:00.0": "pci0000:00", "0000:0f:00.0": "pci0000:00", "0000:0c:00.0": "pci0000:00", "0000:87:00.0": "pci0000:80"} {
		dev := filepath.Join(root, "devices", rc, "0000:00:01.0", addr)
		if err := os.MkdirAll(dev, 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "..", "devices", rc, "0000:00:01.0", addr), link); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func testGPUs() draslice.GPUs {
	gpus := []nvml.GPU{
		{Index: 0, UUID: "GPU-a", Minor: 0, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: "0000:07:00.0", NUMANode: 0, Brand: "nvidia", Architecture: "hopper", CUDAComputeCapability: "9.0"},
		{Index: 1, UUID: "GPU-b", Minor: 1, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: "0000:0f:00.0", NUMANode: 0},
		{Index: 2, UUID: "GPU-c", Minor: 2, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: "0000:87:00.0", NUMANode: -1},
	}
	nv := nvml.Link{NVLinks: 18, PCIe: nvml.LinkCrossCPU}
	pcie := nvml.Link{PCIe: nvml.LinkCrossCPU}
	topo := nvml.Topology{Links: [][]nvml.Link{{{}, nv, pcie}, {nv, {}, pcie}, {pcie, pcie, {}}}}
	return draslice.GPUs{GPUs: gpus, Topology: topo, DriverVersion: "535.104.05", CUDADriverVersion: 12020}
}

type testSpecs struct{ err error }

func (s *testSpecs) Ensure(string) error { return s.err }

func newTestDriver(t testing.TB, dir string, o Options) (*Driver, *fakePublisher) {
	t.Helper()
	o.DriverName, o.NodeName = testDriver, testNode
	if o.SysfsRoot == "" {
		o.SysfsRoot = fakeSysfs(t)
	}
	o.CheckpointPath = filepath.Join(dir, "checkpoint.json")
	o.GPUCDIID = func(uuid string) string { return "gpu-device-plugin.github.io/gpu=" + uuid }
	o.NICCDIID = func(pool, addr string) string { return "example.com/rdma=" + addr }
	clk := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if o.Now == nil {
		o.Now = clk.Now
	}
	if o.AfterFunc == nil {
		o.AfterFunc = clk.AfterFunc
	}
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	pub := &fakePublisher{clock: clk}
	d.SetPublisher(context.Background(), pub)
	return d, pub
}

func byName(devs []resourceapi.Device) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, d := range devs {
		out[d.Name] = d
	}
	return out
}

func str(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return "v" + *a.VersionValue
	case a.IntValue != nil:
		return "i" + itoa(*a.IntValue)
	case a.BoolValue != nil:
		if *a.BoolValue {
			return "true"
		}
		return "false"
	}
	return "?"
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestGPUDevicesAndAttributes(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	if pub.count() != 0 {
		t.Fatal("published before the GPUs were known")
	}
	d.SetGPUs(context.Background(), testGPUs())
	devs := byName(pub.last(t))
	if len(devs) != 3 {
		t.Fatalf("published %d devices, want 3", len(devs))
	}
	want := map[resourceapi.QualifiedName]string{
		"type": "gpu", "uuid": "GPU-a", "index": "i0", "minor": "i0", "productName": "NVIDIA H100 80GB HBM3",
		"brand": "nvidia", "architecture": "hopper", "cudaComputeCapability": "v9.0.0",
		"driverVersion": "v535.104.5", "cudaDriverVersion": "v12.2.0", "nvlinkClique": "GPU-a",
		"resource.kubernetes.io/pciBusID": "0000:07:00.0", "resource.kubernetes.io/pcieRoot": "pci0000:00",
		"resource.kubernetes.io/numaNode": "i0",
	}
	g0 := devs["gpu-0"]
	for k, v := range want {
		if got := str(g0.Attributes[k]); got != v {
			t.Errorf("gpu-0 %s = %q, want %q", k, got, v)
		}
	}
	if len(g0.Attributes) != len(want) {
		t.Errorf("gpu-0 has %d attributes, want %d: %v", len(g0.Attributes), len(want), g0.Attributes)
	}
	if m := g0.Capacity["memory"].Value; m.Value() != 80<<30 {
		t.Errorf("gpu-0 memory = %s", m.String())
	}
	if got := str(devs["gpu-1"].Attributes["nvlinkClique"]); got != "GPU-a" {
		t.Errorf("gpu-1 nvlinkClique = %q, want gpu-0's island GPU-a", got)
	}
	g2 := devs["gpu-2"]
	for _, k := range []resourceapi.QualifiedName{"nvlinkClique", "resource.kubernetes.io/numaNode", "brand"} {
		if _, ok := g2.Attributes[k]; ok {
			t.Errorf("gpu-2 has %s, which is unknown for it", k)
		}
	}
	if got := str(g2.Attributes["resource.kubernetes.io/pcieRoot"]); got != "pci0000:80" {
		t.Errorf("gpu-2 pcieRoot = %q", got)
	}
}

func TestNICDevices(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 2})
	d.SetGPUs(context.Background(), testGPUs())
	if pub.count() != 0 {
		t.Fatal("published before the NIC pool reported")
	}
	nic := sysfs.NIC{Address: "0000:0c:00.0", Vendor: "15b3", Device: "1021", Driver: "mlx5_core", NUMANode: 0,
		Netdevs: []string{"ens1np0"}, LinkType: sysfs.LinkEther, IBDevices: []string{"mlx5_0"}, RDMADevices: []string{"uverbs0"}}
	d.SetNICPool(context.Background(), draslice.NICPool{Name: "example.com/rdma", NICs: []sysfs.NIC{nic}},
		[]device.Device{{ID: nic.Address, Healthy: true}}, true)
	n := byName(pub.last(t))["nic-0000-0c-00-0"]
	for k, v := range map[resourceapi.QualifiedName]string{
		"type": "nic", "pool": "example.com/rdma", "vendorID": "15b3", "deviceID": "1021", "driver": "mlx5_core",
		"netdev": "ens1np0", "rdma": "true", "rdmaDevice": "mlx5_0", "linkType": sysfs.LinkEther, "sriovVF": "false",
		"resource.kubernetes.io/pcieRoot": "pci0000:00", "resource.kubernetes.io/numaNode": "i0",
	} {
		if got := str(n.Attributes[k]); got != v {
			t.Errorf("NIC %s = %q, want %q", k, got, v)
		}
	}
	// A link going down taints the NIC; coming back removes it.
	d.SetNICPool(context.Background(), draslice.NICPool{Name: "example.com/rdma", NICs: []sysfs.NIC{nic}},
		[]device.Device{{ID: nic.Address, Healthy: false, Reason: "link-down"}}, false)
	pub.settle()
	if ts := byName(pub.last(t))["nic-0000-0c-00-0"].Taints; len(ts) != 1 || ts[0].Key != testDriver+"/link-down" {
		t.Errorf("taints of a down NIC = %+v", ts)
	}
}

func TestTaintsFollowHealth(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 500, time.UTC)
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1, Now: func() time.Time { return now }})
	d.SetGPUs(context.Background(), testGPUs())
	if !d.SetHealth("GPU-b", false, "xid=79") {
		t.Fatal("SetHealth reported no change")
	}
	pub.settle()
	ts := byName(pub.last(t))["gpu-1"].Taints
	if len(ts) != 1 || ts[0].Key != testDriver+"/xid" || ts[0].Value != "79" || ts[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints = %+v, want %s/xid=79:NoSchedule", ts, testDriver)
	}
	added := ts[0].TimeAdded
	if added == nil || !added.Time.Equal(now.Truncate(time.Second)) {
		t.Errorf("TimeAdded = %v", added)
	}
	// Another condition joins: the first taint keeps its time.
	now = now.Add(time.Minute)
	d.SetHealth("GPU-b", false, "xid=79, thermal=95C>=slowdown 90C")
	pub.settle()
	ts = byName(pub.last(t))["gpu-1"].Taints
	if len(ts) != 2 || !ts[0].TimeAdded.Equal(added) || ts[1].Key != testDriver+"/thermal" || ts[1].Value != "95C-slowdown-90C" {
		t.Errorf("taints = %+v", ts)
	}
	if d.SetHealth("GPU-b", false, "xid=79, thermal=95C>=slowdown 90C") {
		t.Error("the same health again counted as a change")
	}
	d.SetHealth("GPU-b", true, "")
	pub.settle()
	if ts := byName(pub.last(t))["gpu-1"].Taints; len(ts) != 0 {
		t.Errorf("taints after recovery = %+v, want none", ts)
	}
}

func claim(uid, name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: "ns", Name: name},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

func result(req, dev string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: req, Driver: testDriver, Pool: testNode, Device: dev}
}

func TestPrepareUnprepareAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	d, _ := newTestDriver(t, dir, Options{Sources: 1})
	d.SetGPUs(ctx, testGPUs())
	c1 := claim("uid-1", "two", result("gpus", "gpu-0"), result("gpus", "gpu-1"),
		resourceapi.DeviceRequestAllocationResult{Request: "other", Driver: "other.example.com", Pool: "x", Device: "y"})
	got, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c1})
	if err != nil || got["uid-1"].Err != nil {
		t.Fatalf("Prepare: %v %v", err, got["uid-1"].Err)
	}
	devs := got["uid-1"].Devices
	if len(devs) != 2 || devs[0].DeviceName != "gpu-0" || devs[0].CDIDeviceIDs[0] != "gpu-device-plugin.github.io/gpu=GPU-a" || devs[1].PoolName != testNode {
		t.Fatalf("devices = %+v", devs)
	}
	// A second claim for a held GPU is refused, naming the holder.
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "thief", result("g", "gpu-1"))})
	if e := got["uid-2"].Err; e == nil || !strings.Contains(e.Error(), "ns/two") {
		t.Errorf("double allocation: err = %v, want one naming ns/two", e)
	}

	// A new process: the claim is still prepared, with the same answer.
	d2, _ := newTestDriver(t, dir, Options{Sources: 1})
	d2.SetGPUs(ctx, testGPUs())
	got, _ = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c1})
	if len(got["uid-1"].Devices) != 2 || got["uid-1"].Err != nil {
		t.Errorf("after restart: %+v", got["uid-1"])
	}
	un, err := d2.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-1"}, {UID: "never"}})
	if err != nil || un["uid-1"] != nil || un["never"] != nil || len(un) != 2 {
		t.Fatalf("Unprepare = %v, %v", un, err)
	}
	got, _ = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "next", result("g", "gpu-1"))})
	if got["uid-2"].Err != nil {
		t.Errorf("GPU not free after Unprepare: %v", got["uid-2"].Err)
	}
	d3, _ := newTestDriver(t, dir, Options{Sources: 1})
	if _, ok := d3.cp.Claims["uid-1"]; ok || len(d3.cp.Claims) != 1 {
		t.Errorf("checkpoint after Unprepare holds %v", d3.cp.Claims)
	}
}

func TestPrepareRefusals(t *testing.T) {
	ctx := context.Background()
	specs := &testSpecs{}
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1, Specs: specs})
	d.SetGPUs(ctx, testGPUs())
	opaque := claim("uid-c", "cfg", result("g", "gpu-0"))
	opaque.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"g"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: testDriver, Parameters: runtime.RawExtension{Raw: []byte(`{"sharing":"time-slicing"}`)},
		}},
	}}
	foreign := claim("uid-f", "foreign", result("g", "gpu-0"))
	foreign.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClass,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{}`)},
		}},
	}}
	unalloc := claim("uid-u", "pending")
	unalloc.Status.Allocation = nil
	otherPool := claim("uid-p", "elsewhere", resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: testDriver, Pool: "node-b", Device: "gpu-0"})
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{opaque, "opaque config[0] (from the claim, for requests g) for driver " + testDriver + ": parameters do not decode"},
		{unalloc, "not allocated"},
		{otherPool, `pool "node-b" is not this node's`},
		{claim("uid-n", "nosuch", result("g", "gpu-9")), `device "gpu-9" is not on this node`},
	} {
		got, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{tc.c})
		if err != nil {
			t.Fatal(err)
		}
		if e := got[tc.c.UID].Err; e == nil || !strings.Contains(e.Error(), tc.want) || !strings.Contains(e.Error(), tc.c.Name) {
			t.Errorf("claim %s: err = %v, want one with %q and the claim's name", tc.c.Name, e, tc.want)
		}
	}
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{foreign})
	if got["uid-f"].Err != nil {
		t.Errorf("another driver's config refused: %v", got["uid-f"].Err)
	}
	d.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-f"}})

	// A CDI spec not on disk: not prepared, and not checkpointed.
	specs.err = os.ErrPermission
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-s", "nospec", result("g", "gpu-0"))})
	if got["uid-s"].Err == nil {
		t.Error("prepared with the CDI spec missing")
	}
	if len(d.cp.Claims) != 0 {
		t.Errorf("checkpoint holds %v", d.cp.Claims)
	}
}

func TestTwoProcessesShareTheCheckpoint(t *testing.T) {
	// A rolling update: the old and the new pod serve side by side, the
	// helper's file lock taking their calls one at a time.
	dir := t.TempDir()
	ctx := context.Background()
	oldPod, _ := newTestDriver(t, dir, Options{Sources: 1})
	newPod, _ := newTestDriver(t, dir, Options{Sources: 1})
	oldPod.SetGPUs(ctx, testGPUs())
	newPod.SetGPUs(ctx, testGPUs())
	if got, _ := oldPod.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-1", "first", result("g", "gpu-0"))}); got["uid-1"].Err != nil {
		t.Fatal(got["uid-1"].Err)
	}
	got, _ := newPod.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "second", result("g", "gpu-0"))})
	if e := got["uid-2"].Err; e == nil || !strings.Contains(e.Error(), "ns/first") {
		t.Errorf("the new process gave away a GPU the old one prepared: err = %v", e)
	}
	if got, _ := newPod.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-3", "third", result("g", "gpu-1"))}); got["uid-3"].Err != nil {
		t.Fatal(got["uid-3"].Err)
	}
	if _, err := newPod.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-1"}}); err != nil {
		t.Fatal(err)
	}
	cp, err := loadCheckpoint(filepath.Join(dir, "checkpoint.json"))
	if err != nil || len(cp.Claims) != 1 || cp.Claims["uid-3"].Name != "third" {
		t.Errorf("checkpoint = %+v, %v; want only claim third", cp.Claims, err)
	}
}

func TestCorruptCheckpointIsSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"claims":{"uid-1":`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, _ := newTestDriver(t, dir, Options{Sources: 1})
	if len(d.cp.Claims) != 0 {
		t.Fatalf("claims from a corrupt file: %v", d.cp.Claims)
	}
	if b, err := os.ReadFile(path + ".corrupt"); err != nil || !strings.Contains(string(b), "uid-1") {
		t.Errorf("corrupt file not kept aside: %v", err)
	}
	d.SetGPUs(context.Background(), testGPUs())
	got, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim("uid-1", "again", result("g", "gpu-0"))})
	if got["uid-1"].Err != nil {
		t.Fatalf("Prepare after a corrupt checkpoint: %v", got["uid-1"].Err)
	}
	if _, err := loadCheckpoint(path); err != nil {
		t.Errorf("checkpoint written after recovery does not load: %v", err)
	}
}

func TestCheckpointJSON(t *testing.T) {
	c := checkpoint{Version: 1, Claims: map[types.UID]preparedClaim{"u": {Namespace: "ns", Name: "c", Devices: []preparedDevice{{
		Requests: []string{"r"}, Pool: "p", Device: "gpu-0", CDIDeviceIDs: []string{"k=v"}, AdminAccess: true,
	}}}}}
	b, _ := json.Marshal(c)
	want := `{"version":1,"claims":{"u":{"namespace":"ns","name":"c","devices":[{"requests":["r"],"pool":"p","device":"gpu-0","cdiDeviceIDs":["k=v"],"adminAccess":true}]}}}`
	if string(b) != want {
		t.Errorf("checkpoint JSON\n got %s\nwant %s", b, want)
	}
	// An MPS client's share, its limits and a time-slice interval.
	share := types.UID("s-1")
	c.Claims["u"].Devices[0] = preparedDevice{Requests: []string{"r"}, Pool: "p", Device: "gpu-0", CDIDeviceIDs: []string{"k=v"},
		ShareID: &share, MPS: &preparedMPS{GPU: "GPU-a", ThreadPercentage: 13, PinnedMemoryMiB: 10240, Whole: true}, TimeSlice: "Long"}
	b, _ = json.Marshal(c)
	want = `{"version":1,"claims":{"u":{"namespace":"ns","name":"c","devices":[{"requests":["r"],"pool":"p","device":"gpu-0","cdiDeviceIDs":["k=v"],` +
		`"shareID":"s-1","mps":{"gpu":"GPU-a","threadPercentage":13,"pinnedMemoryMiB":10240,"whole":true},"timeSlice":"Long"}]}}}`
	if string(b) != want {
		t.Errorf("checkpoint JSON\n got %s\nwant %s", b, want)
	}
}

// The opaque parameters' keys, as docs/dra.md documents them.
func TestGPUConfigKeys(t *testing.T) {
	q := resource.MustParse("10Gi")
	g := GPUConfig{APIVersion: ConfigAPIVersion, Kind: GPUConfigKind, Sharing: &SharingConfig{
		Strategy: StrategyMPS, MPS: &MPSConfig{ActiveThreadPercentage: 50, PinnedMemoryLimit: &q}, TimeSlicing: &TimeSlicingConfig{Interval: "Long"},
	}}
	b, _ := json.Marshal(g)
	want := `{"apiVersion":"gpu-device-plugin.github.io/v1alpha1","kind":"GPUConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":50,"pinnedMemoryLimit":"10Gi"},"timeSlicing":{"interval":"Long"}}}`
	if string(b) != want {
		t.Errorf("GPUConfig JSON\n got %s\nwant %s", b, want)
	}
}

func TestHealthBeforeDevices(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	// The watcher's first poll runs before the GPUs are published.
	d.SetHealth("GPU-a", false, "gpu-lost")
	d.SetGPUs(context.Background(), testGPUs())
	if ts := byName(pub.last(t))["gpu-0"].Taints; len(ts) != 1 || ts[0].Key != testDriver+"/gpu-lost" {
		t.Errorf("first publication's taints = %+v", ts)
	}
}

func TestHealthReports(t *testing.T) {
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1, HealthResend: time.Hour})
	d.SetGPUs(context.Background(), testGPUs())
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubelet.DeviceHealthReport)
	done := make(chan error)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	first := <-reports
	if len(first.Devices) != 3 || first.Devices[0].Health != kubelet.HealthStatusHealthy || first.Devices[0].PoolName != testNode {
		t.Fatalf("first report = %+v", first)
	}
	d.SetHealth("GPU-c", false, "xid=79")
	next := <-reports
	got := next.Devices[2]
	if got.DeviceName != "gpu-2" || got.Health != kubelet.HealthStatusUnhealthy || got.Message != "xid=79: fallen off the bus" {
		t.Errorf("after XID: %+v", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealthStatus = %v", err)
	}
}

// A GPU being evicted has its taints NoExecute, until that ends; another
// GPU's stay NoSchedule. The remediation's reason is one taint.
func TestEvictMakesTaintsNoExecute(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	d.SetGPUs(context.Background(), testGPUs())
	d.SetHealth("GPU-a", false, "xid=79")
	d.SetHealth("GPU-b", false, "remediation: draining: xid=48: double-bit ECC error, a reset clears it")
	d.Evict("GPU-b", true)
	pub.settle()
	devs := byName(pub.last(t))
	if ts := devs["gpu-1"].Taints; len(ts) != 1 || ts[0].Key != testDriver+"/remediation" || ts[0].Value != "draining" || ts[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("taints of the GPU evicted = %+v", ts)
	}
	if ts := devs["gpu-0"].Taints; len(ts) != 1 || ts[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints of another GPU = %+v", ts)
	}
	d.Evict("GPU-b", false)
	pub.settle()
	if ts := byName(pub.last(t))["gpu-1"].Taints; len(ts) != 1 || ts[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints once the eviction ended = %+v", ts)
	}
}

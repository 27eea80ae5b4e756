package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// h100Layout is what an H100 in MIG mode allows, with the driver's
// profile IDs (not the indices) and placements in memory slices.
func h100Layout() nvml.MIGLayout {
	l := nvml.MIGLayout{MemorySlices: 8, ComputeSlices: 7}
	add := func(index int, id uint32, name string, slices, size, instances int, mib uint64, sms int, starts ...int) {
		for _, s := range starts {
			l.Placements = append(l.Placements, nvml.MIGPlacement{ProfileIndex: index, ProfileID: id, Profile: name, Start: s, Size: size,
				ComputeSlices: slices, Instances: instances, MemoryBytes: mib << 20, Multiprocessors: sms})
		}
	}
	add(0, 19, "1g.10gb", 1, 1, 7, 9856, 16, 0, 1, 2, 3, 4, 5, 6)
	add(7, 20, "1g.10gb+me", 1, 1, 1, 9856, 16, 0, 1, 2, 3, 4, 5, 6)
	add(1, 14, "2g.20gb", 2, 2, 3, 20096, 32, 0, 2, 4)
	add(2, 9, "3g.40gb", 3, 4, 2, 40320, 60, 0, 4)
	add(3, 5, "4g.40gb", 4, 4, 1, 40320, 64, 0)
	add(4, 0, "7g.80gb", 7, 8, 1, 80896, 132, 0)
	return l
}

// fakeMIG models NVML's MIG reconfiguration on one node: GPU instance IDs
// follow from the placement as on an A100 or H100 (neither its start nor
// an index: a 3g at slice 4 is GPU instance 2), overlapping placements are
// refused, a created MIG device gets a new UUID every time, and the
// instances outlive the driver that made them.
type fakeMIG struct {
	mu      sync.Mutex
	gis     map[string]map[int]fakeGI // by GPU UUID, GPU instance ID
	made    int
	inUse   map[int]bool // GPU instance IDs whose destroy is refused
	created func()       // called after each creation, before it returns
	failAt  int          // the placement start whose creation fails, -1 none
	// leaveAt is a placement start whose creation fails half-way and
	// cannot destroy what it made (NVML shut down under it), -1 none.
	leaveAt int
}

type fakeGI struct {
	pl   nvml.MIGPlacement
	uuid string
}

func newFakeMIG() *fakeMIG {
	return &fakeMIG{gis: map[string]map[int]fakeGI{}, inUse: map[int]bool{}, failAt: -1, leaveAt: -1}
}

// giID is the GPU instance ID the driver gives a placement: 0 for the
// whole GPU, then the halves, quarters and eighths of its memory in order.
func giID(pl nvml.MIGPlacement) int {
	switch pl.Size {
	case 8:
		return 0
	case 4:
		return 1 + pl.Start/4
	case 2:
		return 3 + pl.Start/2
	}
	return 7 + pl.Start
}

func (f *fakeMIG) Create(g nvml.GPU, pl nvml.MIGPlacement) (nvml.MIGDevice, error) {
	f.mu.Lock()
	if pl.Start == f.failAt {
		f.mu.Unlock()
		return nvml.MIGDevice{}, fmt.Errorf("creating: %w", nvml.ErrPlacementTaken)
	}
	gis := f.gis[g.UUID]
	if gis == nil {
		gis = map[int]fakeGI{}
		f.gis[g.UUID] = gis
	}
	for _, gi := range gis {
		if pl.Overlaps(gi.pl.Start, gi.pl.Size) {
			f.mu.Unlock()
			return nvml.MIGDevice{}, fmt.Errorf("GPU %s: %w", g.UUID, nvml.ErrPlacementTaken)
		}
	}
	id := giID(pl)
	f.made++
	gis[id] = fakeGI{pl: pl, uuid: fmt.Sprintf("MIG-%s-%d-%d", g.UUID, id, f.made)}
	hook := f.created
	if pl.Start == f.leaveAt {
		f.leaveAt = -1
		f.mu.Unlock()
		return nvml.MIGDevice{}, fmt.Errorf("creating its compute instance: Uninitialized; destroying it again: Uninitialized (%w)", nvml.ErrLeftBehind)
	}
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	m, _, err := f.Find(g, id)
	return m, err
}

func (f *fakeMIG) Find(g nvml.GPU, id int) (nvml.MIGDevice, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	gi, ok := f.gis[g.UUID][id]
	if !ok {
		return nvml.MIGDevice{}, false, nil
	}
	return nvml.MIGDevice{UUID: gi.uuid, GPUInstance: id, Profile: gi.pl.Profile, CapMinors: []int{3 + g.Minor*135 + id*9, 4 + g.Minor*135 + id*9}}, true, nil
}

func (f *fakeMIG) Destroy(g nvml.GPU, id int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inUse[id] {
		return errors.New("In use by another client")
	}
	delete(f.gis[g.UUID], id)
	return nil
}

func (f *fakeMIG) Instances(g nvml.GPU) ([]nvml.GPUInstance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []nvml.GPUInstance
	for id, gi := range f.gis[g.UUID] {
		out = append(out, nvml.GPUInstance{ID: id, ProfileID: gi.pl.ProfileID, Start: gi.pl.Start, Size: gi.pl.Size})
	}
	return out, nil
}

func (f *fakeMIG) count(uuid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.gis[uuid])
}

// partitionedGPUs is testGPUs with GPU-c in MIG mode, partitioned.
func partitionedGPUs(instances ...nvml.GPUInstance) draslice.GPUs {
	in := testGPUs()
	in.GPUs[2].MIGEnabled = true
	l := h100Layout()
	l.Instances = instances
	in.Partitions = map[string]draslice.Partition{"GPU-c": {Layout: l}}
	return in
}

// migSpecs records the MIG spec the driver writes.
type migSpecs struct {
	mu   sync.Mutex
	devs []cdi.Device
}

func (s *migSpecs) write(devs []cdi.Device) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devs = devs
	return nil
}

func (s *migSpecs) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, d := range s.devs {
		out = append(out, d.Name)
	}
	return out
}

func partitionDriver(t *testing.T, dir string, f *fakeMIG, in draslice.GPUs) (*Driver, *fakePublisher, *migSpecs) {
	t.Helper()
	d, pub := newTestDriver(t, dir, Options{Sources: 1, DevRoot: "/host/dev"})
	specs := &migSpecs{}
	d.SetMIG(f, specs.write)
	d.SetGPUs(context.Background(), in)
	return d, pub, specs
}

func TestPartitionsPublished(t *testing.T) {
	// A 1g made by hand at slice 0 (GPU instance 7): the placements over
	// it are withheld.
	_, pub, _ := partitionDriver(t, t.TempDir(), newFakeMIG(), partitionedGPUs(nvml.GPUInstance{ID: 7, ProfileID: 19, Start: 0, Size: 1}))
	devs := byName(pub.last(t))
	if _, ok := devs["gpu-2"]; ok {
		t.Error("the partitioned GPU is published whole")
	}
	for _, name := range []string{"gpu-2-7g-80gb-0", "gpu-2-1g-10gb-0", "gpu-2-2g-20gb-0", "gpu-2-3g-40gb-0", "gpu-2-4g-40gb-0"} {
		if _, ok := devs[name]; ok {
			t.Errorf("%s overlaps the instance made by hand, and is published", name)
		}
	}
	dv, ok := devs["gpu-2-3g-40gb-4"]
	if !ok {
		t.Fatalf("no gpu-2-3g-40gb-4 in %v", slices.Sorted(mapKeys(devs)))
	}
	if *dv.Attributes["type"].StringValue != "mig" || *dv.Attributes["profile"].StringValue != "3g.40gb" || *dv.Attributes["parentUUID"].StringValue != "GPU-c" ||
		*dv.Attributes["placementStart"].IntValue != 4 || *dv.Attributes["placementSize"].IntValue != 4 {
		t.Errorf("attributes: %v", dv.Attributes)
	}
	if len(dv.ConsumesCounters) != 1 || dv.ConsumesCounters[0].CounterSet != "gpu-2-slices" {
		t.Fatalf("consumesCounters: %+v", dv.ConsumesCounters)
	}
	var counters []string
	for k, v := range dv.ConsumesCounters[0].Counters {
		counters = append(counters, fmt.Sprintf("%s=%s", k, v.Value.String()))
	}
	slices.Sort(counters)
	want := []string{"compute-slices=3", "memory-slice-4=1", "memory-slice-5=1", "memory-slice-6=1", "memory-slice-7=1"}
	if !slices.Equal(counters, want) {
		t.Errorf("counters %v, want %v", counters, want)
	}
	// The counter set is in a slice of its own.
	pub.mu.Lock()
	sl := pub.pubs[len(pub.pubs)-1].Pools[testNode].Slices
	pub.mu.Unlock()
	var sets []resourceapi.CounterSet
	for _, s := range sl {
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Error("a slice has devices and counter sets")
		}
		sets = append(sets, s.SharedCounters...)
	}
	// 8 memory slices, 7 compute slices, and one 1g.10gb+me at most
	// (the GPU has one set of media engines).
	if len(sets) != 1 || sets[0].Name != "gpu-2-slices" || len(sets[0].Counters) != 10 {
		t.Fatalf("counter sets: %+v", sets)
	}
	if q := sets[0].Counters["compute-slices"].Value; q.Value() != 7 {
		t.Errorf("compute-slices = %s, want 7", q.String())
	}
	if q := sets[0].Counters["instances-1g-10gb-me"].Value; q.Value() != 1 {
		t.Errorf("instances-1g-10gb-me = %s, want 1", q.String())
	}
	if c := devs["gpu-2-1g-10gb-me-3"].ConsumesCounters; len(c) != 1 || len(c[0].Counters) != 3 || !c[0].Counters["instances-1g-10gb-me"].Value.Equal(resource.MustParse("1")) {
		t.Errorf("gpu-2-1g-10gb-me-3 consumes %+v", c)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestPartitionPrepareUnprepare(t *testing.T) {
	ctx := context.Background()
	f := newFakeMIG()
	d, _, specs := partitionDriver(t, t.TempDir(), f, partitionedGPUs())
	got, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{
		claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4")),
		claim("uid-4g", "four", result("mig", "gpu-2-4g-40gb-0")),
	})
	if err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[types.UID]string{"uid-3g": "MIG-GPU-c-2-1", "uid-4g": "MIG-GPU-c-1-2"} {
		r := got[uid]
		if r.Err != nil {
			t.Fatalf("%s: %v", uid, r.Err)
		}
		ids := r.Devices[0].CDIDeviceIDs
		if !slices.Equal(ids, []string{"gpu-device-plugin.github.io/gpu=GPU-c", cdi.MIGKind + "=" + want}) {
			t.Errorf("%s: CDI devices %v", uid, ids)
		}
	}
	if n := specs.names(); !slices.Equal(n, []string{"MIG-GPU-c-2-1", "MIG-GPU-c-1-2"}) {
		t.Errorf("MIG spec devices %v", n)
	}
	specs.mu.Lock()
	nodes := specs.devs[0].Edits.Nodes
	specs.mu.Unlock()
	if len(nodes) != 2 || nodes[0].HostPath != "/host/dev/nvidia-caps/nvidia-cap291" || nodes[1].Path != "/dev/nvidia-caps/nvidia-cap292" {
		t.Errorf("caps nodes %+v", nodes)
	}
	// The GPU instance IDs are the driver's, not the placements.
	cp, err := loadCheckpoint(d.o.CheckpointPath)
	if err != nil {
		t.Fatal(err)
	}
	if m := cp.Claims["uid-3g"].Devices[0].MIG; m == nil || m.GPUInstance != 2 || m.Start != 4 || m.UUID != "MIG-GPU-c-2-1" || m.ProfileID != 9 {
		t.Errorf("checkpoint: %+v", m)
	}

	// A placement over a prepared one is refused before NVML is asked.
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-1g", "one", result("mig", "gpu-2-1g-10gb-5"))})
	if err := got["uid-1g"].Err; err == nil || !strings.Contains(err.Error(), "overlaps device gpu-2-3g-40gb-4 (3g.40gb at slice 4) of claim ns/three") {
		t.Errorf("overlap: %v", err)
	}
	// The kubelet prepares again at each container start: the same answer.
	again, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4"))})
	if ids := again["uid-3g"].Devices[0].CDIDeviceIDs; again["uid-3g"].Err != nil || ids[1] != cdi.MIGKind+"=MIG-GPU-c-2-1" {
		t.Errorf("prepared again: %v %v", ids, again["uid-3g"].Err)
	}

	// A process still on the instance: Unprepare fails and keeps the claim.
	f.inUse[2] = true
	res, _ := d.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-3g"}})
	if res["uid-3g"] == nil || !strings.Contains(res["uid-3g"].Error(), "In use") {
		t.Errorf("unprepare in use: %v", res["uid-3g"])
	}
	delete(f.inUse, 2)
	res, _ = d.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-3g"}, {UID: "uid-4g"}})
	if res["uid-3g"] != nil || res["uid-4g"] != nil {
		t.Fatalf("unprepare: %v", res)
	}
	if n := f.count("GPU-c"); n != 0 {
		t.Errorf("%d instances left", n)
	}
	if n := specs.names(); len(n) != 0 {
		t.Errorf("MIG spec keeps %v", n)
	}
	// Now the 1g fits.
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-1g", "one", result("mig", "gpu-2-1g-10gb-5"))})
	if got["uid-1g"].Err != nil {
		t.Errorf("1g after the others went: %v", got["uid-1g"].Err)
	}
}

// A creation NVML refuses leaves nothing: no instance, no claim, no spec.
func TestPartitionCreateFails(t *testing.T) {
	ctx := context.Background()
	f := newFakeMIG()
	f.failAt = 4
	d, _, specs := partitionDriver(t, t.TempDir(), f, partitionedGPUs())
	c := claim("uid-2", "two", result("a", "gpu-2-2g-20gb-0"), result("b", "gpu-2-3g-40gb-4"))
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err := got["uid-2"].Err; err == nil || !errors.Is(err, nvml.ErrPlacementTaken) {
		t.Fatalf("Prepare: %v", err)
	}
	if f.count("GPU-c") != 0 || len(specs.names()) != 0 {
		t.Errorf("left %d instances, spec %v", f.count("GPU-c"), specs.names())
	}
	cp, _ := loadCheckpoint(d.o.CheckpointPath)
	if len(cp.Claims) != 0 {
		t.Errorf("checkpoint keeps %v", cp.Claims)
	}
}

// The process dies after NVML created the instance and before the
// checkpoint said so: the next process destroys it and forgets the claim,
// which the kubelet prepares again.
func TestPartitionCrashBetweenCreateAndCheckpoint(t *testing.T) {
	ctx := context.Background()
	dir, crashed := t.TempDir(), t.TempDir()
	f := newFakeMIG()
	d, _, _ := partitionDriver(t, dir, f, partitionedGPUs())
	// What is on disk when the instance exists: the claim, pending.
	f.created = func() {
		b, err := os.ReadFile(d.o.CheckpointPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(crashed, "checkpoint.json"), b, 0o600)
		}
		if err != nil {
			t.Error(err)
		}
	}
	c := claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4"))
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); got["uid-3g"].Err != nil {
		t.Fatal(got["uid-3g"].Err)
	}
	f.created = nil
	// The instance is there, and the on-disk checkpoint of the moment has
	// no UUID for it.
	if f.count("GPU-c") != 1 {
		t.Fatal("no instance")
	}
	cp, err := loadCheckpoint(filepath.Join(crashed, "checkpoint.json"))
	if err != nil || cp.Claims["uid-3g"].Devices[0].MIG == nil || cp.Claims["uid-3g"].Devices[0].MIG.UUID != "" {
		t.Fatalf("crash-time checkpoint: %+v %v", cp, err)
	}
	// Restart from that moment: the instance is ours, not foreign, so its
	// placements stay published; the first call destroys it.
	d2, pub2, specs2 := partitionDriver(t, crashed, f, partitionedGPUs(nvml.GPUInstance{ID: 2, ProfileID: 9, Start: 4, Size: 4}))
	if _, ok := byName(pub2.last(t))["gpu-2-3g-40gb-4"]; !ok {
		t.Error("the placement being created when the process died is withheld")
	}
	got, _ := d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-other", "other", result("mig", "gpu-2-1g-10gb-0"))})
	if got["uid-other"].Err != nil {
		t.Fatal(got["uid-other"].Err)
	}
	if n := f.count("GPU-c"); n != 1 {
		t.Errorf("%d instances after reconciling, want the new 1g only", n)
	}
	cp, _ = loadCheckpoint(d2.o.CheckpointPath)
	if _, ok := cp.Claims["uid-3g"]; ok {
		t.Error("the interrupted claim is still in the checkpoint")
	}
	// The kubelet's retry prepares it anew.
	got, _ = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if got["uid-3g"].Err != nil || f.count("GPU-c") != 2 || len(specs2.names()) != 2 {
		t.Errorf("retry: %v, %d instances, spec %v", got["uid-3g"].Err, f.count("GPU-c"), specs2.names())
	}
}

// After a reboot the instances are gone; a claim prepared before gets its
// instance made again at the same placement, with a new UUID.
func TestPartitionRecreatedAfterReboot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := newFakeMIG()
	d, _, _ := partitionDriver(t, dir, f, partitionedGPUs())
	c := claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-0"))
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); got["uid-3g"].Err != nil {
		t.Fatal(got["uid-3g"].Err)
	}
	rebooted := newFakeMIG()
	rebooted.made = f.made
	d2, _, specs := partitionDriver(t, dir, rebooted, partitionedGPUs())
	got, _ := d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if got["uid-3g"].Err != nil {
		t.Fatal(got["uid-3g"].Err)
	}
	if ids := got["uid-3g"].Devices[0].CDIDeviceIDs; !slices.Equal(ids, []string{"gpu-device-plugin.github.io/gpu=GPU-c", cdi.MIGKind + "=MIG-GPU-c-1-2"}) {
		t.Errorf("CDI devices %v", ids)
	}
	if n := specs.names(); !slices.Equal(n, []string{"MIG-GPU-c-1-2"}) {
		t.Errorf("spec %v", n)
	}
}

// Before the GPUs are discovered, a MIG claim is refused for now (the
// kubelet retries), never prepared without its instance.
func TestPartitionBeforeDiscovery(t *testing.T) {
	ctx := context.Background()
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	d.SetGPUs(ctx, partitionedGPUs())
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-0"))})
	if err := got["uid-3g"].Err; err == nil || !strings.Contains(err.Error(), "the kubelet retries") {
		t.Errorf("Prepare: %v", err)
	}
}

// A creation that fails half-way and cannot destroy what it made (NVML
// shut down under it as the process stops) keeps the claim recorded as
// being prepared: the next call destroys the instance by its placement,
// and the kubelet's retry prepares the claim anew.
func TestPartitionCreateLeavesAnInstance(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := newFakeMIG()
	f.leaveAt = 4
	d, _, _ := partitionDriver(t, dir, f, partitionedGPUs())
	c := claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4"))
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err := got["uid-3g"].Err; err == nil || !errors.Is(err, errLeftBehind) {
		t.Fatalf("Prepare: %v", err)
	}
	cp, _ := loadCheckpoint(d.o.CheckpointPath)
	if m := cp.Claims["uid-3g"].Devices; len(m) != 1 || m[0].MIG == nil || m[0].MIG.UUID != "" {
		t.Fatalf("on disk: %+v, want the claim recorded as being prepared", cp.Claims)
	}
	if f.count("GPU-c") != 1 {
		t.Fatal("the fake left nothing")
	}
	// A process started now (the one that failed was stopping) sees the
	// instance as the claim's, not as one made by hand.
	_, pub, _ := partitionDriver(t, dir, f, partitionedGPUs(nvml.GPUInstance{ID: 2, ProfileID: 9, Start: 4, Size: 4}))
	if _, ok := byName(pub.last(t))["gpu-2-3g-40gb-4"]; !ok {
		t.Error("the placement left behind is withheld as foreign")
	}
	// The retry, in the same process: reconciled, then prepared anew.
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if got["uid-3g"].Err != nil {
		t.Fatal(got["uid-3g"].Err)
	}
	if n := f.count("GPU-c"); n != 1 {
		t.Errorf("%d instances, want the new one only", n)
	}
	cp, _ = loadCheckpoint(d.o.CheckpointPath)
	if m := cp.Claims["uid-3g"].Devices[0].MIG; m == nil || m.UUID == "" {
		t.Errorf("on disk after the retry: %+v", m)
	}
}

// An admin-access request for a placement watches the instance a claim
// made there, and makes none; with none there, it is refused.
func TestPartitionAdminAccess(t *testing.T) {
	ctx := context.Background()
	f := newFakeMIG()
	d, _, _ := partitionDriver(t, t.TempDir(), f, partitionedGPUs())
	admin := result("mig", "gpu-2-3g-40gb-4")
	admin.AdminAccess = new(true)
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-mon", "monitor", admin)})
	if err := got["uid-mon"].Err; err == nil || !strings.Contains(err.Error(), "no instance a claim made") {
		t.Errorf("admin access with no instance: %v", err)
	}
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4"))})
	if got["uid-3g"].Err != nil {
		t.Fatal(got["uid-3g"].Err)
	}
	mon, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-mon", "monitor", admin)})
	if mon["uid-mon"].Err != nil || !slices.Equal(mon["uid-mon"].Devices[0].CDIDeviceIDs, got["uid-3g"].Devices[0].CDIDeviceIDs) {
		t.Errorf("monitor got %+v, want the workload's %v", mon["uid-mon"], got["uid-3g"].Devices[0].CDIDeviceIDs)
	}
	if f.count("GPU-c") != 1 {
		t.Errorf("%d instances, want the workload's only", f.count("GPU-c"))
	}
	// The monitor going destroys nothing; the workload's going does.
	res, _ := d.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-mon"}})
	if res["uid-mon"] != nil || f.count("GPU-c") != 1 {
		t.Errorf("unprepare monitor: %v, %d instances", res["uid-mon"], f.count("GPU-c"))
	}
}

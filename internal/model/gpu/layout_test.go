package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

func mig(parent, idx, gi, ci int, profile string) nvml.MIGDevice {
	return nvml.MIGDevice{
		UUID: fmt.Sprintf("MIG-%d-%d", parent, idx), Index: idx, GPUInstance: gi, ComputeInstance: ci,
		Profile: profile, CapMinors: []int{100*parent + 10*gi + 1, 100*parent + 10*gi + 2},
	}
}

// mixedNode is the mixed layout on four GPUs: GPU 0 split
// 3g.40gb + 2×2g.20gb, GPU 1 7×1g.10gb, GPU 2 MIG on with no devices,
// GPU 3 MIG off.
func mixedNode() ([]nvml.GPU, nvml.Topology) {
	gpus, topo := eightGPUs()
	gpus, topo.Links = gpus[:4], topo.Links[:4]
	gpus[0].MIGEnabled, gpus[1].MIGEnabled, gpus[2].MIGEnabled = true, true, true
	gpus[0].MIG = []nvml.MIGDevice{mig(0, 0, 2, 0, "3g.40gb"), mig(0, 1, 3, 0, "2g.20gb"), mig(0, 2, 4, 0, "2g.20gb")}
	for k := range 7 {
		gpus[1].MIG = append(gpus[1].MIG, mig(1, k, 7+k, 0, "1g.10gb"))
	}
	return gpus, topo
}

func layoutOf(t *testing.T, gpus []nvml.GPU, strategy string, sharing Sharings) (map[string][]string, string) {
	t.Helper()
	var buf bytes.Buffer
	served, err := Layout(gpus, strategy, sharing, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, s := range served {
		for _, u := range s.Units {
			id := u.UUID()
			if u.Replicas > 1 {
				id = fmt.Sprintf("%s×%d", id, u.Replicas)
			}
			if u.MPS {
				id += " mps"
			}
			out[s.Name] = append(out[s.Name], id)
		}
	}
	return out, buf.String()
}

func TestLayoutStrategies(t *testing.T) {
	gpus, _ := mixedNode()
	ones := []string{"MIG-1-0", "MIG-1-1", "MIG-1-2", "MIG-1-3", "MIG-1-4", "MIG-1-5", "MIG-1-6"}
	tests := []struct {
		strategy string
		want     map[string][]string
		logs     []string
	}{
		{MIGNone, map[string][]string{resname.GPU: {"GPU-00000000", "GPU-00000001", "GPU-00000002", "GPU-00000003"}},
			[]string{"migStrategy is none"}},
		{MIGMixed, map[string][]string{
			resname.GPU:              {"GPU-00000003"},
			"nvidia.com/mig-3g.40gb": {"MIG-0-0"},
			"nvidia.com/mig-2g.20gb": {"MIG-0-1", "MIG-0-2"},
			"nvidia.com/mig-1g.10gb": ones,
		}, []string{"no MIG devices: nothing of it is served"}},
		// single: one size only, the most common; the MIG-off GPU and the
		// other sizes are left out, each with its reason.
		{MIGSingle, map[string][]string{resname.GPU: ones},
			[]string{"has MIG disabled and is not served", "profile differs from the node's most common one", "no MIG devices"}},
	}
	for _, tt := range tests {
		t.Run(tt.strategy, func(t *testing.T) {
			got, logs := layoutOf(t, gpus, tt.strategy, Sharings{})
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("layout = %v\nwant %v", got, tt.want)
			}
			for _, l := range tt.logs {
				if !strings.Contains(logs, l) {
					t.Errorf("log lacks %q:\n%s", l, logs)
				}
			}
		})
	}
	if _, err := Layout(gpus, "half", Sharings{}, nil); err == nil || !strings.Contains(err.Error(), "none, single or mixed") {
		t.Errorf("bad strategy: %v", err)
	}
}

// fixedSharing gives replicas by UUID; anything else is not shared.
type fixedSharing struct {
	replicas map[string]int
	rename   string
}

func (f fixedSharing) Replicas(resource, uuid, model string) (int, string) {
	n := f.replicas[uuid]
	if n == 0 {
		return 1, resource
	}
	if f.rename != "" {
		return n, f.rename
	}
	return n, resource
}

func TestLayoutSharing(t *testing.T) {
	gpus, _ := mixedNode()
	got, _ := layoutOf(t, gpus, MIGMixed, Sharings{TimeSlicing: fixedSharing{replicas: map[string]int{"GPU-00000003": 4, "MIG-0-0": 2}, rename: "nvidia.com/gpu.shared"}})
	want := map[string][]string{
		"nvidia.com/gpu.shared":  {"MIG-0-0×2", "GPU-00000003×4"},
		"nvidia.com/mig-2g.20gb": {"MIG-0-1", "MIG-0-2"},
		"nvidia.com/mig-1g.10gb": {"MIG-1-0", "MIG-1-1", "MIG-1-2", "MIG-1-3", "MIG-1-4", "MIG-1-5", "MIG-1-6"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("layout = %v\nwant %v", got, want)
	}
}

// MPS shares whole GPUs only, and a GPU both would share is MPS's.
func TestLayoutMPS(t *testing.T) {
	gpus, _ := eightGPUs()
	gpus = gpus[:3]
	ts := fixedSharing{replicas: map[string]int{"GPU-00000001": 4, "GPU-00000002": 2}, rename: "nvidia.com/gpu.sliced"}
	mps := fixedSharing{replicas: map[string]int{"GPU-00000000": 8, "GPU-00000001": 3}, rename: "nvidia.com/gpu.mps"}
	got, _ := layoutOf(t, gpus, MIGNone, Sharings{TimeSlicing: ts, MPS: mps})
	want := map[string][]string{
		"nvidia.com/gpu.mps":    {"GPU-00000000×8 mps", "GPU-00000001×3 mps"},
		"nvidia.com/gpu.sliced": {"GPU-00000002×2"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("layout = %v\nwant %v", got, want)
	}
	// Under single, nvidia.com/gpu are MIG devices: MPS leaves them alone.
	node, _ := mixedNode()
	node[3].MIGEnabled = true
	node[3].MIG = []nvml.MIGDevice{mig(3, 0, 1, 0, "1g.10gb")}
	got, _ = layoutOf(t, node, MIGSingle, Sharings{MPS: fixedSharing{replicas: map[string]int{"MIG-3-0": 2, "GPU-00000003": 2}}})
	for _, ids := range got {
		for _, id := range ids {
			if strings.HasSuffix(id, " mps") {
				t.Errorf("MIG device shared through MPS: %v", got)
			}
		}
	}
}

func migResource(t *testing.T, strategy string, o Options) *Resource {
	t.Helper()
	gpus, topo := mixedNode()
	served, err := Layout(gpus, strategy, Sharings{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var units []Unit
	for _, s := range served {
		units = append(units, s.Units...)
	}
	r, err := NewUnits(units, topo, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAllocateMIG(t *testing.T) {
	root := devRoot(t, "nvidiactl")
	r := migResource(t, MIGMixed, Options{DevRoot: root, Strategies: []string{StrategyEnvvar, StrategyCDICRI}})
	// Two MIG devices of GPU 0 out of order, and one of GPU 1.
	a, err := r.Allocate([]string{"MIG-1-3", "MIG-0-2", "MIG-0-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.Env[VisibleDevicesEnv], "MIG-0-1,MIG-0-2,MIG-1-3"; got != want {
		t.Errorf("%s = %q, want %q", VisibleDevicesEnv, got, want)
	}
	// The parent's node once, each instance's capability nodes, the
	// control node.
	want := []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap31", "/dev/nvidia-caps/nvidia-cap32",
		"/dev/nvidia-caps/nvidia-cap41", "/dev/nvidia-caps/nvidia-cap42",
		"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap201", "/dev/nvidia-caps/nvidia-cap202", "/dev/nvidiactl"}
	if got := paths(a.Nodes); !slices.Equal(got, want) {
		t.Errorf("nodes = %v\nwant %v", got, want)
	}
	if a.Nodes[1].HostPath != root+"/nvidia-caps/nvidia-cap31" {
		t.Errorf("cap host path = %s", a.Nodes[1].HostPath)
	}
	if want := []string{"gpu-device-plugin.github.io/gpu=MIG-0-1", "gpu-device-plugin.github.io/gpu=MIG-0-2", "gpu-device-plugin.github.io/gpu=MIG-1-3"}; !slices.Equal(a.CDIDevices, want) {
		t.Errorf("CDI devices = %v, want %v", a.CDIDevices, want)
	}
	// The index form names a MIG device "<gpu>:<mig>".
	r = migResource(t, MIGMixed, Options{DevRoot: root, IDStrategy: IDStrategyIndex})
	if a, err = r.Allocate([]string{"MIG-1-3", "GPU-00000003"}); err != nil {
		t.Fatal(err)
	}
	if got := a.Env[VisibleDevicesEnv]; got != "1:3,3" {
		t.Errorf("index form = %q, want 1:3,3", got)
	}
}

func TestNewUnitsRefusesMIGWithoutCaps(t *testing.T) {
	gpus, topo := mixedNode()
	m := gpus[0].MIG[0]
	m.CapMinors = nil
	_, err := NewUnits([]Unit{{GPU: gpus[0], MIG: &m}}, topo, Options{})
	if err == nil || !strings.Contains(err.Error(), "capability minors") {
		t.Fatalf("err = %v", err)
	}
}

func sharedResource(t *testing.T, replicas int, o Options) *Resource {
	t.Helper()
	gpus, topo := eightGPUs()
	units := WholeGPUs(gpus)
	for i := range units {
		units[i].Replicas = replicas
	}
	r, err := NewUnits(units, topo, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReplicaDevices(t *testing.T) {
	r := sharedResource(t, 4, Options{})
	devs := r.Devices()
	if len(devs) != 32 || devs[0].ID != "GPU-00000000::0" || devs[5].ID != "GPU-00000001::1" || devs[31].NUMANode != 1 {
		t.Fatalf("devices = %d, first %+v, sixth %+v, last %+v", len(devs), devs[0], devs[5], devs[31])
	}
	if ids := r.DeviceIDs("GPU-00000002"); !slices.Equal(ids, []string{"GPU-00000002::0", "GPU-00000002::1", "GPU-00000002::2", "GPU-00000002::3"}) {
		t.Errorf("DeviceIDs = %v", ids)
	}
	if u, ok := r.UnitOf("GPU-00000002::3"); !ok || u != "GPU-00000002" {
		t.Errorf("UnitOf = %q %v", u, ok)
	}
}

func TestAllocateReplicasNamesEachGPUOnce(t *testing.T) {
	r := sharedResource(t, 4, Options{DevRoot: devRoot(t), Strategies: []string{StrategyEnvvar, StrategyCDICRI}})
	a, err := r.Allocate([]string{"GPU-00000001::3", "GPU-00000000::2", "GPU-00000001::0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Env[VisibleDevicesEnv]; got != "GPU-00000000,GPU-00000001" {
		t.Errorf("%s = %q: a GPU listed twice or out of order", VisibleDevicesEnv, got)
	}
	if got := paths(a.Nodes); !slices.Equal(got, []string{"/dev/nvidia0", "/dev/nvidia1"}) {
		t.Errorf("nodes = %v", got)
	}
	if len(a.CDIDevices) != 2 {
		t.Errorf("CDI devices = %v", a.CDIDevices)
	}
	if _, err := r.Allocate([]string{"GPU-00000001::3", "GPU-00000001::3"}); !errors.Is(err, device.ErrBadRequest) {
		t.Errorf("repeated replica: %v", err)
	}
	if _, err := r.Allocate([]string{"GPU-00000001::9"}); !errors.Is(err, device.ErrBadRequest) {
		t.Errorf("unknown replica: %v", err)
	}
}

func TestFailRequestsGreaterThanOne(t *testing.T) {
	r := sharedResource(t, 4, Options{FailRequestsGreaterThanOne: true})
	if _, err := r.Allocate([]string{"GPU-00000001::1"}); err != nil {
		t.Fatalf("one replica: %v", err)
	}
	_, err := r.Allocate([]string{"GPU-00000001::1", "GPU-00000002::1"})
	if !errors.Is(err, device.ErrBadRequest) || !strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Fatalf("two replicas: %v", err)
	}
}

func allIDs(r *Resource) []string {
	var out []string
	for _, d := range r.Devices() {
		out = append(out, d.ID)
	}
	return out
}

func without(ids []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(drop, id) })
}

func unitsOf(r *Resource, ids []string) []string {
	var out []string
	for _, id := range ids {
		u, _ := r.UnitOf(id)
		out = append(out, u)
	}
	return out
}

func TestPreferredDistributedSpreads(t *testing.T) {
	r := sharedResource(t, 4, Options{})
	// GPUs 0 and 1 each have a replica taken: a one-replica request lands
	// on the first idle GPU, not on a used one.
	avail := without(allIDs(r), "GPU-00000000::0", "GPU-00000001::0")
	got, err := r.Preferred(avail, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	if u := unitsOf(r, got); u[0] != "GPU-00000002" {
		t.Errorf("one replica on %v, want GPU-00000002 (idle)", u)
	}
	// Four replicas on an idle node: four GPUs, all on one NUMA node
	// (better linked than across).
	got, err = r.Preferred(allIDs(r), nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	units := unitsOf(r, got)
	if len(slices.Compact(slices.Sorted(slices.Values(units)))) != 4 {
		t.Errorf("4 replicas on %v, want 4 GPUs", units)
	}
	for _, u := range units {
		if u > "GPU-00000003" {
			t.Errorf("4 replicas on %v: crosses NUMA nodes", units)
		}
	}
	// mustInclude is kept, and the rest spreads away from its GPU.
	got, err = r.Preferred(allIDs(r), []string{"GPU-00000005::2"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != "GPU-00000005::2" || unitsOf(r, got)[1] == "GPU-00000005" {
		t.Errorf("with mustInclude: %v", got)
	}
}

func TestPreferredPackedFills(t *testing.T) {
	r := sharedResource(t, 4, Options{Placement: PlacementPacked})
	// GPU 6 has 2 replicas taken, GPU 1 one: packing takes GPU 6 first.
	avail := without(allIDs(r), "GPU-00000006::0", "GPU-00000006::1", "GPU-00000001::0")
	got, err := r.Preferred(avail, nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU-00000006::2", "GPU-00000006::3", "GPU-00000001::1"}
	// GPU 6's two free replicas, then the next most used GPU.
	if !slices.Equal(got, want) {
		t.Errorf("packed = %v, want %v", got, want)
	}
	// On an idle node, 6 replicas fill one GPU, then a second
	// well-linked one (same NUMA node).
	got, err = r.Preferred(allIDs(r), nil, 6)
	if err != nil {
		t.Fatal(err)
	}
	units := slices.Compact(unitsOf(r, got))
	if len(units) != 2 || units[1] > "GPU-00000003" {
		t.Errorf("packed on idle node = %v", got)
	}
	picks, err := r.ExplainPreferred(allIDs(r), nil, 2)
	if err != nil || len(picks) != 2 || picks[0].Unit != picks[1].Unit || !strings.Contains(picks[1].Why, "packed: most used GPU with room (4 of 4") {
		t.Errorf("explain = %+v, %v", picks, err)
	}
}

func TestPreferredReplicasRejectsImpossible(t *testing.T) {
	r := sharedResource(t, 2, Options{})
	if _, err := r.Preferred([]string{"GPU-00000000::0"}, nil, 2); err == nil {
		t.Error("2 of 1 available: no error")
	}
	if _, err := r.Preferred([]string{"nope"}, nil, 1); err == nil {
		t.Error("unknown ID: no error")
	}
}

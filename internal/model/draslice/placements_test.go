package draslice

import (
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

func TestPlacementDeviceNames(t *testing.T) {
	g := nvml.GPU{Index: 3}
	for profile, want := range map[string]string{
		"3g.40gb":        "gpu-3-3g-40gb-4",
		"1g.10gb+me":     "gpu-3-1g-10gb-me-4",
		"1g.10gb-me":     "gpu-3-1g-10gb-no-me-4",
		"1g.20gb+gfx":    "gpu-3-1g-20gb-gfx-4",
		"2g.20gb+me.all": "gpu-3-2g-20gb-me-all-4",
	} {
		if got := PlacementDeviceName(g, nvml.MIGPlacement{Profile: profile, Start: 4}); got != want {
			t.Errorf("%s: %s, want %s", profile, got, want)
		}
	}
}

// Only GPUs in MIG mode with a partition get a counter set: a GPU whose
// MIG mode went off (reset) is whole again, and takes none.
func TestCounterSets(t *testing.T) {
	l := nvml.MIGLayout{MemorySlices: 8, ComputeSlices: 7}
	in := GPUs{
		GPUs:       []nvml.GPU{{Index: 0, UUID: "GPU-0", MIGEnabled: true}, {Index: 1, UUID: "GPU-1"}, {Index: 2, UUID: "GPU-2", MIGEnabled: true}},
		Partitions: map[string]Partition{"GPU-0": {Layout: l}, "GPU-1": {Layout: l}},
	}
	sets := CounterSets(in)
	if len(sets) != 1 || sets[0].Name != "gpu-0-slices" || len(sets[0].Counters) != 9 || sets[0].Counters["compute-slices"] != 7 || sets[0].Counters["memory-slice-7"] != 1 {
		t.Errorf("counter sets %+v", sets)
	}
}

// A profile with fewer instances than placements gets a counter of its
// own; one with as many placements as instances none.
func TestInstanceCounters(t *testing.T) {
	l := nvml.MIGLayout{MemorySlices: 8, ComputeSlices: 7}
	for k := range 7 {
		l.Placements = append(l.Placements,
			nvml.MIGPlacement{Profile: "1g.10gb", Start: k, Size: 1, ComputeSlices: 1, Instances: 7},
			nvml.MIGPlacement{Profile: "1g.10gb+me", Start: k, Size: 1, ComputeSlices: 1, Instances: 1})
	}
	in := GPUs{GPUs: []nvml.GPU{{Index: 0, UUID: "GPU-0", MIGEnabled: true}}, Partitions: map[string]Partition{"GPU-0": {Layout: l}}}
	sets := CounterSets(in)
	if len(sets) != 1 || len(sets[0].Counters) != 10 || sets[0].Counters["instances-1g-10gb-me"] != 1 {
		t.Fatalf("counter sets %+v", sets)
	}
	for _, d := range GPUDevices(in, t.TempDir(), func(string) string { return "" }, nil) {
		_, counted := d.ConsumesCounters[0].Counters["instances-1g-10gb-me"]
		if counted != (d.Placement.Profile == "1g.10gb+me") {
			t.Errorf("%s consumes %v", d.Name, d.ConsumesCounters[0].Counters)
		}
	}
}

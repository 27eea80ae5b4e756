package mocknvml

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvcaps"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// TestPartitioner runs the plugin's MIG partitioner (what DRA's Prepare
// and Unprepare call) against the mock, and a second process that finds
// what the first left, as a restarted plugin does.
func TestPartitioner(t *testing.T) {
	dir := t.TempDir()
	env := []string{
		"MOCK_NVML_PROFILE=" + profilePath("dgx-h100-mig"),
		"MOCK_NVML_PROC_ROOT=" + filepath.Join(dir, "proc"),
		"MOCK_NVML_MIG_STATE=" + filepath.Join(dir, "mig-state"),
	}
	runChild(t, "TestChildPartitioner", append(env, "MOCKNVML_TEST_CASE=first")...)
	runChild(t, "TestChildPartitioner", append(env, "MOCKNVML_TEST_CASE=restarted")...)
}

func TestChildPartitioner(t *testing.T) {
	childOnly(t)
	lib, err := nvml.Open(os.Getenv(envLib))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	inv, err := nvml.Discover(lib, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p, err := nvml.NewPartitioner(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := inv.GPUs[emptyGPU]
	procRoot := os.Getenv("MOCK_NVML_PROC_ROOT")
	l, err := p.Layout(g)
	if err != nil {
		t.Fatal(err)
	}
	at := func(profile string, start int) nvml.MIGPlacement {
		t.Helper()
		i := slices.IndexFunc(l.Placements, func(pl nvml.MIGPlacement) bool { return pl.Profile == profile && pl.Start == start })
		if i < 0 {
			t.Fatalf("no %s at %d in %+v", profile, start, l.Placements)
		}
		return l.Placements[i]
	}

	if os.Getenv(envCase) == "restarted" {
		// The instances the first process made are there, by placement.
		want := []nvml.GPUInstance{{ID: 1, ProfileID: 5, Start: 0, Size: 4}, {ID: 2, ProfileID: 9, Start: 4, Size: 4}}
		if !slices.Equal(l.Instances, want) {
			t.Errorf("instances %+v, want %+v", l.Instances, want)
		}
		m, found, err := p.Find(g, 2)
		if err != nil || !found || m.Profile != "3g.40gb" {
			t.Fatalf("Find(2) = %+v, %v, %v", m, found, err)
		}
		for _, gi := range []int{1, 2, 2} { // the second destroy of 2 finds it gone
			if err := p.Destroy(g, gi); err != nil {
				t.Errorf("Destroy(%d): %v", gi, err)
			}
		}
		if l, _ = p.Layout(g); len(l.Instances) != 0 {
			t.Errorf("left %+v", l.Instances)
		}
		return
	}

	// The layout: an H100's profiles by name, with the driver's IDs.
	if l.MemorySlices != 8 || l.ComputeSlices != 7 || len(l.Instances) != 0 {
		t.Errorf("layout: %d memory slices, %d compute slices, instances %+v", l.MemorySlices, l.ComputeSlices, l.Instances)
	}
	if pl := at("3g.40gb", 4); pl.ProfileID != 9 || pl.ProfileIndex != gonvml.GPU_INSTANCE_PROFILE_3_SLICE || pl.Size != 4 || pl.ComputeSlices != 3 {
		t.Errorf("3g.40gb at 4: %+v", pl)
	}
	at("1g.10gb+me", 6)
	at("7g.80gb", 0)

	four, err := p.Create(g, at("4g.40gb", 0))
	if err != nil {
		t.Fatal(err)
	}
	three, err := p.Create(g, at("3g.40gb", 4))
	if err != nil {
		t.Fatal(err)
	}
	if four.GPUInstance != 1 || three.GPUInstance != 2 || three.ComputeInstance != 0 || three.Profile != "3g.40gb" || four.UUID == three.UUID {
		t.Errorf("created %+v and %+v", four, three)
	}
	// The capability files the driver shows, as the plugin reads them.
	minors, err := nvcaps.MIGMinors(procRoot, g.Minor, three.GPUInstance, three.ComputeInstance)
	if want := 3 + 135*g.Minor + 9*2; err != nil || !slices.Equal(minors, []int{want, want + 1}) {
		t.Errorf("capability minors %v, %v; want %d, %d", minors, err, want, want+1)
	}
	// The slices are taken: a 1g over them is refused as such.
	if _, err := p.Create(g, at("1g.10gb", 5)); !errors.Is(err, nvml.ErrPlacementTaken) {
		t.Errorf("a 1g over the 3g: %v", err)
	}
	if m, found, err := p.Find(g, 2); err != nil || !found || m.UUID != three.UUID {
		t.Errorf("Find(2) = %+v, %v, %v", m, found, err)
	}
	if _, found, err := p.Find(g, 5); err != nil || found {
		t.Errorf("Find(5), no such instance: %v, %v", found, err)
	}
	// Discovery sees them as MIG devices, as the kubelet's CUDA would.
	again, err := nvml.Discover(lib, "", slog.New(slog.DiscardHandler))
	if err != nil || len(again.GPUs[emptyGPU].MIG) != 2 {
		t.Errorf("discovery after creating: %+v, %v", again.GPUs[emptyGPU].MIG, err)
	}
}

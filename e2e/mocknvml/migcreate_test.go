package mocknvml

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// The GPUs of dgx-h100-mig the creation tests use: GPU 2 has MIG on and no
// instances, GPU 0 all 7 slices in a 3g.40gb at 4:4 and 2g.20gbs at 0:2
// and 2:2, GPU 3 a 1g.10gb+me at 6:1 and a 3g.40gb at 0:4 with one
// one-slice compute instance, GPU 4 MIG off.
const (
	emptyGPU = 2
	fullGPU  = 0
	mixedGPU = 3
	offGPU   = 4
)

var migUUID = regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// giInfo is the profile info of the profile with the driver's ID id, as the
// plugin gets it: by index, through NVML.
func giInfo(t *testing.T, d gonvml.Device, id int) gonvml.GpuInstanceProfileInfo {
	t.Helper()
	p, ok := GIProfileByID(id)
	if !ok {
		t.Fatalf("no profile ID %d", id)
	}
	info, ret := d.GetGpuInstanceProfileInfo(p.Index)
	if ret != gonvml.SUCCESS || int(info.Id) != id {
		t.Fatalf("GetGpuInstanceProfileInfo(%d) = %+v, %v; want ID %d", p.Index, info, ret, id)
	}
	return info
}

// fullCI is the profile info of the compute instance that takes all of gi.
func fullCI(t *testing.T, gi gonvml.GpuInstance) gonvml.ComputeInstanceProfileInfo {
	t.Helper()
	gInfo, ret := gi.GetInfo()
	if ret != gonvml.SUCCESS {
		t.Fatalf("GpuInstance.GetInfo: %v", ret)
	}
	p, _ := GIProfileByID(int(gInfo.ProfileId))
	profile := map[int]int{1: gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: gonvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[p.Slices]
	info, ret := gi.GetComputeInstanceProfileInfo(profile, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != gonvml.SUCCESS || int(info.SliceCount) != p.Slices {
		t.Fatalf("GetComputeInstanceProfileInfo(%d) = %+v, %v", profile, info, ret)
	}
	return info
}

// createMIG creates a GPU instance of profile ID id at start and its whole
// compute instance, as the plugin does for a partitionable MIG claim.
func createMIG(t *testing.T, d gonvml.Device, id, start int) (gonvml.GpuInstance, gonvml.ComputeInstance) {
	t.Helper()
	info := giInfo(t, d, id)
	p, _ := GIProfileByID(id)
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.Eighths)})
	if ret != gonvml.SUCCESS {
		t.Fatalf("CreateGpuInstanceWithPlacement(profile %d, %d:%d): %v", id, start, p.Eighths, ret)
	}
	ciInfo := fullCI(t, gi)
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != gonvml.SUCCESS {
		t.Fatalf("CreateComputeInstance(%d): %v", ciInfo.Id, ret)
	}
	return gi, ci
}

// migDeviceOf finds the MIG device of a compute instance by its ids, and its index.
func migDeviceOf(t *testing.T, parent gonvml.Device, gi, ci int) (gonvml.Device, int) {
	t.Helper()
	for k := range MaxMIGDevices {
		d, ret := parent.GetMigDeviceHandleByIndex(k)
		if ret == gonvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != gonvml.SUCCESS {
			t.Fatalf("GetMigDeviceHandleByIndex(%d): %v", k, ret)
		}
		g, _ := d.GetGpuInstanceId()
		c, _ := d.GetComputeInstanceId()
		if g == gi && c == ci {
			return d, k
		}
	}
	t.Fatalf("no MIG device for gpu instance %d compute instance %d", gi, ci)
	return nil, 0
}

func readCap(t *testing.T, path string) (int, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var minor int
	if _, err := fmt.Sscanf(string(b), "DeviceFileMinor: %d\nDeviceFileMode: 444\n", &minor); err != nil {
		return 0, fmt.Errorf("%s: %q: %w", path, b, err)
	}
	return minor, nil
}

func TestMIGCreate(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildMIGCreate",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"),
		"MOCK_NVML_PROC_ROOT="+filepath.Join(dir, "proc"),
		"MOCK_NVML_LOG="+filepath.Join(dir, "log"))
	// Every create and destroy is logged, failures included.
	b, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"nvmlDeviceCreateGpuInstanceWithPlacement: gpu 2 profile 9: created gpu instance 2 at 4:4",
		"nvmlGpuInstanceCreateComputeInstance: gpu 2 gpu instance 2 profile 2: created compute instance 0 at 0:3, MIG device 0 MIG-",
		"nvmlDeviceCreateGpuInstanceWithPlacement: gpu 2 profile 14 at 4:2: Insufficient Resources",
		"nvmlGpuInstanceDestroy: gpu 2 gpu instance 2: In use by another client",
		"nvmlComputeInstanceDestroy: gpu 2: destroyed compute instance 0 of gpu instance 2, MIG device 0",
		"nvmlGpuInstanceDestroy: gpu 2: destroyed gpu instance 2",
		"failing as injected (mig-create-fail)",
		"paused before creating a compute instance in gpu instance",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the log lacks %q", want)
		}
	}
}

// TestChildMIGCreate creates and destroys MIG instances on dgx-h100-mig
// through go-nvml, as the plugin does for DRA's partitionable MIG devices.
func TestChildMIGCreate(t *testing.T) {
	childOnly(t)
	prof, err := LoadProfile(os.Getenv("MOCK_NVML_PROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := OpenControl(os.Getenv("MOCK_NVML_CONTROL"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	h := make([]gonvml.Device, len(prof.GPUs))
	for i := range h {
		var ret gonvml.Return
		if h[i], ret = lib.DeviceGetHandleByIndex(i); ret != gonvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
	}
	caps := filepath.Join(os.Getenv("MOCK_NVML_PROC_ROOT"), "driver", "nvidia", "capabilities")
	d := h[emptyGPU]

	t.Run("placements by profile ID, MIG on or off", func(t *testing.T) {
		for _, p := range GIProfiles {
			for _, gpu := range []int{emptyGPU, fullGPU, offGPU} {
				info := gonvml.GpuInstanceProfileInfo{Id: uint32(p.ID)}
				got, ret := h[gpu].GetGpuInstancePossiblePlacements(&info)
				var want []gonvml.GpuInstancePlacement
				for _, s := range p.Placements {
					want = append(want, gonvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.Eighths)})
				}
				if ret != gonvml.SUCCESS || !slices.Equal(got, want) {
					t.Errorf("GPU %d: GetGpuInstancePossiblePlacements(ID %d) = %v, %v; want %v", gpu, p.ID, got, ret, want)
				}
			}
		}
		// Profile indexes are not IDs: index 2 is 3_SLICE, whose ID is 9; ID 2 is no profile.
		if _, ret := d.GetGpuInstancePossiblePlacements(&gonvml.GpuInstanceProfileInfo{Id: 2}); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("placements of profile ID 2 = %v, want NOT_SUPPORTED", ret)
		}
	})

	t.Run("remaining capacity", func(t *testing.T) {
		capacity := func(gpu int) map[int]int {
			got := map[int]int{}
			for _, p := range GIProfiles {
				info := giInfo(t, h[gpu], p.ID)
				n, ret := h[gpu].GetGpuInstanceRemainingCapacity(&info)
				if ret != gonvml.SUCCESS {
					t.Fatalf("GPU %d: GetGpuInstanceRemainingCapacity(%d): %v", gpu, p.ID, ret)
				}
				got[p.ID] = n
			}
			return got
		}
		// ID: 19 1g.10gb, 20 1g.10gb+me, 15 1g.20gb, 14 2g.20gb, 9 3g.40gb, 5 4g.40gb, 0 7g.80gb.
		if got, want := capacity(emptyGPU), map[int]int{19: 7, 20: 1, 15: 4, 14: 3, 9: 2, 5: 1, 0: 1}; !maps(got, want) {
			t.Errorf("empty GPU: capacity %v, want %v", got, want)
		}
		// All 7 slices and 8 memory slices taken.
		if got, want := capacity(fullGPU), map[int]int{19: 0, 20: 0, 15: 0, 14: 0, 9: 0, 5: 0, 0: 0}; !maps(got, want) {
			t.Errorf("full GPU: capacity %v, want %v", got, want)
		}
		// 3g.40gb at 0:4 and the media extensions (one a GPU) at 6:1: memory 4, 5 and 7 free.
		if got, want := capacity(mixedGPU), map[int]int{19: 2, 20: 0, 15: 1, 14: 1, 9: 0, 5: 0, 0: 0}; !maps(got, want) {
			t.Errorf("GPU %d: capacity %v, want %v", mixedGPU, got, want)
		}
		if _, ret := h[offGPU].GetGpuInstanceRemainingCapacity(&gonvml.GpuInstanceProfileInfo{Id: 9}); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("MIG off: capacity = %v, want NOT_SUPPORTED", ret)
		}
	})

	var gi3g gonvml.GpuInstance
	var ci3g gonvml.ComputeInstance
	var uuid3g string
	t.Run("create a 3g.40gb: its id follows its placement, not the order or index", func(t *testing.T) {
		gi3g, ci3g = createMIG(t, d, 9, 4)
		info, ret := gi3g.GetInfo()
		if want := (gonvml.GpuInstanceInfo{Device: d, Id: 2, ProfileId: 9, Placement: gonvml.GpuInstancePlacement{Start: 4, Size: 4}}); ret != gonvml.SUCCESS || info != want {
			t.Errorf("GpuInstance.GetInfo = %+v, %v; want %+v", info, ret, want)
		}
		if got, ret := d.GetGpuInstanceById(2); ret != gonvml.SUCCESS || got != gi3g {
			t.Errorf("GetGpuInstanceById(2) = %v, %v; want the created one", got, ret)
		}
		ciInfo, ret := ci3g.GetInfo()
		if want := (gonvml.ComputeInstanceInfo{Device: d, GpuInstance: gi3g, Id: 0, ProfileId: gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
			Placement: gonvml.ComputeInstancePlacement{Start: 0, Size: 3}}); ret != gonvml.SUCCESS || ciInfo != want {
			t.Errorf("ComputeInstance.GetInfo = %+v, %v; want %+v", ciInfo, ret, want)
		}
		mig, ret := d.GetMigDeviceHandleByIndex(0)
		if ret != gonvml.SUCCESS {
			t.Fatalf("GetMigDeviceHandleByIndex(0): %v", ret)
		}
		uuid3g, _ = mig.GetUUID()
		m := MIGDevice{GPU: emptyGPU, Index: 0, UUID: uuid3g, GPUInstance: 2, Profile: "3g.40gb", GIProfileIndex: 2, GIProfileID: 9,
			GIStart: 4, Slices: 3, CISlices: 3, MemoryMiB: prof.GPUs[emptyGPU].MemoryMiB * 4 / 8, Multiprocessors: 60}
		if !migUUID.MatchString(uuid3g) {
			t.Errorf("UUID %q is not a MIG UUID", uuid3g)
		}
		checkMIGDevice(t, lib, d, mig, prof.GPUs[emptyGPU], m)
		if minor, err := readCap(t, filepath.Join(caps, "gpu2/mig/gi2/access")); err != nil || minor != GICapMinor(2, 2) {
			t.Errorf("gi2 access: minor %d, %v; want %d", minor, err, GICapMinor(2, 2))
		}
		if minor, err := readCap(t, filepath.Join(caps, "gpu2/mig/gi2/ci0/access")); err != nil || minor != CICapMinor(2, 2, 0) {
			t.Errorf("gi2/ci0 access: minor %d, %v; want %d", minor, err, CICapMinor(2, 2, 0))
		}
	})

	t.Run("the plugin's discovery finds the created MIG device", func(t *testing.T) {
		sysfs := t.TempDir()
		if err := prof.WriteSysfs(sysfs); err != nil {
			t.Fatal(err)
		}
		plib, err := nvml.Open(os.Getenv(envLib))
		if err != nil {
			t.Fatal(err)
		}
		defer plib.Shutdown()
		inv, err := nvml.Discover(plib, sysfs, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		g := inv.GPUs[emptyGPU]
		if len(g.MIG) != 1 || g.MIG[0].UUID != uuid3g || g.MIG[0].Profile != "3g.40gb" {
			t.Errorf("GPU %d's MIG devices: %+v; want the 3g.40gb %s", emptyGPU, g.MIG, uuid3g)
		}
	})

	t.Run("placements that overlap or are not the profile's are refused", func(t *testing.T) {
		for _, c := range []struct {
			id, start, size int
			want            gonvml.Return
			why             string
		}{
			{14, 4, 2, gonvml.ERROR_INSUFFICIENT_RESOURCES, "overlaps the 3g.40gb at 4:4"},
			{9, 4, 4, gonvml.ERROR_INSUFFICIENT_RESOURCES, "the 3g.40gb's own placement"},
			{0, 0, 8, gonvml.ERROR_INSUFFICIENT_RESOURCES, "7g over everything"},
			{14, 6, 2, gonvml.ERROR_INVALID_ARGUMENT, "a 2g.20gb cannot start at 6"},
			{9, 2, 4, gonvml.ERROR_INVALID_ARGUMENT, "a 3g.40gb cannot start at 2"},
			{5, 4, 4, gonvml.ERROR_INVALID_ARGUMENT, "a 4g.40gb only starts at 0"},
			{19, 0, 2, gonvml.ERROR_INVALID_ARGUMENT, "a 1g.10gb is one slice"},
		} {
			info := giInfo(t, d, c.id)
			if _, ret := d.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: uint32(c.start), Size: uint32(c.size)}); ret != c.want {
				t.Errorf("profile %d at %d:%d (%s) = %v, want %v", c.id, c.start, c.size, c.why, ret, c.want)
			}
		}
		if _, ret := d.CreateGpuInstanceWithPlacement(&gonvml.GpuInstanceProfileInfo{Id: 2}, &gonvml.GpuInstancePlacement{Start: 0, Size: 4}); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("profile ID 2 (an index, not an ID) = %v, want INVALID_ARGUMENT", ret)
		}
		if _, ret := h[offGPU].CreateGpuInstance(&gonvml.GpuInstanceProfileInfo{Id: 19}); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("on a MIG-off GPU = %v, want NOT_SUPPORTED", ret)
		}
		info := giInfo(t, h[fullGPU], 19)
		if _, ret := h[fullGPU].CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: 6, Size: 1}); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("1g.10gb at 6:1 on the full GPU = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		// One media-extension instance per GPU.
		info = giInfo(t, h[mixedGPU], 20)
		if _, ret := h[mixedGPU].CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: 4, Size: 1}); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("a second 1g.10gb+me = %v, want INSUFFICIENT_RESOURCES", ret)
		}
	})

	t.Run("several instances: ids, MIG device indexes, listing", func(t *testing.T) {
		// Without a placement: the first free one, 0:1, which is gi7.
		info1g := giInfo(t, d, 19)
		gi, ret := d.CreateGpuInstance(&info1g)
		if ret != gonvml.SUCCESS {
			t.Fatalf("CreateGpuInstance(1g.10gb): %v", ret)
		}
		if info, _ := gi.GetInfo(); info.Id != 7 || info.Placement != (gonvml.GpuInstancePlacement{Start: 0, Size: 1}) {
			t.Errorf("1g.10gb: %+v, want gi7 at 0:1", info)
		}
		gi2g, ci2g := createMIG(t, d, 14, 2)
		if info, _ := gi2g.GetInfo(); info.Id != 4 {
			t.Errorf("2g.20gb at 2:2: gi%d, want gi4", info.Id)
		}
		// MIG device indexes go to the lowest free slot: the 3g.40gb has 0.
		if _, k := migDeviceOf(t, d, 4, 0); k != 1 {
			t.Errorf("2g.20gb's MIG device index %d, want 1", k)
		}
		ciInfo := fullCI(t, gi)
		ci1g, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != gonvml.SUCCESS {
			t.Fatalf("CreateComputeInstance in the 1g.10gb: %v", ret)
		}
		if _, k := migDeviceOf(t, d, 7, 0); k != 2 {
			t.Errorf("1g.10gb's MIG device index %d, want 2", k)
		}
		if n, ret := d.GetGpuInstanceRemainingCapacity(&info1g); ret != gonvml.SUCCESS || n != 1 {
			t.Errorf("1g.10gb capacity = %d, %v; want 1 (slice 1)", n, ret)
		}
		gis, ret := d.GetGpuInstances(&info1g)
		if ret != gonvml.SUCCESS || len(gis) != 1 || gis[0] != gi {
			t.Errorf("GetGpuInstances(1g.10gb) = %v, %v; want the gi7", gis, ret)
		}
		info3g := giInfo(t, d, 9)
		if gis, ret := d.GetGpuInstances(&info3g); ret != gonvml.SUCCESS || len(gis) != 1 || gis[0] != gi3g {
			t.Errorf("GetGpuInstances(3g.40gb) = %v, %v; want the gi2", gis, ret)
		}
		if cis, ret := gi.GetComputeInstances(&ciInfo); ret != gonvml.SUCCESS || len(cis) != 1 || cis[0] != ci1g {
			t.Errorf("GetComputeInstances = %v, %v", cis, ret)
		}
		// A full GPU instance takes no second compute instance.
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("a second compute instance in a 1g = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		for _, ci := range []gonvml.ComputeInstance{ci1g, ci2g} {
			if ret := ci.Destroy(); ret != gonvml.SUCCESS {
				t.Errorf("ComputeInstance.Destroy: %v", ret)
			}
		}
		for _, gi := range []gonvml.GpuInstance{gi, gi2g} {
			if ret := gi.Destroy(); ret != gonvml.SUCCESS {
				t.Errorf("GpuInstance.Destroy: %v", ret)
			}
		}
	})

	t.Run("compute instances of one-slice profiles in a declared GPU instance", func(t *testing.T) {
		// GPU 3's gi1 (3g.40gb) holds a 1c at 0:1; another goes at 1:1,
		// compute instance 1, MIG device 2 (0 and 1 are the profile's).
		gi, ret := h[mixedGPU].GetGpuInstanceById(1)
		if ret != gonvml.SUCCESS {
			t.Fatalf("GetGpuInstanceById(1): %v", ret)
		}
		if info, _ := gi.GetInfo(); info.Placement != (gonvml.GpuInstancePlacement{Start: 0, Size: 4}) {
			t.Errorf("declared gi1 placement %+v, want 0:4", info.Placement)
		}
		oneC, ret := gi.GetComputeInstanceProfileInfo(gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		if n, ret := gi.GetComputeInstanceRemainingCapacity(&oneC); ret != gonvml.SUCCESS || n != 2 {
			t.Errorf("1c capacity = %d, %v; want 2", n, ret)
		}
		if p, ret := gi.GetComputeInstancePossiblePlacements(&oneC); ret != gonvml.SUCCESS || len(p) != 3 || p[2] != (gonvml.ComputeInstancePlacement{Start: 2, Size: 1}) {
			t.Errorf("1c placements = %v, %v; want 0:1 1:1 2:1", p, ret)
		}
		ci, ret := gi.CreateComputeInstance(&oneC)
		if ret != gonvml.SUCCESS {
			t.Fatalf("CreateComputeInstance(1c): %v", ret)
		}
		info, _ := ci.GetInfo()
		if info.Id != 1 || info.Placement != (gonvml.ComputeInstancePlacement{Start: 1, Size: 1}) {
			t.Errorf("new 1c: %+v, want ci1 at 1:1", info)
		}
		mig, k := migDeviceOf(t, h[mixedGPU], 1, 1)
		if name, _ := mig.GetName(); k != 2 || name != prof.GPUs[mixedGPU].Name+" MIG 1c.3g.40gb" {
			t.Errorf("MIG device %d %q, want 2, 1c.3g.40gb", k, name)
		}
		if a, _ := mig.GetAttributes(); a.MultiprocessorCount != 16 || a.ComputeInstanceSliceCount != 1 || a.GpuInstanceSliceCount != 3 {
			t.Errorf("attributes %+v", a)
		}
		// A 2c needs two aligned free slices: 0:2 is half taken.
		twoC, _ := gi.GetComputeInstanceProfileInfo(gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if _, ret := gi.CreateComputeInstance(&twoC); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("2c beside two 1c = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		if _, ret := gi.CreateComputeInstanceWithPlacement(&oneC, &gonvml.ComputeInstancePlacement{Start: 0, Size: 1}); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("1c at the taken 0:1 = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		if ret := ci.Destroy(); ret != gonvml.SUCCESS {
			t.Errorf("Destroy: %v", ret)
		}
	})

	t.Run("destroy in order: a GPU instance with compute instances is in use", func(t *testing.T) {
		if ret := gi3g.Destroy(); ret != gonvml.ERROR_IN_USE {
			t.Errorf("GpuInstance.Destroy with a compute instance = %v, want IN_USE", ret)
		}
		mig, _ := d.GetMigDeviceHandleByIndex(0)
		if ret := ci3g.Destroy(); ret != gonvml.SUCCESS {
			t.Fatalf("ComputeInstance.Destroy: %v", ret)
		}
		// The destroyed instance's handles are invalid, as NVML's become.
		if _, ret := mig.GetUUID(); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("GetUUID of a destroyed MIG device = %v, want INVALID_ARGUMENT", ret)
		}
		if _, ret := ci3g.GetInfo(); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("GetInfo of a destroyed compute instance = %v, want INVALID_ARGUMENT", ret)
		}
		if ret := ci3g.Destroy(); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("Destroy again = %v, want INVALID_ARGUMENT", ret)
		}
		if _, ret := d.GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("GetMigDeviceHandleByIndex(0) after destroy = %v, want NOT_FOUND", ret)
		}
		if _, ret := lib.DeviceGetHandleByUUID(uuid3g); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("DeviceGetHandleByUUID of a destroyed MIG device = %v, want NOT_FOUND", ret)
		}
		if _, err := os.Stat(filepath.Join(caps, "gpu2/mig/gi2/ci0")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("gi2/ci0 capability after destroy: %v", err)
		}
		// Created again, the compute instance is a new MIG device, with a new UUID.
		ciInfo := fullCI(t, gi3g)
		ci, ret := gi3g.CreateComputeInstance(&ciInfo)
		if ret != gonvml.SUCCESS {
			t.Fatalf("CreateComputeInstance again: %v", ret)
		}
		again, k := migDeviceOf(t, d, 2, 0)
		if uuid, _ := again.GetUUID(); k != 0 || uuid == uuid3g || !migUUID.MatchString(uuid) {
			t.Errorf("recreated: index %d, UUID %s; want 0 and a new UUID (was %s)", k, uuid, uuid3g)
		}
		if ret := ci.Destroy(); ret != gonvml.SUCCESS {
			t.Fatalf("ComputeInstance.Destroy: %v", ret)
		}
		if ret := gi3g.Destroy(); ret != gonvml.SUCCESS {
			t.Fatalf("GpuInstance.Destroy: %v", ret)
		}
		if _, ret := gi3g.GetInfo(); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("GetInfo of a destroyed GPU instance = %v, want INVALID_ARGUMENT", ret)
		}
		if _, ret := d.GetGpuInstanceById(2); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("GetGpuInstanceById(2) after destroy = %v, want NOT_FOUND", ret)
		}
		if _, err := os.Stat(filepath.Join(caps, "gpu2/mig/gi2")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("gi2 capability after destroy: %v", err)
		}
		// The profile's instances can be destroyed too.
		gi, _ := h[mixedGPU].GetGpuInstanceById(13)
		ci, _ = gi.GetComputeInstanceById(0)
		if ret := ci.Destroy(); ret != gonvml.SUCCESS {
			t.Errorf("destroying a declared compute instance: %v", ret)
		}
		if ret := gi.Destroy(); ret != gonvml.SUCCESS {
			t.Errorf("destroying a declared GPU instance: %v", ret)
		}
		info := giInfo(t, h[mixedGPU], 20)
		if n, _ := h[mixedGPU].GetGpuInstanceRemainingCapacity(&info); n != 1 {
			t.Errorf("1g.10gb+me capacity after destroying the GPU's = %d, want 1", n)
		}
	})

	t.Run("faults: mig-create-fail", func(t *testing.T) {
		if err := ctl.FailMIGCreate(emptyGPU, MIGCreateGPUInstance); err != nil {
			t.Fatal(err)
		}
		info := giInfo(t, d, 0)
		if _, ret := d.CreateGpuInstance(&info); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("CreateGpuInstance after mig-create-fail = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		gi, ret := d.CreateGpuInstance(&info)
		if ret != gonvml.SUCCESS {
			t.Fatalf("the next CreateGpuInstance: %v", ret)
		}
		if err := ctl.FailMIGCreate(emptyGPU, MIGCreateAny); err != nil {
			t.Fatal(err)
		}
		ciInfo := fullCI(t, gi)
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("CreateComputeInstance after mig-create-fail = %v, want INSUFFICIENT_RESOURCES", ret)
		}
		if _, ret := d.GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("a failed creation left a MIG device: %v", ret)
		}
		if ret := gi.Destroy(); ret != gonvml.SUCCESS {
			t.Errorf("Destroy: %v", ret)
		}
		for line, reason := range map[string]string{
			"mig-create-fail 4":        "gpu 4 does not have MIG on",
			"mig-create-pause 2 later": "usage: mig-create-pause",
			"mig-create-fail 2 cgi":    "usage: mig-create-fail",
			"mig-create-wait 2 1":      "no compute instance creation on gpu 2 paused within 1 ms",
		} {
			if err := ctl.Inject(line); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), reason) {
				t.Errorf("Inject(%q) = %v, want ErrRejected saying %q", line, err, reason)
			}
		}
	})

	for _, at := range []MIGPause{MIGPauseBefore, MIGPauseAfter} {
		t.Run("faults: mig-create-pause "+string(at), func(t *testing.T) {
			info := giInfo(t, d, 14)
			gi, ret := d.CreateGpuInstance(&info)
			if ret != gonvml.SUCCESS {
				t.Fatalf("CreateGpuInstance: %v", ret)
			}
			if err := ctl.PauseMIGCreate(emptyGPU, at); err != nil {
				t.Fatal(err)
			}
			ciInfo := fullCI(t, gi)
			type result struct {
				ci  gonvml.ComputeInstance
				ret gonvml.Return
			}
			done := make(chan result, 1)
			go func() {
				ci, ret := gi.CreateComputeInstance(&ciInfo)
				done <- result{ci, ret}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ctl.WaitMIGCreatePaused(ctx, emptyGPU); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				t.Fatalf("the paused call returned %v", r.ret)
			default:
			}
			// Everything else answers meanwhile; the compute instance exists only after.
			_, ret = d.GetMigDeviceHandleByIndex(0)
			if want := map[MIGPause]gonvml.Return{MIGPauseBefore: gonvml.ERROR_NOT_FOUND, MIGPauseAfter: gonvml.SUCCESS}[at]; ret != want {
				t.Errorf("while paused %s: GetMigDeviceHandleByIndex(0) = %v, want %v", at, ret, want)
			}
			if info, ret := gi.GetInfo(); ret != gonvml.SUCCESS || info.ProfileId != 14 {
				t.Errorf("while paused: GetInfo = %+v, %v", info, ret)
			}
			if err := ctl.ResumeMIGCreate(emptyGPU); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.ret != gonvml.SUCCESS {
				t.Fatalf("CreateComputeInstance after resume: %v", r.ret)
			}
			if ret := r.ci.Destroy(); ret != gonvml.SUCCESS {
				t.Errorf("Destroy: %v", ret)
			}
			if ret := gi.Destroy(); ret != gonvml.SUCCESS {
				t.Errorf("Destroy: %v", ret)
			}
		})
	}

	t.Run("the profile's other GPUs are as declared", func(t *testing.T) {
		for _, i := range []int{fullGPU, 1} {
			g := prof.GPUs[i]
			for k, m := range g.MIGDevices {
				mig, ret := h[i].GetMigDeviceHandleByIndex(k)
				if ret != gonvml.SUCCESS {
					t.Fatalf("GPU %d MIG %d: %v", i, k, ret)
				}
				checkMIGDevice(t, lib, h[i], mig, g, m)
			}
		}
	})
}

// maps says whether two maps hold the same entries.
func maps(a, b map[int]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// placementCounts is a C program that calls the placement calls with the
// buffers go-nvml never passes: NULL for the count, one too small, the
// exact size, and a NULL count. It prints one line per call.
const placementCounts = `
#include <dlfcn.h>
#include <stdio.h>
#include "nvml.h"

typedef nvmlReturn_t (*init_t)(void);
typedef nvmlReturn_t (*handle_t)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*gipp_t)(nvmlDevice_t, unsigned, nvmlGpuInstancePlacement_t *, unsigned *);
typedef nvmlReturn_t (*gibyid_t)(nvmlDevice_t, unsigned, nvmlGpuInstance_t *);
typedef nvmlReturn_t (*cipp_t)(nvmlGpuInstance_t, unsigned, nvmlComputeInstancePlacement_t *, unsigned *);

int main(int argc, char **argv)
{
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib || argc != 2)
        return 2;
    init_t init = (init_t)dlsym(lib, "nvmlInit_v2");
    handle_t handle = (handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    gibyid_t gibyid = (gibyid_t)dlsym(lib, "nvmlDeviceGetGpuInstanceById");
    cipp_t cipp = (cipp_t)dlsym(lib, "nvmlGpuInstanceGetComputeInstancePossiblePlacements");
    nvmlDevice_t dev, mixed;
    nvmlGpuInstance_t gi;
    if (init() || handle(2, &dev) || handle(3, &mixed) || gibyid(mixed, 1, &gi))
        return 3;
    const char *names[] = {"nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements"};
    for (int v = 0; v < 2; v++) {
        gipp_t gipp = (gipp_t)dlsym(lib, names[v]);
        nvmlGpuInstancePlacement_t p[8] = {{0, 0}};
        unsigned n = 99;
        nvmlReturn_t r = gipp(dev, 19, NULL, &n);
        printf("%s null: %d %u\n", names[v], r, n);
        n = 3;
        r = gipp(dev, 19, p, &n);
        printf("%s small: %d %u\n", names[v], r, n);
        n = 8;
        r = gipp(dev, 19, p, &n);
        printf("%s exact: %d %u %u:%u\n", names[v], r, n, p[6].start, p[6].size);
        r = gipp(dev, 19, p, NULL);
        printf("%s nocount: %d\n", names[v], r);
    }
    nvmlComputeInstancePlacement_t c[3];
    unsigned n = 1;
    nvmlReturn_t r = cipp(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, c, &n);
    printf("ci small: %d %u\n", r, n);
    r = cipp(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, NULL, &n);
    printf("ci null: %d %u\n", r, n);
    return 0;
}
`

// TestPlacementCounts checks NVML's count protocol of the placement calls,
// which go-nvml's wrappers only use one way.
func TestPlacementCounts(t *testing.T) {
	dir := t.TempDir()
	inc, err := headerDir()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "counts.c")
	if err := os.WriteFile(src, []byte(placementCounts), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "counts")
	if out, err := exec.Command("gcc", "-Wall", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-I", inc, "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, testLib(t))
	cmd.Env = append(os.Environ(), "MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	// NVML_SUCCESS 0, INVALID_ARGUMENT 2, INSUFFICIENT_SIZE 7.
	var want strings.Builder
	for _, name := range []string{"nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements"} {
		fmt.Fprintf(&want, "%s null: 0 7\n%s small: 7 7\n%s exact: 0 7 6:1\n%s nocount: 2\n", name, name, name, name)
	}
	want.WriteString("ci small: 7 3\nci null: 0 3\n")
	if string(out) != want.String() {
		t.Errorf("got:\n%s\nwant:\n%s", out, want.String())
	}
}

// startChild starts the TestChild function test in a new process, as
// runChild runs one, and returns it with a pipe to its stdin (where the
// child reads its go-aheads) and its output, complete once Wait returns.
func startChild(t *testing.T, test string, env ...string) (*exec.Cmd, *os.File, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MOCK_NVML_") && !strings.HasPrefix(kv, "MOCKNVML_TEST_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envChild+"="+test, envLib+"="+testLib(t))
	cmd.Env = append(cmd.Env, env...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() {
		w.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, w, &out
}

// awaitLine reads the parent's next go-ahead from stdin.
func awaitLine(t *testing.T) {
	t.Helper()
	var b [1]byte
	for {
		if _, err := os.Stdin.Read(b[:]); err != nil {
			t.Fatalf("waiting for the parent: %v", err)
		}
		if b[0] == '\n' {
			return
		}
	}
}

// TestMIGStateShared runs processes that share one driver through the
// state file: one paused halfway through a creation while another creates
// beside it, one killed between its GPU and compute instance, and one that
// finds and cleans up what the others left.
func TestMIGStateShared(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "mig-state")
	proc := filepath.Join(dir, "proc")
	common := []string{"MOCK_NVML_PROFILE=" + profilePath("dgx-h100-mig"), "MOCK_NVML_MIG_STATE=" + state,
		"MOCK_NVML_PROC_ROOT=" + proc, "MOCK_NVML_LOG=" + filepath.Join(dir, "log")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A creates a 3g.40gb at 4:4 and stops before its compute instance.
	ctlA, err := OpenControl(filepath.Join(dir, "control-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctlA.Close()
	a, aIn, aOut := startChild(t, "TestChildMIGStateA", append(common, "MOCK_NVML_CONTROL="+ctlA.Path())...)
	if err := ctlA.PauseMIGCreate(emptyGPU, MIGPauseBefore); err != nil {
		t.Fatal(err)
	}
	aIn.WriteString("go\n")
	if err := ctlA.WaitMIGCreatePaused(ctx, emptyGPU); err != nil {
		t.Fatal(err)
	}
	st, err := LoadMIGState(state)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := st.GPU(gpuUUID(t, emptyGPU)); !ok || len(g.GPUInstances) != 1 || len(g.ComputeInstances) != 0 ||
		g.GPUInstances[0] != (MIGStateGI{ID: 2, ProfileID: 9, Start: 4, Size: 4, MemoryMiB: 81559 * 4 / 8}) {
		t.Fatalf("state while A is paused: %+v", st)
	}

	// B, meanwhile, sees A's GPU instance, cannot take its place, and
	// makes a 2g.20gb MIG device beside it.
	runChild(t, "TestChildMIGStateB", common...)

	// A goes on: its MIG device comes after B's, and it sees B's instances.
	if err := ctlA.ResumeMIGCreate(emptyGPU); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); err != nil || !strings.Contains(aOut.String(), "--- PASS: TestChildMIGStateA") {
		t.Fatalf("A: %v\n%s", err, aOut)
	}
	t.Logf("A:\n%s", aOut)

	// C is killed between its GPU instance and its compute instance.
	ctlC, err := OpenControl(filepath.Join(dir, "control-c"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctlC.Close()
	c, cIn, _ := startChild(t, "TestChildMIGStateC", append(common, "MOCK_NVML_CONTROL="+ctlC.Path())...)
	if err := ctlC.PauseMIGCreate(emptyGPU, MIGPauseBefore); err != nil {
		t.Fatal(err)
	}
	cIn.WriteString("go\n")
	if err := ctlC.WaitMIGCreatePaused(ctx, emptyGPU); err != nil {
		t.Fatal(err)
	}
	if err := c.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.Wait()

	st, err = LoadMIGState(state)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := st.GPU(gpuUUID(t, emptyGPU))
	var gis []int
	for _, gi := range g.GPUInstances {
		gis = append(gis, gi.ID)
	}
	if !slices.Equal(gis, []int{2, 3, 9}) || len(g.ComputeInstances) != 2 {
		t.Fatalf("after C was killed: GPU instances %v, compute instances %+v; want 2, 3 and C's 9, two MIG devices", gis, g.ComputeInstances)
	}
	if _, err := os.Stat(filepath.Join(proc, "driver/nvidia/capabilities/gpu2/mig/gi9/access")); err != nil {
		t.Errorf("C's GPU instance's capability: %v", err)
	}

	// D, started afresh, finds everything the others created and destroys it.
	runChild(t, "TestChildMIGStateD", common...)
	st, err = LoadMIGState(state)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := st.GPU(gpuUUID(t, emptyGPU)); !ok || len(g.GPUInstances)+len(g.ComputeInstances) != 0 {
		t.Errorf("after D: %+v, want GPU %d named with no instances", st, emptyGPU)
	}
	if st.Counter != 2 {
		t.Errorf("counter %d, want 2 (A's and B's compute instances)", st.Counter)
	}
	if entries, err := os.ReadDir(filepath.Join(proc, "driver/nvidia/capabilities/gpu2/mig")); err != nil || len(entries) != 0 {
		t.Errorf("capabilities left on GPU 2: %v, %v", entries, err)
	}
}

func gpuUUID(t *testing.T, i int) string {
	t.Helper()
	p, err := LoadProfile(profilePath("dgx-h100-mig"))
	if err != nil {
		t.Fatal(err)
	}
	return p.GPUs[i].UUID
}

func initChild(t *testing.T) (gonvml.Interface, gonvml.Device) {
	t.Helper()
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { lib.Shutdown() })
	d, ret := lib.DeviceGetHandleByIndex(emptyGPU)
	if ret != gonvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex: %v", ret)
	}
	return lib, d
}

func TestChildMIGStateA(t *testing.T) {
	childOnly(t)
	_, d := initChild(t)
	awaitLine(t) // the parent has paused compute instance creation
	gi, ci := createMIG(t, d, 9, 4)
	// B made a 2g.20gb MIG device while this process waited.
	if _, ret := d.GetGpuInstanceById(3); ret != gonvml.SUCCESS {
		t.Errorf("B's gi3: %v", ret)
	}
	if _, k := migDeviceOf(t, d, 2, 0); k != 1 {
		t.Errorf("A's MIG device index %d, want 1 (B's is 0)", k)
	}
	if info, ret := ci.GetInfo(); ret != gonvml.SUCCESS || info.GpuInstance != gi {
		t.Errorf("ComputeInstance.GetInfo = %+v, %v", info, ret)
	}
}

func TestChildMIGStateB(t *testing.T) {
	childOnly(t)
	_, d := initChild(t)
	gi, ret := d.GetGpuInstanceById(2)
	if ret != gonvml.SUCCESS {
		t.Fatalf("A's gi2: %v", ret)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("A's gi2 has no compute instance yet, but MIG device 0 is %v", ret)
	}
	if info, ret := gi.GetInfo(); ret != gonvml.SUCCESS || info.Placement != (gonvml.GpuInstancePlacement{Start: 4, Size: 4}) {
		t.Errorf("A's gi2: %+v, %v", info, ret)
	}
	info := giInfo(t, d, 9)
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: 4, Size: 4}); ret != gonvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("a 3g.40gb where A's is = %v, want INSUFFICIENT_RESOURCES", ret)
	}
	createMIG(t, d, 14, 0)
	if _, k := migDeviceOf(t, d, 3, 0); k != 0 {
		t.Errorf("B's MIG device index %d, want 0", k)
	}
}

func TestChildMIGStateC(t *testing.T) {
	childOnly(t)
	_, d := initChild(t)
	awaitLine(t)
	// Memory slices 0 and 1 are B's 2g.20gb, 4 to 7 A's 3g.40gb: a 1g.10gb at 2:1 is gi9.
	info := giInfo(t, d, 19)
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: 2, Size: 1})
	if ret != gonvml.SUCCESS {
		t.Fatalf("CreateGpuInstanceWithPlacement: %v", ret)
	}
	ciInfo := fullCI(t, gi)
	gi.CreateComputeInstance(&ciInfo) // paused until the parent kills this process
	t.Error("the compute instance creation returned")
}

func TestChildMIGStateD(t *testing.T) {
	childOnly(t)
	lib, d := initChild(t)
	var uuids []string
	for k := range MaxMIGDevices {
		if m, ret := d.GetMigDeviceHandleByIndex(k); ret == gonvml.SUCCESS {
			u, _ := m.GetUUID()
			uuids = append(uuids, u)
		}
	}
	if len(uuids) != 2 {
		t.Errorf("MIG devices %v, want A's and B's", uuids)
	}
	for _, u := range uuids {
		if m, ret := lib.DeviceGetHandleByUUID(u); ret != gonvml.SUCCESS || !migUUID.MatchString(u) {
			t.Errorf("DeviceGetHandleByUUID(%s) = %v, %v", u, m, ret)
		}
	}
	// C's GPU instance is there, without a compute instance.
	orphan, ret := d.GetGpuInstanceById(9)
	if ret != gonvml.SUCCESS {
		t.Fatalf("C's gi9: %v", ret)
	}
	if cis, ret := orphan.GetComputeInstances(ptr(fullCI(t, orphan))); ret != gonvml.SUCCESS || len(cis) != 0 {
		t.Errorf("C's gi9 compute instances: %v, %v", cis, ret)
	}
	for _, p := range GIProfiles {
		info := giInfo(t, d, p.ID)
		gis, ret := d.GetGpuInstances(&info)
		if ret != gonvml.SUCCESS {
			t.Fatalf("GetGpuInstances(%d): %v", p.ID, ret)
		}
		for _, gi := range gis {
			ciInfo := fullCI(t, gi)
			cis, _ := gi.GetComputeInstances(&ciInfo)
			for _, ci := range cis {
				if ret := ci.Destroy(); ret != gonvml.SUCCESS {
					t.Errorf("ComputeInstance.Destroy: %v", ret)
				}
			}
			if ret := gi.Destroy(); ret != gonvml.SUCCESS {
				t.Errorf("GpuInstance.Destroy: %v", ret)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestMIGStateFile starts the library on a state file written by hand,
// changes it under a running process, and breaks it.
func TestMIGStateFile(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildMIGStateFile", "MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"),
		"MOCK_NVML_MIG_STATE="+filepath.Join(dir, "state"))
}

func TestChildMIGStateFile(t *testing.T) {
	childOnly(t)
	path := os.Getenv("MOCK_NVML_MIG_STATE")
	write := func(text string) {
		t.Helper()
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	gpu0, gpu2 := gpuUUID(t, 0), gpuUUID(t, 2)
	// GPU 0 emptied; GPU 2 a 7g.80gb whose MIG device has index 3.
	write(fmt.Sprintf(`version 1
counter 41
gpu uuid=%s
gpu uuid=%s future=kept
gi id=0 profile=0 start=0 size=8 shiny=1
ci gi=0 id=0 profile=4 start=0 size=7 index=3 uuid=MIG-11111111-2222-5333-8444-555555555555
`, gpu0, gpu2))
	lib, d := initChild(t)
	d0, _ := lib.DeviceGetHandleByIndex(0)
	d1, _ := lib.DeviceGetHandleByIndex(1)
	if _, ret := d0.GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("GPU 0, emptied by the file: MIG device 0 = %v, want NOT_FOUND", ret)
	}
	if _, ret := d1.GetMigDeviceHandleByIndex(6); ret != gonvml.SUCCESS {
		t.Errorf("GPU 1, not in the file: MIG device 6 = %v, want the profile's", ret)
	}
	m, ret := d.GetMigDeviceHandleByIndex(3)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GPU 2 MIG device 3: %v", ret)
	}
	name, _ := m.GetName()
	a, _ := m.GetAttributes()
	if uuid, _ := m.GetUUID(); uuid != "MIG-11111111-2222-5333-8444-555555555555" || !strings.HasSuffix(name, " MIG 7g.80gb") || a.MultiprocessorCount != 132 {
		t.Errorf("GPU 2 MIG device 3: %s %q %+v", uuid, name, a)
	}
	gi, _ := d.GetGpuInstanceById(0)

	// Another process's change: read at the next call, handles of what stays kept.
	write(fmt.Sprintf("version 1\ncounter 41\ngpu uuid=%s\ngi id=0 profile=0 start=0 size=8\n", gpu2))
	if _, ret := d.GetMigDeviceHandleByIndex(3); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device 3 after the file dropped it = %v, want NOT_FOUND", ret)
	}
	if _, ret := m.GetUUID(); ret != gonvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("its handle = %v, want INVALID_ARGUMENT", ret)
	}
	if again, ret := d.GetGpuInstanceById(0); ret != gonvml.SUCCESS || again != gi {
		t.Errorf("gi0 after the change: %v, %v; want the same handle", again, ret)
	}
	if _, ret := d0.GetMigDeviceHandleByIndex(0); ret != gonvml.SUCCESS {
		t.Errorf("GPU 0, no longer in the file: MIG device 0 = %v, want the profile's", ret)
	}
	// A creation keeps the counter going.
	ciInfo := fullCI(t, gi)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != gonvml.SUCCESS {
		t.Fatalf("CreateComputeInstance: %v", ret)
	}
	st, err := LoadMIGState(path)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := st.GPU(gpu2); st.Counter != 42 || len(st.GPUs) != 1 || len(g.ComputeInstances) != 1 ||
		g.ComputeInstances[0].Name != "7g.80gb" || g.ComputeInstances[0].Index != 0 {
		t.Errorf("state after a creation: %+v", st)
	}

	// A broken file is reported and ignored by a running process, and fails nvmlInit.
	write("version 1\ngpu uuid=GPU-nowhere\n")
	if _, ret := d.GetMigDeviceHandleByIndex(0); ret != gonvml.SUCCESS {
		t.Errorf("after a broken state file: MIG device 0 = %v, want the instances read before", ret)
	}
	lib.Shutdown()
	if ret := lib.Init(); ret != gonvml.ERROR_UNKNOWN {
		t.Errorf("Init on a broken state file = %v, want UNKNOWN", ret)
		lib.Shutdown()
	}
	for _, bad := range []string{
		"gpu uuid=" + gpu2 + "\n",
		"version 2\n",
		fmt.Sprintf("version 1\ngpu uuid=%s\n", gpuUUID(t, 5)),
		fmt.Sprintf("version 1\ngpu uuid=%s\ngi id=3 profile=9 start=0 size=4\n", gpu2),
		fmt.Sprintf("version 1\ngpu uuid=%s\ngi id=1 profile=9 start=0 size=4\ngi id=3 profile=14 start=0 size=2\n", gpu2),
		fmt.Sprintf("version 1\ngpu uuid=%s\nci gi=1 id=0 profile=2 start=0 size=3 index=0 uuid=MIG-x\n", gpu2),
		fmt.Sprintf("version 1\ngpu uuid=%s\ngi id=1 profile=9 start=0 size=4\nci gi=1 id=0 profile=3 start=0 size=4 index=0 uuid=MIG-x\n", gpu2),
	} {
		write(bad)
		if ret := lib.Init(); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("Init on state %q = %v, want UNKNOWN", bad, ret)
			lib.Shutdown()
		}
	}
	// Without a file: the profile's instances.
	os.Remove(path)
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init without a state file: %v", ret)
	}
	if _, ret := d0.GetMigDeviceHandleByIndex(0); ret != gonvml.SUCCESS {
		t.Errorf("GPU 0 without a state file: %v", ret)
	}
}

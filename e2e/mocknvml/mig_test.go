package mocknvml

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvcaps"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

func TestLoadProfileMIG(t *testing.T) {
	p, err := LoadProfile(profilePath("dgx-h100-mig"))
	if err != nil {
		t.Fatal(err)
	}
	var counts []int
	for _, g := range p.GPUs {
		counts = append(counts, len(g.MIGDevices))
	}
	if want := []int{3, 7, 0, 2, 0, 0, 0, 0}; !slices.Equal(counts, want) {
		t.Errorf("MIG devices per GPU = %v, want %v", counts, want)
	}
	for i, mode := range []string{"on", "on", "on", "on", "off", "off", "off", "off"} {
		if p.GPUs[i].MIG != mode {
			t.Errorf("GPU %d: MIG %q, want %q", i, p.GPUs[i].MIG, mode)
		}
	}
	want := []MIGDevice{
		{GPU: 0, Index: 0, UUID: "MIG-2769e927-e4bf-4564-8537-2ef440e5c51e", GPUInstance: 2, Profile: "3g.40gb",
			GIProfileIndex: 2, GIProfileID: 9, GIStart: 4, Slices: 3, CISlices: 3, MemoryMiB: 40192, Multiprocessors: 60, GICapMinor: 21, CICapMinor: 22},
		{GPU: 0, Index: 1, UUID: "MIG-a1865506-aadb-4831-9b25-f81fcec1496e", GPUInstance: 3, Profile: "2g.20gb",
			GIProfileIndex: 1, GIProfileID: 14, GIStart: 0, Slices: 2, CISlices: 2, MemoryMiB: 20096, Multiprocessors: 32, GICapMinor: 30, CICapMinor: 31},
		{GPU: 0, Index: 2, UUID: "MIG-994395a7-74f0-447f-b6f8-7a640701ad82", GPUInstance: 4, Profile: "2g.20gb",
			GIProfileIndex: 1, GIProfileID: 14, GIStart: 2, Slices: 2, CISlices: 2, MemoryMiB: 20096, Multiprocessors: 32, GICapMinor: 39, CICapMinor: 40},
	}
	if got := p.GPUs[0].MIGDevices; !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 0 MIG devices:\n got %+v\nwant %+v", got, want)
	}
	// GPU 3 (minor 3): its 1c.3g.40gb is compute instance 0 of GPU instance 1.
	m := p.GPUs[3].MIGDevices[1]
	if m.Profile != "1c.3g.40gb" || m.Slices != 3 || m.CISlices != 1 || m.GIProfileIndex != 2 || m.GIProfileID != 9 ||
		!slices.Equal(m.CapMinors(), []int{3 + 3*135 + 9, 3 + 3*135 + 9 + 1}) || m.MemoryBytes() != 40192<<20 {
		t.Errorf("GPU 3 MIG device 1 = %+v", m)
	}
}

func TestCapMinors(t *testing.T) {
	// The driver's mig-minors table: config 1, monitor 2, gpu0/gi0/access 3,
	// its ci0..ci7 4..11, gpu0/gi1/access 12, ..., gpu1/gi0/access 138.
	for _, c := range []struct{ got, want int }{
		{GICapMinor(0, 0), 3}, {CICapMinor(0, 0, 0), 4}, {CICapMinor(0, 0, 7), 11},
		{GICapMinor(0, 1), 12}, {CICapMinor(0, 14, 7), 137}, {GICapMinor(1, 0), 138},
	} {
		if c.got != c.want {
			t.Errorf("minor %d, want %d", c.got, c.want)
		}
	}
}

func TestWriteProcAndCapNodes(t *testing.T) {
	p, err := LoadProfile(profilePath("dgx-h100-mig"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := p.WriteProc(filepath.Join(root, "proc")); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteDev(filepath.Join(root, "dev")); err != nil {
		t.Fatal(err)
	}
	caps := filepath.Join(root, "proc", "driver", "nvidia", "capabilities")
	var files []string
	err = filepath.WalkDir(caps, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(caps, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Two global caps, then per GPU instance its access and each of its compute instances'.
	// GPU 0: 3 GIs with one CI each (6), GPU 1: 7 (14), GPU 3: 2 (4); GPU 2 has none.
	if len(files) != 2+6+14+4 {
		t.Errorf("%d capability files, want 26:\n%s", len(files), strings.Join(files, "\n"))
	}
	// The driver's majors, nvidia-caps' the fixture's nodes' (1:3).
	wantDevices := "Character devices:\n  1 nvidia-caps\n  1 nvidia-uvm\n195 nvidia\n195 nvidiactl\n\nBlock devices:\n"
	if b, err := os.ReadFile(filepath.Join(root, "proc", "devices")); err != nil || string(b) != wantDevices {
		t.Errorf("proc/devices = %q, %v; want %q", b, err, wantDevices)
	}
	minors := map[int]bool{}
	for path, want := range map[string]string{
		"mig/config":               "DeviceFileMinor: 1\nDeviceFileMode: 400\n",
		"mig/monitor":              "DeviceFileMinor: 2\nDeviceFileMode: 444\n",
		"gpu0/mig/gi2/access":      "DeviceFileMinor: 21\nDeviceFileMode: 444\n",
		"gpu0/mig/gi2/ci0/access":  "DeviceFileMinor: 22\nDeviceFileMode: 444\n",
		"gpu1/mig/gi13/access":     fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 444\n", 3+135+13*9),
		"gpu1/mig/gi13/ci0/access": fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 444\n", 3+135+13*9+1),
		"gpu3/mig/gi1/ci0/access":  fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 444\n", 3+3*135+9+1),
		"gpu3/mig/gi13/ci0/access": fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 444\n", 3+3*135+13*9+1),
	} {
		b, err := os.ReadFile(filepath.Join(caps, path))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(caps, "gpu2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gpu2 (MIG on, no instances) has capabilities: %v", err)
	}
	// Every minor the tree names has its /dev/nvidia-caps node.
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(caps, f))
		if err != nil {
			t.Fatal(err)
		}
		var minor int
		if _, err := fmt.Sscanf(string(b), "DeviceFileMinor: %d", &minor); err != nil {
			t.Fatalf("%s: %q: %v", f, b, err)
		}
		if minors[minor] {
			t.Errorf("%s: minor %d is also another capability's", f, minor)
		}
		minors[minor] = true
		if _, err := os.Stat(filepath.Join(root, "dev", "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minor))); err != nil {
			t.Errorf("%s: no device node: %v", f, err)
		}
	}
	nodes, err := os.ReadDir(filepath.Join(root, "dev", "nvidia-caps"))
	if err != nil || len(nodes) != len(files) {
		t.Errorf("dev/nvidia-caps holds %d nodes (%v), want %d", len(nodes), err, len(files))
	}
}

func TestMIG(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildMIG",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"))
}

// TestChildMIG reads the MIG devices of dgx-h100-mig through go-nvml's real
// binding, then injects faults that reach them through their parents.
func TestChildMIG(t *testing.T) {
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
	inject := func(t *testing.T, line string) {
		t.Helper()
		if err := ctl.Inject(line); err != nil {
			t.Fatal(err)
		}
	}

	h := make([]gonvml.Device, len(prof.GPUs))
	for i := range h {
		var ret gonvml.Return
		if h[i], ret = lib.DeviceGetHandleByIndex(i); ret != gonvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
	}
	// mig[i][k] is GPU i's MIG device k.
	mig := make([][]gonvml.Device, len(prof.GPUs))

	t.Run("MIG devices enumerate as the profile says", func(t *testing.T) {
		seen := map[gonvml.Device]string{}
		for i, g := range prof.GPUs {
			seen[h[i]] = g.UUID
			max, ret := h[i].GetMaxMigDeviceCount()
			wantMax := map[string]int{"on": 7, "off": 0}[g.MIG]
			if ret != gonvml.SUCCESS || max != wantMax {
				t.Errorf("GPU %d: GetMaxMigDeviceCount = %d, %v; want %d", i, max, ret, wantMax)
			}
			for k := range 7 {
				d, ret := h[i].GetMigDeviceHandleByIndex(k)
				switch {
				case g.MIG == "off":
					if ret != gonvml.ERROR_INVALID_ARGUMENT {
						t.Errorf("GPU %d (MIG off): GetMigDeviceHandleByIndex(%d) = %v, want INVALID_ARGUMENT", i, k, ret)
					}
					continue
				case k >= len(g.MIGDevices):
					if ret != gonvml.ERROR_NOT_FOUND {
						t.Errorf("GPU %d: GetMigDeviceHandleByIndex(%d), an empty slot: %v, want NOT_FOUND", i, k, ret)
					}
					continue
				case ret != gonvml.SUCCESS:
					t.Fatalf("GPU %d: GetMigDeviceHandleByIndex(%d): %v", i, k, ret)
				}
				m := g.MIGDevices[k]
				if other, dup := seen[d]; dup {
					t.Errorf("GPU %d MIG %d: handle is also %s's", i, k, other)
				}
				seen[d] = m.UUID
				mig[i] = append(mig[i], d)
				checkMIGDevice(t, lib, h[i], d, g, m)
			}
			if g.MIG == "on" {
				if _, ret := h[i].GetMigDeviceHandleByIndex(7); ret != gonvml.ERROR_INVALID_ARGUMENT {
					t.Errorf("GPU %d: GetMigDeviceHandleByIndex(7) = %v, want INVALID_ARGUMENT", i, ret)
				}
			}
		}
		// The same slot gives the same handle again, so handles compare.
		if d, _ := h[1].GetMigDeviceHandleByIndex(6); d != mig[1][6] {
			t.Errorf("a second GetMigDeviceHandleByIndex gave another handle")
		}
	})

	t.Run("GPU handles answer as whole GPUs", func(t *testing.T) {
		for i, d := range h {
			if is, ret := d.IsMigDeviceHandle(); ret != gonvml.SUCCESS || is {
				t.Errorf("GPU %d: IsMigDeviceHandle = %v, %v", i, is, ret)
			}
			if _, ret := d.GetGpuInstanceId(); ret != gonvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("GPU %d: GetGpuInstanceId = %v, want INVALID_ARGUMENT", i, ret)
			}
			if _, ret := d.GetComputeInstanceId(); ret != gonvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("GPU %d: GetComputeInstanceId = %v, want INVALID_ARGUMENT", i, ret)
			}
			if _, ret := d.GetDeviceHandleFromMigDeviceHandle(); ret != gonvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("GPU %d: GetDeviceHandleFromMigDeviceHandle = %v, want INVALID_ARGUMENT", i, ret)
			}
			if _, ret := d.GetAttributes(); ret != gonvml.ERROR_NOT_SUPPORTED {
				t.Errorf("GPU %d: GetAttributes = %v, want NOT_SUPPORTED (MIG devices only)", i, ret)
			}
		}
		if _, ret := h[5].GetGpuInstanceById(0); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetGpuInstanceById on a MIG-off GPU = %v, want NOT_SUPPORTED", ret)
		}
		if _, ret := h[0].GetGpuInstanceById(5); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("GetGpuInstanceById of no instance = %v, want NOT_FOUND", ret)
		}
		if _, ret := h[2].GetGpuInstanceById(0); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("GetGpuInstanceById on a GPU with no instances = %v, want NOT_FOUND", ret)
		}
		// Calls that are a whole GPU's refuse a MIG handle.
		if _, ret := mig[0][0].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetTemperature on a MIG device = %v, want NOT_SUPPORTED", ret)
		}
		if _, ret := mig[0][0].GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetMigDeviceHandleByIndex on a MIG device = %v, want NOT_SUPPORTED", ret)
		}
	})

	t.Run("GPU instance profiles answer by index with the driver's IDs", func(t *testing.T) {
		for i, g := range prof.GPUs {
			for index := range giProfileCount + 1 {
				p, offered := giProfile(index)
				want := gonvml.GpuInstanceProfileInfo{
					Id: uint32(p.ID), SliceCount: uint32(p.Slices), InstanceCount: uint32(p.Instances),
					MemorySizeMB: g.MemoryMiB * uint64(p.Eighths) / 8,
				}
				wantRet := gonvml.SUCCESS
				switch {
				case index == giProfileCount:
					wantRet = gonvml.ERROR_INVALID_ARGUMENT
				case g.MIG != "on" || !offered:
					wantRet, want = gonvml.ERROR_NOT_SUPPORTED, gonvml.GpuInstanceProfileInfo{}
				}
				if got, ret := h[i].GetGpuInstanceProfileInfo(index); ret != wantRet || (ret == gonvml.SUCCESS && got != want) {
					t.Errorf("GPU %d: GetGpuInstanceProfileInfo(%d) = %+v, %v; want %+v, %v", i, index, got, ret, want, wantRet)
				}
				v2, ret := h[i].GetGpuInstanceProfileInfoV(index).V2()
				if ret != wantRet || (ret == gonvml.SUCCESS && (v2.Id != want.Id || v2.SliceCount != want.SliceCount || v2.MemorySizeMB != want.MemorySizeMB)) {
					t.Errorf("GPU %d: GetGpuInstanceProfileInfoV(%d).V2() = %+v, %v; want %+v, %v", i, index, v2, ret, want, wantRet)
				}
				v3, ret := h[i].GetGpuInstanceProfileInfoV(index).V3()
				if ret != wantRet || (ret == gonvml.SUCCESS && (v3.Id != want.Id || v3.SliceCount != want.SliceCount || v3.MemorySizeMB != want.MemorySizeMB)) {
					t.Errorf("GPU %d: GetGpuInstanceProfileInfoV(%d).V3() = %+v, %v; want %+v, %v", i, index, v3, ret, want, wantRet)
				}
			}
		}
		if _, ret := mig[0][0].GetGpuInstanceProfileInfo(gonvml.GPU_INSTANCE_PROFILE_1_SLICE); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetGpuInstanceProfileInfo on a MIG device = %v, want NOT_SUPPORTED", ret)
		}
	})

	set, ret := lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	defer set.Free()
	for _, i := range []int{0, 1, 4} {
		if ret := h[i].RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			t.Fatalf("GPU %d: RegisterEvents: %v", i, ret)
		}
	}
	if ret := mig[0][0].RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.ERROR_NOT_SUPPORTED {
		t.Errorf("RegisterEvents on a MIG device = %v, want NOT_SUPPORTED (events come on the parent)", ret)
	}

	t.Run("an XID on an instance arrives on the parent with its ids", func(t *testing.T) {
		const none = 0xFFFFFFFF
		for _, c := range []struct {
			cmd     string
			gpu     int
			xid     uint64
			gi, ci  uint32
			comment string
		}{
			{"xid 0 31 2 0", 0, 31, 2, 0, "a compute instance"},
			{"xid 1 43 9", 1, 43, 9, none, "a GPU instance, all its compute instances"},
			{"xid 0 13", 0, 13, none, none, "the whole GPU"},
			{"xid 4 48", 4, 48, none, none, "a MIG-off GPU"},
		} {
			inject(t, c.cmd)
			got, ret := set.Wait(5000)
			if ret != gonvml.SUCCESS || got.Device != h[c.gpu] || got.EventData != c.xid ||
				got.GpuInstanceId != c.gi || got.ComputeInstanceId != c.ci {
				t.Errorf("%s (%s): event %+v, %v; want XID %d on GPU %d, instance %#x/%#x",
					c.cmd, c.comment, got, ret, c.xid, c.gpu, c.gi, c.ci)
			}
		}
		for line, reason := range map[string]string{
			"xid 0 31 5":     "gpu 0 has no GPU instance 5",
			"xid 0 31 2 1":   "gpu 0 has no compute instance 1 in GPU instance 2",
			"xid 4 31 1":     "gpu 4 has no GPU instance 1",
			"xid 2 31 0":     "gpu 2 has no GPU instance 0",
			"xid 0 31 15":    "usage: xid <index> <code> [<gi> [<ci>]]",
			"xid 0 31 2 x":   "usage: xid",
			"xid 0 31 2 0 0": "usage: xid",
		} {
			if err := ctl.Inject(line); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), reason) {
				t.Errorf("Inject(%q) = %v, want ErrRejected saying %q", line, err, reason)
			}
		}
		if got, ret := set.Wait(0); ret != gonvml.ERROR_TIMEOUT {
			t.Errorf("a rejected command queued %+v", got)
		}
	})

	t.Run("a lost parent makes its MIG devices lost", func(t *testing.T) {
		inject(t, "lost 1")
		if got, ret := set.Wait(5000); ret != gonvml.SUCCESS || got.EventData != 79 || got.GpuInstanceId != 0xFFFFFFFF {
			t.Errorf("event = %+v, %v; want XID 79 for the whole GPU", got, ret)
		}
		d := mig[1][3]
		if _, ret := d.GetUUID(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetUUID = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := d.GetGpuInstanceId(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetGpuInstanceId = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := d.GetMemoryInfo(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetMemoryInfo = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := d.GetDeviceHandleFromMigDeviceHandle(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetDeviceHandleFromMigDeviceHandle = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := h[1].GetMigDeviceHandleByIndex(0); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetMigDeviceHandleByIndex = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := lib.DeviceGetHandleByUUID(prof.GPUs[1].MIGDevices[3].UUID); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("DeviceGetHandleByUUID of its MIG device = %v, want GPU_IS_LOST", ret)
		}
		if _, ret := mig[0][0].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GPU 0's MIG device: GetUUID = %v", ret)
		}
		inject(t, "recover 1")
		if uuid, ret := d.GetUUID(); ret != gonvml.SUCCESS || uuid != prof.GPUs[1].MIGDevices[3].UUID {
			t.Errorf("GetUUID after recover = %q, %v", uuid, ret)
		}
	})

	t.Run("fail and transient reach MIG devices", func(t *testing.T) {
		gi, ret := h[0].GetGpuInstanceById(2)
		if ret != gonvml.SUCCESS {
			t.Fatalf("GetGpuInstanceById: %v", ret)
		}
		inject(t, "fail")
		if _, ret := mig[0][1].GetGpuInstanceId(); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("GetGpuInstanceId while failing = %v, want UNKNOWN", ret)
		}
		if _, ret := gi.GetInfo(); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("GpuInstance.GetInfo while failing = %v, want UNKNOWN", ret)
		}
		inject(t, "unfail")
		inject(t, "transient 3 1")
		if _, ret := mig[3][0].GetAttributes(); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("GetAttributes in a transient fault = %v, want UNKNOWN", ret)
		}
		if _, ret := mig[3][0].GetAttributes(); ret != gonvml.SUCCESS {
			t.Errorf("GetAttributes after the transient fault = %v", ret)
		}
	})
}

// TestMIGNames: through the versioned profile-info call, and through the
// old one on an R470-era driver.
func TestMIGNames(t *testing.T) {
	t.Run("current", func(t *testing.T) {
		runChild(t, "TestChildMIGNames", "MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"))
	})
	t.Run("R470", func(t *testing.T) {
		runChild(t, "TestChildMIGNames", envLib+"="+testLibR470(t), "MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"))
	})
}

// TestChildMIGNames runs the plugin's discovery on dgx-h100-mig, where
// profile IDs are not indices as on a real H100 (a 2g.20gb is ID 14, the
// index of 2_SLICE_NO_ME), and checks the names both front-ends serve:
// the device plugin's mixed-strategy resources and DRA's profile attribute.
func TestChildMIGNames(t *testing.T) {
	childOnly(t)
	prof, err := LoadProfile(os.Getenv("MOCK_NVML_PROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	procRoot, sysfsRoot := t.TempDir(), t.TempDir()
	if err := prof.WriteProc(procRoot); err != nil {
		t.Fatal(err)
	}
	if err := prof.WriteSysfs(sysfsRoot); err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.Open(os.Getenv(envLib))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer lib.Shutdown()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	inv, err := nvml.Discover(lib, sysfsRoot, log)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("discovery warned:\n%s", logs.String())
	}
	gpus := nvcaps.AddMIG(procRoot, inv.GPUs, log)

	// Every MIG device has the name the profile gives it.
	for i, g := range gpus {
		var got, want []string
		for _, m := range g.MIG {
			got = append(got, m.Profile)
		}
		for _, m := range prof.GPUs[i].MIGDevices {
			want = append(want, m.Profile)
		}
		if !slices.Equal(got, want) {
			t.Errorf("GPU %d MIG profiles %v, want %v", i, got, want)
		}
	}

	layout, err := gpu.Layout(gpus, gpu.MIGMixed, gpu.Sharings{}, log)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, sv := range layout {
		counts[sv.Name] = len(sv.Units)
	}
	wantCounts := map[string]int{
		resname.GPU:                 4,
		"nvidia.com/mig-3g.40gb":    1,
		"nvidia.com/mig-2g.20gb":    2,
		"nvidia.com/mig-1g.10gb":    7,
		"nvidia.com/mig-1g.10gb.me": 1,
		"nvidia.com/mig-1c.3g.40gb": 1,
	}
	if !reflect.DeepEqual(counts, wantCounts) {
		t.Errorf("mixed-strategy resources %v, want %v", counts, wantCounts)
	}

	devices := draslice.GPUDevices(draslice.GPUs{GPUs: gpus, Topology: inv.Topology}, t.TempDir(),
		func(uuid string) string { return "nvidia.com/gpu=" + uuid }, log)
	profiles := map[string]int{}
	for _, d := range devices {
		if p := d.Attributes["profile"].String; d.Type == draslice.TypeMIG && p != nil {
			profiles[*p]++
		}
	}
	wantProfiles := map[string]int{"3g.40gb": 1, "2g.20gb": 2, "1g.10gb": 7, "1g.10gb+me": 1, "1c.3g.40gb": 1}
	if !reflect.DeepEqual(profiles, wantProfiles) {
		t.Errorf("DRA MIG devices by profile %v, want %v", profiles, wantProfiles)
	}
}

// checkMIGDevice checks what NVML answers on one MIG device handle d of parent.
func checkMIGDevice(t *testing.T, lib gonvml.Interface, parent, d gonvml.Device, g GPU, m MIGDevice) {
	t.Helper()
	where := fmt.Sprintf("GPU %d MIG %d (%s)", g.Index, m.Index, m.Profile)
	if is, ret := d.IsMigDeviceHandle(); ret != gonvml.SUCCESS || !is {
		t.Errorf("%s: IsMigDeviceHandle = %v, %v", where, is, ret)
	}
	if p, ret := d.GetDeviceHandleFromMigDeviceHandle(); ret != gonvml.SUCCESS || p != parent {
		t.Errorf("%s: GetDeviceHandleFromMigDeviceHandle = %v, %v; want the parent", where, p, ret)
	}
	if uuid, ret := d.GetUUID(); ret != gonvml.SUCCESS || uuid != m.UUID {
		t.Errorf("%s: GetUUID = %q, %v; want %s", where, uuid, ret, m.UUID)
	}
	if name, ret := d.GetName(); ret != gonvml.SUCCESS || name != g.Name+" MIG "+m.Profile {
		t.Errorf("%s: GetName = %q, %v", where, name, ret)
	}
	if gi, ret := d.GetGpuInstanceId(); ret != gonvml.SUCCESS || gi != m.GPUInstance {
		t.Errorf("%s: GetGpuInstanceId = %d, %v; want %d", where, gi, ret, m.GPUInstance)
	}
	if ci, ret := d.GetComputeInstanceId(); ret != gonvml.SUCCESS || ci != m.ComputeInstance {
		t.Errorf("%s: GetComputeInstanceId = %d, %v; want %d", where, ci, ret, m.ComputeInstance)
	}
	want := gonvml.DeviceAttributes{
		MultiprocessorCount: uint32(m.Multiprocessors), GpuInstanceSliceCount: uint32(m.Slices),
		ComputeInstanceSliceCount: uint32(m.CISlices), MemorySizeMB: m.MemoryMiB,
	}
	if a, ret := d.GetAttributes(); ret != gonvml.SUCCESS || a != want {
		t.Errorf("%s: GetAttributes = %+v, %v; want %+v", where, a, ret, want)
	}
	if mem, ret := d.GetMemoryInfo(); ret != gonvml.SUCCESS || mem.Total != m.MemoryBytes() || mem.Free != m.MemoryBytes() {
		t.Errorf("%s: GetMemoryInfo = %+v, %v", where, mem, ret)
	}
	if mem, ret := d.GetMemoryInfo_v2(); ret != gonvml.SUCCESS || mem.Total != m.MemoryBytes() {
		t.Errorf("%s: GetMemoryInfo_v2 = %+v, %v", where, mem, ret)
	}
	if byUUID, ret := lib.DeviceGetHandleByUUID(m.UUID); ret != gonvml.SUCCESS || byUUID != d {
		t.Errorf("%s: DeviceGetHandleByUUID = %v, %v; want its handle", where, byUUID, ret)
	}
	gi, ret := parent.GetGpuInstanceById(m.GPUInstance)
	if ret != gonvml.SUCCESS {
		t.Fatalf("%s: GetGpuInstanceById(%d): %v", where, m.GPUInstance, ret)
	}
	info, ret := gi.GetInfo()
	if ret != gonvml.SUCCESS || info.Device != parent || info.Id != uint32(m.GPUInstance) || info.ProfileId != uint32(m.GIProfileID) {
		t.Errorf("%s: GpuInstance.GetInfo = %+v, %v; want id %d profile %d on the parent", where, info, ret, m.GPUInstance, m.GIProfileID)
	}
	// A GPU instance's placement covers the eighths of memory it holds,
	// where its id says (ids follow placements, as the driver's do).
	if size := uint32((m.MemoryMiB*8 + g.MemoryMiB - 1) / g.MemoryMiB); info.Placement.Size != size || info.Placement.Start != uint32(m.GIStart) {
		t.Errorf("%s: placement %+v, want %d:%d", where, info.Placement, m.GIStart, size)
	}
	checkComputeInstance(t, where, parent, gi, m)
}

// checkComputeInstance checks MIG device m's compute instance in gi, as
// go-nvlib walks it for a MIG profile (what GFD labels).
func checkComputeInstance(t *testing.T, where string, parent gonvml.Device, gi gonvml.GpuInstance, m MIGDevice) {
	t.Helper()
	ciProfile := map[int]uint32{1: gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: gonvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}
	ci, ret := gi.GetComputeInstanceById(m.ComputeInstance)
	if ret != gonvml.SUCCESS {
		t.Fatalf("%s: GetComputeInstanceById(%d): %v", where, m.ComputeInstance, ret)
	}
	info, ret := ci.GetInfo()
	if ret != gonvml.SUCCESS || info.Device != parent || info.GpuInstance != gi || info.Id != uint32(m.ComputeInstance) ||
		info.ProfileId != ciProfile[m.CISlices] || info.Placement.Size != uint32(m.CISlices) || info.Placement.Start+info.Placement.Size > uint32(m.Slices) {
		t.Errorf("%s: ComputeInstance.GetInfo = %+v, %v; want id %d, profile %d, %d slices within %d", where, info, ret,
			m.ComputeInstance, ciProfile[m.CISlices], m.CISlices, m.Slices)
	}
	p, ret := gi.GetComputeInstanceProfileInfo(int(ciProfile[m.CISlices]), gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != gonvml.SUCCESS || p.Id != ciProfile[m.CISlices] || p.SliceCount != uint32(m.CISlices) || p.InstanceCount != uint32(m.Slices/m.CISlices) {
		t.Errorf("%s: GetComputeInstanceProfileInfo = %+v, %v; want id %d, %d slices", where, p, ret, ciProfile[m.CISlices], m.CISlices)
	}
	// 4c only in a 4- or 7-slice GPU instance, as a real GPU offers it.
	wantRet := gonvml.ERROR_NOT_SUPPORTED
	if m.Slices == 4 || m.Slices == 7 {
		wantRet = gonvml.SUCCESS
	}
	if _, ret := gi.GetComputeInstanceProfileInfo(gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret != wantRet {
		t.Errorf("%s: GetComputeInstanceProfileInfo(4_SLICE) in %d slices = %v, want %v", where, m.Slices, ret, wantRet)
	}
	for _, bad := range [][2]int{{gonvml.COMPUTE_INSTANCE_PROFILE_COUNT, 0}, {0, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT}} {
		if _, ret := gi.GetComputeInstanceProfileInfo(bad[0], bad[1]); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("%s: GetComputeInstanceProfileInfo(%d, %d) = %v, want INVALID_ARGUMENT", where, bad[0], bad[1], ret)
		}
	}
	if _, ret := gi.GetComputeInstanceById(7); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("%s: GetComputeInstanceById(7) = %v, want NOT_FOUND", where, ret)
	}
}

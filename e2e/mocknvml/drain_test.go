package mocknvml

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestDrainStates(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildDrainStates",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"),
		"MOCK_NVML_LOG="+filepath.Join(dir, "log"))
}

// pciOf is the PCI info the drain-state calls take, as GetPciInfo gives it.
func pciOf(t *testing.T, h gonvml.Device) *gonvml.PciInfo {
	t.Helper()
	pci, ret := h.GetPciInfo()
	if ret != gonvml.SUCCESS {
		t.Fatalf("GetPciInfo: %v", ret)
	}
	return &pci
}

func wantRet(t *testing.T, what string, got, want gonvml.Return) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func pidsOf(infos []gonvml.ProcessInfo) []uint32 {
	var out []uint32
	for _, p := range infos {
		out = append(out, p.Pid)
	}
	return out
}

func drainOn(t *testing.T, lib gonvml.Interface, pci *gonvml.PciInfo) {
	t.Helper()
	wantRet(t, "ModifyDrainState(on)", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_ENABLED), gonvml.SUCCESS)
}

func wantRecoveryAction(t *testing.T, h gonvml.Device, want gonvml.DeviceGpuRecoveryAction) {
	t.Helper()
	v := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := h.GetFieldValues(v); ret != gonvml.SUCCESS || v[0].NvmlReturn != uint32(gonvml.SUCCESS) {
		t.Fatalf("GetFieldValues: %v, field %d", ret, v[0].NvmlReturn)
	}
	if got := gonvml.DeviceGpuRecoveryAction(v[0].Value[0]); got != want {
		t.Errorf("recovery action = %d, want %d", got, want)
	}
}

// TestChildDrainStates drives processes, drain states, removal and
// rediscovery through go-nvml's real binding on dgx-h100. The steps share
// one library and run in order.
func TestChildDrainStates(t *testing.T) {
	childOnly(t)
	e := openFaultEnv(t)
	lib, h := e.lib, e.handles

	t.Run("processes are listed as injected, and cleared", func(t *testing.T) {
		if got, ret := h[2].GetComputeRunningProcesses(); ret != gonvml.SUCCESS || len(got) != 0 {
			t.Fatalf("compute processes of an idle GPU = %v, %v", got, ret)
		}
		e.inject(t, "procs 2 100:64,200,300")
		e.inject(t, "graphics-procs 2 200:16")
		got, ret := h[2].GetComputeRunningProcesses()
		if ret != gonvml.SUCCESS || !slices.Equal(pidsOf(got), []uint32{100, 200, 300}) || got[0].UsedGpuMemory != 64<<20 ||
			got[0].GpuInstanceId != 0xFFFFFFFF || got[0].ComputeInstanceId != 0xFFFFFFFF {
			t.Errorf("compute processes = %+v, %v; want 100 (64 MiB), 200, 300, no MIG instance", got, ret)
		}
		if got, ret := h[2].GetGraphicsRunningProcesses(); ret != gonvml.SUCCESS || !slices.Equal(pidsOf(got), []uint32{200}) || got[0].UsedGpuMemory != 16<<20 {
			t.Errorf("graphics processes = %+v, %v; want 200 (16 MiB)", got, ret)
		}
		if got, _ := h[1].GetComputeRunningProcesses(); len(got) != 0 {
			t.Errorf("GPU 1 lists %v, want none", got)
		}
		e.inject(t, "procs 2")
		e.inject(t, "graphics-procs 2")
		if got, ret := h[2].GetComputeRunningProcesses(); ret != gonvml.SUCCESS || len(got) != 0 {
			t.Errorf("compute processes after clearing = %v, %v", got, ret)
		}
		for line, reason := range map[string]string{
			"procs 2 0":     "not a list",
			"procs 2 5,5":   "no repeats",
			"procs 2 7:big": "not a list",
			"procs 9 1":     "no GPU 9",
		} {
			if err := e.ctl.Inject(line); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), reason) {
				t.Errorf("Inject(%q) = %v, want ErrRejected saying %q", line, err, reason)
			}
		}
	})

	t.Run("removal is refused while a process runs or the GPU is not draining", func(t *testing.T) {
		pci := pciOf(t, h[3])
		wantRet(t, "RemoveGpu_v2 without drain", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.ERROR_IN_USE)
		e.inject(t, "procs 3 77")
		drainOn(t, lib, pci)
		if st, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_ENABLED {
			t.Errorf("QueryDrainState = %v, %v; want enabled", st, ret)
		}
		wantRet(t, "RemoveGpu_v2 while busy", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.ERROR_IN_USE)
		if _, ret := h[3].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GPU 3 after a refused removal: %v", ret)
		}
		// Still draining, as nvml.h says of a refused removal.
		if st, _ := lib.DeviceQueryDrainState(pci); st != gonvml.FEATURE_ENABLED {
			t.Errorf("drain state after a refused removal = %v, want enabled", st)
		}
		wantRet(t, "ModifyDrainState(off)", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_DISABLED), gonvml.SUCCESS)
		e.inject(t, "procs 3")
		e.inject(t, "persistence 3 on")
		if m, ret := h[3].GetPersistenceMode(); ret != gonvml.SUCCESS || m != gonvml.FEATURE_ENABLED {
			t.Errorf("GetPersistenceMode = %v, %v; want enabled", m, ret)
		}
		wantRet(t, "ModifyDrainState with persistence mode on", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_ENABLED), gonvml.ERROR_IN_USE)
		e.inject(t, "persistence 3 off")
		e.inject(t, "unprivileged")
		wantRet(t, "ModifyDrainState without root", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_ENABLED), gonvml.ERROR_NO_PERMISSION)
		wantRet(t, "DiscoverGpus without root", func() gonvml.Return { _, ret := lib.DeviceDiscoverGpus(); return ret }(), gonvml.ERROR_NO_PERMISSION)
		e.inject(t, "privileged")
		wantRet(t, "ModifyDrainState of no GPU", lib.DeviceModifyDrainState(&gonvml.PciInfo{Domain: 0, Bus: 0x77}, gonvml.FEATURE_ENABLED), gonvml.ERROR_INVALID_ARGUMENT)
	})

	t.Run("a removed GPU leaves NVML's view; rediscovery brings it back reset", func(t *testing.T) {
		uuid, _ := h[4].GetUUID()
		pci := pciOf(t, h[4])
		e.inject(t, "temp 4 95")
		e.inject(t, "recovery 4 reset")
		wantEvent(t, e.all, h[4], gonvml.EventTypeGpuRecoveryAction, 0)
		e.inject(t, "remap 4 pending")
		wantRet(t, "SetComputeMode", h[4].SetComputeMode(gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS), gonvml.SUCCESS)
		drainOn(t, lib, pci)
		wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)

		if n, ret := lib.DeviceGetCount(); ret != gonvml.SUCCESS || n != 7 {
			t.Errorf("DeviceGetCount = %d, %v; want 7", n, ret)
		}
		if _, ret := lib.DeviceGetHandleByUUID(uuid); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("DeviceGetHandleByUUID of a removed GPU: %v, want NOT_FOUND", ret)
		}
		if _, ret := lib.DeviceGetHandleByPciBusId(string(cBytes(pci.BusId[:]))); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("DeviceGetHandleByPciBusId of a removed GPU: %v, want NOT_FOUND", ret)
		}
		if _, ret := h[4].GetUUID(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("old handle of a removed GPU: %v, want GPU_IS_LOST", ret)
		}
		// The enumeration closes up: GPU 5 is index 4 now.
		next, ret := lib.DeviceGetHandleByIndex(4)
		if u5, _ := h[5].GetUUID(); ret != gonvml.SUCCESS || next != h[5] {
			t.Errorf("DeviceGetHandleByIndex(4) = %v, %v; want GPU 5 (%s)", next, ret, u5)
		}
		if i, ret := h[7].GetIndex(); ret != gonvml.SUCCESS || i != 6 {
			t.Errorf("GPU 7's index = %d, %v; want 6", i, ret)
		}
		if _, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("QueryDrainState of a removed GPU: %v, want INVALID_ARGUMENT", ret)
		}
		// An XID during the reset reaches no one: the removal dropped the registrations.
		e.inject(t, "xid 4 79")
		wantNoEvent(t, e.all)

		_, ret = lib.DeviceDiscoverGpus()
		wantRet(t, "DiscoverGpus", ret, gonvml.SUCCESS)
		if n, _ := lib.DeviceGetCount(); n != 8 {
			t.Errorf("DeviceGetCount after rediscovery = %d, want 8", n)
		}
		back, ret := lib.DeviceGetHandleByUUID(uuid)
		if ret != gonvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByUUID after rediscovery: %v", ret)
		}
		if i, _ := back.GetIndex(); i != 4 {
			t.Errorf("index after rediscovery = %d, want 4", i)
		}
		checkHealth(t, back, 33, 0)
		wantRecoveryAction(t, back, gonvml.GPU_RECOVERY_ACTION_NONE)
		if _, _, pending, failure, ret := back.GetRemappedRows(); ret != gonvml.SUCCESS || pending || failure {
			t.Errorf("remapped rows after rediscovery: pending %v failure %v, %v", pending, failure, ret)
		}
		if m, _ := back.GetComputeMode(); m != gonvml.COMPUTEMODE_DEFAULT {
			t.Errorf("compute mode after rediscovery = %v, want default", m)
		}
		if st, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_DISABLED {
			t.Errorf("drain state after rediscovery = %v, %v; want disabled", st, ret)
		}
		// Its events come only to a set it is registered in again.
		e.inject(t, "xid 4 48")
		wantNoEvent(t, e.all)
		wantRet(t, "RegisterEvents", back.RegisterEvents(gonvml.EventTypeXidCriticalError, e.all), gonvml.SUCCESS)
		e.inject(t, "xid 4 48")
		wantEvent(t, e.all, back, gonvml.EventTypeXidCriticalError, 48)
	})

	t.Run("resetfail fails the next removal, then the next rediscovery", func(t *testing.T) {
		pci := pciOf(t, h[6])
		e.inject(t, "resetfail 6 remove")
		drainOn(t, lib, pci)
		wantRet(t, "RemoveGpu_v2 with resetfail", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.ERROR_UNKNOWN)
		if _, ret := h[6].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GPU 6 after a failed removal: %v", ret)
		}
		e.inject(t, "resetfail 6 discover")
		wantRet(t, "RemoveGpu (v1)", lib.DeviceRemoveGpu(pci), gonvml.SUCCESS)
		_, ret := lib.DeviceDiscoverGpus()
		wantRet(t, "DiscoverGpus with resetfail", ret, gonvml.ERROR_UNKNOWN)
		if n, _ := lib.DeviceGetCount(); n != 7 {
			t.Errorf("DeviceGetCount after a failed rediscovery = %d, want 7 (GPU 6 still removed)", n)
		}
		_, ret = lib.DeviceDiscoverGpus()
		wantRet(t, "DiscoverGpus again", ret, gonvml.SUCCESS)
		if _, ret := h[6].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GPU 6 after rediscovery: %v", ret)
		}
	})

	t.Run("comebackbroken leaves a recovery action after rediscovery", func(t *testing.T) {
		pci := pciOf(t, h[7])
		e.inject(t, "comebackbroken 7 reboot")
		drainOn(t, lib, pci)
		wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)
		_, ret := lib.DeviceDiscoverGpus()
		wantRet(t, "DiscoverGpus", ret, gonvml.SUCCESS)
		wantRecoveryAction(t, h[7], gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT)
		// Once: the next reset brings it back clean.
		drainOn(t, lib, pci)
		wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)
		_, ret = lib.DeviceDiscoverGpus()
		wantRet(t, "DiscoverGpus", ret, gonvml.SUCCESS)
		wantRecoveryAction(t, h[7], gonvml.GPU_RECOVERY_ACTION_NONE)
	})

	t.Run("the log records each step", func(t *testing.T) {
		b, err := os.ReadFile(os.Getenv("MOCK_NVML_LOG"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"nvmlDeviceRemoveGpu_v2: gpu 3: processes are attached: IN_USE",
			"nvmlDeviceRemoveGpu_v2: gpu 3: it is not draining",
			"nvmlDeviceRemoveGpu_v2: gpu 4: removed",
			"xid: gpu 4 is removed",
			"nvmlDeviceDiscoverGpus: gpu 4: rediscovered",
			"nvmlDeviceRemoveGpu_v2: gpu 6: failing as injected (resetfail)",
			"nvmlDeviceDiscoverGpus: gpu 7: rediscovered broken (comebackbroken)",
		} {
			if !strings.Contains(string(b), want) {
				t.Errorf("log lacks %q:\n%s", want, b)
			}
		}
	})
}

// cBytes is a NUL-terminated C char array's bytes.
func cBytes(b []int8) []byte {
	var out []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return out
}

func TestDrainStatesMIG(t *testing.T) {
	runChild(t, "TestChildDrainStatesMIG", "MOCK_NVML_PROFILE="+profilePath("dgx-h100-mig"))
}

// TestChildDrainStatesMIG: a rediscovered MIG GPU keeps MIG mode and has
// no instance left, as after a reset.
func TestChildDrainStatesMIG(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	h, ret := lib.DeviceGetHandleByIndex(0)
	wantRet(t, "DeviceGetHandleByIndex", ret, gonvml.SUCCESS)
	if _, ret := h.GetMigDeviceHandleByIndex(0); ret != gonvml.SUCCESS {
		t.Fatalf("the profile's MIG device 0: %v", ret)
	}
	pci := pciOf(t, h)
	drainOn(t, lib, pci)
	wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)
	if _, ret := lib.DeviceGetHandleByUUID("MIG-2769e927-e4bf-4564-8537-2ef440e5c51e"); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("a removed GPU's MIG device by UUID: %v, want NOT_FOUND", ret)
	}
	_, ret = lib.DeviceDiscoverGpus()
	wantRet(t, "DiscoverGpus", ret, gonvml.SUCCESS)
	if cur, _, ret := h.GetMigMode(); ret != gonvml.SUCCESS || cur != gonvml.DEVICE_MIG_ENABLE {
		t.Errorf("MIG mode after rediscovery = %d, %v; want enabled", cur, ret)
	}
	for k := range 7 {
		if _, ret := h.GetMigDeviceHandleByIndex(k); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("MIG device %d after rediscovery: %v, want NOT_FOUND (instances destroyed)", k, ret)
		}
	}
	if _, ret := lib.DeviceGetHandleByUUID("MIG-2769e927-e4bf-4564-8537-2ef440e5c51e"); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("a destroyed MIG device by UUID: %v, want NOT_FOUND", ret)
	}
}

func TestDrainStatesUnsupported(t *testing.T) {
	runChild(t, "TestChildDrainStatesUnsupported", "MOCK_NVML_PROFILE="+profilePath("vgpu-1gpu"))
	runChild(t, "TestChildProcessesR470", envLib+"="+testLibR470(t), "MOCK_NVML_PROFILE="+profilePath("pcie-4gpu"))
}

// TestChildDrainStatesUnsupported: a vGPU guest answers NOT_SUPPORTED to
// drain states (its profile says unsupported=drain).
func TestChildDrainStatesUnsupported(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	h, _ := lib.DeviceGetHandleByIndex(0)
	pci := pciOf(t, h)
	wantRet(t, "ModifyDrainState", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_ENABLED), gonvml.ERROR_NOT_SUPPORTED)
	wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.ERROR_NOT_SUPPORTED)
}

// TestChildProcessesR470: an R470 library lists processes through the
// v2 calls, which go-nvml picks there.
func TestChildProcessesR470(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	h, _ := lib.DeviceGetHandleByIndex(0)
	if got, ret := h.GetComputeRunningProcesses(); ret != gonvml.SUCCESS || len(got) != 0 {
		t.Errorf("GetComputeRunningProcesses = %v, %v; want none", got, ret)
	}
}

package mocknvml

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestResetPause stops a removal and a rediscovery in the middle with
// reset-pause, in one process.
func TestResetPause(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildResetPause",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"),
		"MOCK_NVML_LOG="+filepath.Join(dir, "log"))
}

// paused runs call in the background and checks it is stopped once
// WaitResetPaused says so; the returned channel gets its answer.
func paused(t *testing.T, ctl *Control, gpu int, call func() gonvml.Return) <-chan gonvml.Return {
	t.Helper()
	done := make(chan gonvml.Return, 1)
	go func() { done <- call() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ctl.WaitResetPaused(ctx, gpu); err != nil {
		t.Fatal(err)
	}
	select {
	case ret := <-done:
		t.Fatalf("the paused call returned %v", ret)
	default:
	}
	return done
}

func TestChildResetPause(t *testing.T) {
	childOnly(t)
	e := openFaultEnv(t)
	lib, h := e.lib, e.handles
	const gpu = 2
	pci := pciOf(t, h[gpu])
	remove := func() gonvml.Return {
		return lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP)
	}
	discover := func() gonvml.Return {
		_, ret := lib.DeviceDiscoverGpus()
		return ret
	}

	t.Run("a removal stops while the GPU drains, and goes on when resumed", func(t *testing.T) {
		drainOn(t, lib, pci)
		if err := e.ctl.PauseReset(gpu, ResetPauseRemove); err != nil {
			t.Fatal(err)
		}
		done := paused(t, e.ctl, gpu, remove)
		// Meanwhile the GPU is there, draining, and gets its events.
		if n, ret := lib.DeviceGetCount(); ret != gonvml.SUCCESS || n != 8 {
			t.Errorf("while the removal is paused: DeviceGetCount = %d, %v; want 8", n, ret)
		}
		if st, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_ENABLED {
			t.Errorf("while the removal is paused: drain state %v, %v; want on", st, ret)
		}
		e.inject(t, "xid 2 94")
		wantEvent(t, e.all, h[gpu], gonvml.EventTypeXidCriticalError, 94)
		e.inject(t, "recovery 2 reset")
		wantEvent(t, e.all, h[gpu], gonvml.EventTypeGpuRecoveryAction, 0)
		wantRecoveryAction(t, h[gpu], gonvml.GPU_RECOVERY_ACTION_GPU_RESET)
		if err := e.ctl.ResumeReset(gpu); err != nil {
			t.Fatal(err)
		}
		wantRet(t, "RemoveGpu_v2 after resume", <-done, gonvml.SUCCESS)
		if n, _ := lib.DeviceGetCount(); n != 7 {
			t.Errorf("after the removal: DeviceGetCount = %d, want 7", n)
		}
	})

	t.Run("a rediscovery stops while the GPU is removed, and goes on when resumed", func(t *testing.T) {
		if err := e.ctl.PauseReset(gpu, ResetPauseDiscover); err != nil {
			t.Fatal(err)
		}
		done := paused(t, e.ctl, gpu, discover)
		if n, ret := lib.DeviceGetCount(); ret != gonvml.SUCCESS || n != 7 {
			t.Errorf("while the rediscovery is paused: DeviceGetCount = %d, %v; want 7", n, ret)
		}
		if _, ret := h[gpu].GetUUID(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("while the rediscovery is paused: GetUUID on the old handle = %v, want GPU_IS_LOST", ret)
		}
		// Another GPU is reset meanwhile: only GPU 2's call waits.
		pci5 := pciOf(t, h[5])
		drainOn(t, lib, pci5)
		wantRet(t, "RemoveGpu_v2 of GPU 5", lib.DeviceRemoveGpu_v2(pci5, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)
		if err := e.ctl.ResumeReset(gpu); err != nil {
			t.Fatal(err)
		}
		wantRet(t, "DiscoverGpus after resume", <-done, gonvml.SUCCESS)
		if n, _ := lib.DeviceGetCount(); n != 8 {
			t.Errorf("after the rediscovery: DeviceGetCount = %d, want 8 (GPU 5 came back with it)", n)
		}
		wantRecoveryAction(t, h[gpu], gonvml.GPU_RECOVERY_ACTION_NONE)
		if st, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_DISABLED {
			t.Errorf("after the rediscovery: drain state %v, %v; want off", st, ret)
		}
	})

	t.Run("a process listed while a removal is paused makes it IN_USE", func(t *testing.T) {
		drainOn(t, lib, pci)
		if err := e.ctl.PauseReset(gpu, ResetPauseRemove); err != nil {
			t.Fatal(err)
		}
		done := paused(t, e.ctl, gpu, remove)
		e.inject(t, "procs 2 4242")
		if err := e.ctl.ResumeReset(gpu); err != nil {
			t.Fatal(err)
		}
		wantRet(t, "RemoveGpu_v2 with a process", <-done, gonvml.ERROR_IN_USE)
		e.inject(t, "procs 2")
		wantRet(t, "ModifyDrainState(off)", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_DISABLED), gonvml.SUCCESS)
	})

	t.Run("recover lets a paused removal go on; a resume before the call disarms the pause", func(t *testing.T) {
		drainOn(t, lib, pci)
		if err := e.ctl.PauseReset(gpu, ResetPauseRemove); err != nil {
			t.Fatal(err)
		}
		done := paused(t, e.ctl, gpu, remove)
		e.inject(t, "recover 2")
		wantRet(t, "RemoveGpu_v2 after recover", <-done, gonvml.SUCCESS)
		if err := e.ctl.PauseReset(gpu, ResetPauseDiscover); err != nil {
			t.Fatal(err)
		}
		if err := e.ctl.ResumeReset(gpu); err != nil {
			t.Fatal(err)
		}
		wantRet(t, "DiscoverGpus with the pause disarmed", discover(), gonvml.SUCCESS)
	})

	t.Run("bad commands are rejected", func(t *testing.T) {
		for line, reason := range map[string]string{
			"reset-pause 2 later": "usage: reset-pause",
			"reset-pause 9":       "no GPU 9",
			"reset-resume 2 now":  "usage: reset-resume",
			"reset-wait 2 1":      "no removal or rediscovery on gpu 2 paused within 1 ms",
		} {
			if err := e.ctl.Inject(line); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), reason) {
				t.Errorf("Inject(%q) = %v, want ErrRejected saying %q", line, err, reason)
			}
		}
	})
}

// TestDrainStateOutlivesProcess kills processes in the middle of a reset
// with MOCK_NVML_DRAIN_STATE set, as a plugin can be killed: the next
// process finds the GPU as the killed one left it, draining or removed.
func TestDrainStateOutlivesProcess(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "drain-state")
	common := []string{"MOCK_NVML_PROFILE=" + profilePath("dgx-h100"), "MOCK_NVML_DRAIN_STATE=" + state,
		"MOCK_NVML_LOG=" + filepath.Join(dir, "log")}
	prof, err := LoadProfile(profilePath("dgx-h100"))
	if err != nil {
		t.Fatal(err)
	}
	uuid := prof.GPUs[2].UUID
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killedIn := func(test string, at ResetStep) {
		t.Helper()
		ctl, err := OpenControl(filepath.Join(dir, "control-"+string(at)))
		if err != nil {
			t.Fatal(err)
		}
		defer ctl.Close()
		c, in, out := startChild(t, test, append(common, "MOCK_NVML_CONTROL="+ctl.Path())...)
		if err := ctl.PauseReset(2, at); err != nil {
			t.Fatal(err)
		}
		in.WriteString("go\n")
		if err := ctl.WaitResetPaused(ctx, 2); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if err := c.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		c.Wait()
	}
	wantFile := func(want string) {
		t.Helper()
		b, err := os.ReadFile(state)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for l := range strings.Lines(string(b)) {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if got := strings.Join(lines, "\n"); got != want {
			t.Errorf("MOCK_NVML_DRAIN_STATE holds %q, want %q", got, want)
		}
	}

	killedIn("TestChildResetKilled", ResetPauseRemove)
	wantFile("draining " + uuid)
	runChild(t, "TestChildFindsDraining", common...)
	wantFile("")
	killedIn("TestChildResetKilled", ResetPauseDiscover)
	wantFile("removed " + uuid)
	runChild(t, "TestChildFindsRemoved", common...)
	wantFile("")

	if err := os.WriteFile(state, []byte("removed GPU-nosuch\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runChild(t, "TestChildBadDrainState", common...)
	if !strings.Contains(out, "MOCK_NVML_DRAIN_STATE: line 1") {
		t.Errorf("the library did not say why it failed:\n%s", out)
	}
}

// initLib starts NVML in a child and returns GPU 2's handle.
func initLib(t *testing.T) (gonvml.Interface, gonvml.Device) {
	t.Helper()
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { lib.Shutdown() })
	h, ret := lib.DeviceGetHandleByIndex(2)
	if ret != gonvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(2): %v", ret)
	}
	return lib, h
}

// TestChildResetKilled resets GPU 2 and is killed where the parent paused it.
func TestChildResetKilled(t *testing.T) {
	childOnly(t)
	lib, h := initLib(t)
	pci := pciOf(t, h)
	awaitLine(t)
	drainOn(t, lib, pci)
	wantRet(t, "RemoveGpu_v2", lib.DeviceRemoveGpu_v2(pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP), gonvml.SUCCESS)
	lib.DeviceDiscoverGpus()
	t.Error("the reset returned")
}

// TestChildFindsDraining finds GPU 2 draining, and turns that off.
func TestChildFindsDraining(t *testing.T) {
	childOnly(t)
	lib, h := initLib(t)
	pci := pciOf(t, h)
	if st, ret := lib.DeviceQueryDrainState(pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_ENABLED {
		t.Errorf("drain state %v, %v; want on, as the killed process left it", st, ret)
	}
	wantRet(t, "ModifyDrainState(off)", lib.DeviceModifyDrainState(pci, gonvml.FEATURE_DISABLED), gonvml.SUCCESS)
}

// TestChildFindsRemoved finds GPU 2 removed, and brings it back.
func TestChildFindsRemoved(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	prof, err := LoadProfile(profilePath("dgx-h100"))
	if err != nil {
		t.Fatal(err)
	}
	if n, ret := lib.DeviceGetCount(); ret != gonvml.SUCCESS || n != 7 {
		t.Errorf("DeviceGetCount = %d, %v; want 7: GPU 2 is removed", n, ret)
	}
	if _, ret := lib.DeviceGetHandleByUUID(prof.GPUs[2].UUID); ret != gonvml.ERROR_NOT_FOUND {
		t.Errorf("GPU 2 by UUID: %v, want NOT_FOUND", ret)
	}
	if _, ret := lib.DeviceDiscoverGpus(); ret != gonvml.SUCCESS {
		t.Fatalf("DiscoverGpus: %v", ret)
	}
	h, ret := lib.DeviceGetHandleByUUID(prof.GPUs[2].UUID)
	if ret != gonvml.SUCCESS {
		t.Fatalf("GPU 2 by UUID after rediscovery: %v", ret)
	}
	if st, ret := lib.DeviceQueryDrainState(pciOf(t, h)); ret != gonvml.SUCCESS || st != gonvml.FEATURE_DISABLED {
		t.Errorf("drain state after rediscovery %v, %v; want off", st, ret)
	}
}

// TestChildBadDrainState: a drain state naming no GPU of the profile fails nvmlInit.
func TestChildBadDrainState(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.ERROR_UNKNOWN {
		t.Errorf("Init = %v, want UNKNOWN", ret)
	}
}

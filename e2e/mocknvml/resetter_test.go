package mocknvml

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

func TestResetter(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildResetter",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"))
}

// TestChildResetter drives the plugin's Resetter (internal/hw/nvml)
// through go-nvml's real binding against the mock: processes, a reset and
// its refusals and failures, the condition after it, and the monitor
// looking the GPU up again. The steps share one library and run in order.
func TestChildResetter(t *testing.T) {
	childOnly(t)
	ctl, err := OpenControl(os.Getenv("MOCK_NVML_CONTROL"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	inject := func(t *testing.T, line string) {
		t.Helper()
		if err := ctl.Inject(line); err != nil {
			t.Fatal(err)
		}
	}
	lib, err := nvml.Open(os.Getenv(envLib))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	inv, err := nvml.Discover(lib, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := nvml.NewResetter(lib)
	ctx := context.Background()
	gpu := inv.GPUs[2]
	wantReset := func(t *testing.T, err error, step nvml.ResetStep, left nvml.GPUState, cause error) {
		t.Helper()
		var re *nvml.ResetError
		if !errors.As(err, &re) || re.Step != step || re.Left != left || !errors.Is(err, cause) {
			t.Fatalf("Reset = %v, want a ResetError at %s leaving the GPU %s, wrapping %v", err, step, left, cause)
		}
	}

	t.Run("processes are listed by PID, compute and graphics together", func(t *testing.T) {
		inject(t, "procs 2 40:8,41")
		inject(t, "graphics-procs 2 41:2")
		got, err := r.Processes(gpu.UUID)
		want := []nvml.Process{{PID: 40, UsedMemoryBytes: 8 << 20}, {PID: 41, UsedMemoryBytes: 2 << 20}}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Processes = %v, %v; want %v", got, err, want)
		}
	})

	t.Run("a busy GPU is refused and left in service", func(t *testing.T) {
		wantReset(t, r.Reset(ctx, gpu), nvml.StepCheck, nvml.LeftInService, nvml.ErrBusy)
		inject(t, "procs 2")
		inject(t, "graphics-procs 2")
	})

	t.Run("persistence mode on stops the drain, nothing changed", func(t *testing.T) {
		inject(t, "persistence 2 on")
		wantReset(t, r.Reset(ctx, gpu), nvml.StepDrain, nvml.LeftInService, gonvml.ERROR_IN_USE)
		inject(t, "persistence 2 off")
	})

	t.Run("without root nothing changes", func(t *testing.T) {
		inject(t, "unprivileged")
		wantReset(t, r.Reset(ctx, gpu), nvml.StepDrain, nvml.LeftInService, gonvml.ERROR_NO_PERMISSION)
		inject(t, "privileged")
	})

	t.Run("a failed removal is undone: drain state off", func(t *testing.T) {
		inject(t, "resetfail 2 remove")
		wantReset(t, r.Reset(ctx, gpu), nvml.StepRemove, nvml.LeftInService, gonvml.ERROR_UNKNOWN)
		h, _ := lib.DeviceGetHandleByUUID(gpu.UUID)
		pci, _ := h.GetPciInfo()
		if st, ret := lib.DeviceQueryDrainState(&pci); ret != gonvml.SUCCESS || st != gonvml.FEATURE_DISABLED {
			t.Errorf("drain state = %v, %v; want off", st, ret)
		}
	})

	t.Run("a failed rediscovery leaves the GPU removed, and says so", func(t *testing.T) {
		inject(t, "resetfail 2 discover")
		wantReset(t, r.Reset(ctx, gpu), nvml.StepDiscover, nvml.LeftRemoved, gonvml.ERROR_UNKNOWN)
		if _, ret := lib.DeviceGetHandleByUUID(gpu.UUID); ret != gonvml.ERROR_NOT_FOUND {
			t.Errorf("the GPU by UUID: %v, want NOT_FOUND", ret)
		}
		if _, ret := lib.DeviceDiscoverGpus(); ret != gonvml.SUCCESS {
			t.Fatalf("DiscoverGpus: %v", ret)
		}
	})

	t.Run("a reset clears the faults a reset clears, and puts compute mode back", func(t *testing.T) {
		if err := nvml.SetComputeMode(lib, gpu.UUID, true); err != nil {
			t.Fatal(err)
		}
		inject(t, "recovery 2 reset")
		inject(t, "remap 2 pending")
		inject(t, "temp 2 95")
		before, err := r.Condition(gpu.UUID)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"recovery-action=reset", "row-remap-pending", "thermal=95C>=slowdown 90C"}; !slices.Equal(before.Faults(), want) || before.ComputeMode != nvml.ComputeExclusiveProcess {
			t.Errorf("before: faults %q, compute mode %v; want %q, exclusive-process", before.Faults(), before.ComputeMode, want)
		}
		if err := r.Reset(ctx, gpu); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		after, err := r.Condition(gpu.UUID)
		if err != nil {
			t.Fatal(err)
		}
		if len(after.Faults()) != 0 || after.ComputeMode != nvml.ComputeDefault || after.MIGEnabled {
			t.Errorf("after: faults %q, compute mode %v, MIG %v; want clean, default, off", after.Faults(), after.ComputeMode, after.MIGEnabled)
		}
	})

	t.Run("a GPU that comes back broken resets but is not clean", func(t *testing.T) {
		inject(t, "comebackbroken 2")
		if err := r.Reset(ctx, gpu); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		c, err := r.Condition(gpu.UUID)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"recovery-action=reset"}; !slices.Equal(c.Faults(), want) {
			t.Errorf("faults = %q, want %q", c.Faults(), want)
		}
		inject(t, "recovery 2 none")
	})

	t.Run("the monitor reads and watches the GPU again once rebound", func(t *testing.T) {
		logged := make(chan string, 16)
		m := nvml.NewMonitor(lib, inv, slog.New(messages(logged)))
		events := make(chan nvml.Event, 4)
		watchCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.WatchEvents(watchCtx, events) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		waitLogged(t, logged, "watching NVML events (XIDs, double-bit ECC, recovery actions)")
		if err := r.Reset(ctx, gpu); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		if err := m.Rebind(2); err != nil {
			t.Fatal(err)
		}
		if s := m.Sample(2); s.Err != nil || s.Lost {
			t.Errorf("sample after Rebind = %+v", s)
		}
		waitLogged(t, logged, "watching NVML events again for a GPU looked up anew")
		inject(t, "xid 2 48")
		if ev := <-events; ev.GPU != 2 || ev.XID != 48 {
			t.Fatalf("event = %+v, want XID 48 on GPU 2", ev)
		}
	})
}

// messages is a slog handler that sends each record's message to ch.
type messages chan<- string

func (h messages) Enabled(context.Context, slog.Level) bool { return true }
func (h messages) Handle(_ context.Context, r slog.Record) error {
	select { // never block the component; the tests wait for few messages
	case h <- r.Message:
	default:
	}
	return nil
}
func (h messages) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h messages) WithGroup(string) slog.Handler      { return h }

// waitLogged waits until msg is logged, failing after ten seconds.
func waitLogged(t *testing.T, logged <-chan string, msg string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-logged:
			if got == msg {
				return
			}
		case <-timeout:
			t.Fatalf("%q not logged", msg)
		}
	}
}

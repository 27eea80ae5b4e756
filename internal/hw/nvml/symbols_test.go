package nvml_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// TestOldDriverCallsOnlyWhatItHas: on a library without the post-R470
// functions, discovery and sampling never call them (a real binding would
// die of "symbol lookup error"; go-nvml's mock panics on a nil hook), and
// fall back to the older calls. The fallbacks are logged in one line.
func TestOldDriverCallsOnlyWhatItHas(t *testing.T) {
	s := nvmltest.NewDGXA100()
	nvmltest.WithoutSymbols(s, nvmltest.R470Symbols()...)
	for i := range s.Devices {
		d := nvmltest.Device(s, i)
		d.GetCurrentClocksEventReasonsFunc = nil
		d.GetNumaNodeIdFunc = nil
		d.GetGpuFabricInfoFunc = nil
		d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) { return nvml.ReasonHWPowerBrake, gonvml.SUCCESS }
	}
	var buf bytes.Buffer
	// No sysfs numa_node: NVML's would be the fallback, but R470 lacks it.
	inv, err := nvml.Discover(s, t.TempDir(), slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		if g.NUMANode != -1 {
			t.Errorf("GPU %d NUMA node = %d, want -1 (unknown)", g.Index, g.NUMANode)
		}
	}
	got := nvml.NewMonitor(s, inv, nil).Sample(0)
	if got.Err != nil || got.Reasons != nvml.ReasonHWPowerBrake || got.TempC != 40 {
		t.Errorf("sample = %+v, want temperature and the throttle reasons through the old calls", got)
	}
	if n := strings.Count(buf.String(), "predates some functions"); n != 1 {
		t.Errorf("fallbacks logged %d times, want once:\n%s", n, buf.String())
	}
	for _, name := range nvmltest.R470Symbols() {
		if !strings.Contains(buf.String(), name) {
			t.Errorf("log does not name %s:\n%s", name, buf.String())
		}
	}
}

// TestMissingFunctionsTurnChecksOff: with no function for a signal at all,
// the signal is Unsupported on every GPU and never read.
func TestMissingFunctionsTurnChecksOff(t *testing.T) {
	s := nvmltest.NewDGXA100()
	nvmltest.WithoutSymbols(s, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
		"nvmlDeviceGetTemperature", "nvmlDeviceGetFieldValues", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetMigMode")
	for i := range s.Devices {
		d := nvmltest.Device(s, i)
		d.GetCurrentClocksEventReasonsFunc, d.GetCurrentClocksThrottleReasonsFunc, d.GetTemperatureFunc = nil, nil, nil
		d.GetFieldValuesFunc, d.GetRemappedRowsFunc, d.GetMigModeFunc, d.GetTemperatureThresholdFunc = nil, nil, nil, nil
	}
	m := nvml.NewMonitor(s, discover(t, s), nil)
	if got := m.Sample(3); got.Err != nil || got.Unsupported != nvml.AllSignals {
		t.Errorf("sample = %+v, want every signal unsupported", got)
	}
}

// TestSampleNotSupported: a GPU answering NOT_SUPPORTED has that signal
// turned off and logged once; it is not asked again, and other signals
// and GPUs are unaffected.
func TestSampleNotSupported(t *testing.T) {
	s := nvmltest.NewDGXA100()
	calls := 0
	d := nvmltest.Device(s, 1)
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
		calls++
		return 0, gonvml.ERROR_NOT_SUPPORTED
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return nvml.ReasonHWSlowdown, gonvml.SUCCESS }
	var buf bytes.Buffer
	m := nvml.NewMonitor(s, discover(t, s), slog.New(slog.NewTextHandler(&buf, nil)))
	for range 3 {
		got := m.Sample(1)
		if got.Err != nil || got.Unsupported != nvml.SignalTemperature || got.Has(nvml.SignalTemperature) || got.Reasons != nvml.ReasonHWSlowdown {
			t.Fatalf("sample = %+v", got)
		}
	}
	if calls != 1 {
		t.Errorf("temperature read %d times, want once", calls)
	}
	if n := strings.Count(buf.String(), "does not support"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, buf.String())
	}
	if got := m.Sample(0); got.Unsupported != 0 || got.Err != nil {
		t.Errorf("GPU 0 sample = %+v", got)
	}
}

// TestSampleReadsAreIndependent: one failing read leaves the others valid.
func TestSampleReadsAreIndependent(t *testing.T) {
	s := nvmltest.NewDGXA100()
	d := nvmltest.Device(s, 2)
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 2, true, false, gonvml.SUCCESS }
	d.GetFieldValuesFunc = nvmltest.RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction { return gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT })
	got := nvml.NewMonitor(s, discover(t, s), nil).Sample(2)
	if got.Failed != nvml.SignalTemperature || !errors.Is(got.Err, gonvml.ERROR_UNKNOWN) || got.Lost {
		t.Errorf("failure = %v %v", got.Failed, got.Err)
	}
	if !got.RowRemapPending || got.RowRemapFailure || got.RecoveryAction != nvml.RecoveryReboot {
		t.Errorf("sample = %+v, want remap pending and reboot", got)
	}
}

// TestRecoveryFieldUnknownToOldDriver: a driver older than the field
// answers INVALID_ARGUMENT for it: the signal is off, not failing.
func TestRecoveryFieldUnknownToOldDriver(t *testing.T) {
	s := nvmltest.NewDGXA100()
	nvmltest.Device(s, 0).GetFieldValuesFunc = func(v []gonvml.FieldValue) gonvml.Return {
		v[0].NvmlReturn = uint32(gonvml.ERROR_INVALID_ARGUMENT)
		return gonvml.SUCCESS
	}
	got := nvml.NewMonitor(s, discover(t, s), nil).Sample(0)
	if got.Err != nil || got.Unsupported != nvml.SignalRecoveryAction {
		t.Errorf("sample = %+v", got)
	}
}

func TestDiscoverMIGMode(t *testing.T) {
	s := nvmltest.NewDGXA100()
	nvmltest.Device(s, 1).MigMode = gonvml.DEVICE_MIG_ENABLE
	nvmltest.Device(s, 2).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED }
	nvmltest.Device(s, 3).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_UNKNOWN }
	// Pending only: MIG takes effect at the next reset; whole until then.
	nvmltest.Device(s, 4).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 1, gonvml.SUCCESS }
	var buf bytes.Buffer
	inv, err := nvml.Discover(s, t.TempDir(), slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		if g.MIGEnabled != (g.Index == 1) {
			t.Errorf("GPU %d MIGEnabled = %v", g.Index, g.MIGEnabled)
		}
	}
	if strings.Contains(buf.String(), "no MIG devices") {
		t.Errorf("discovery reported the GPU without MIG devices above debug (the serving side does):\n%s", buf.String())
	}
	if got := inv.GPUs[1].MIG; len(got) != 0 {
		t.Errorf("GPU 1 MIG = %+v, want none", got)
	}
	if n := strings.Count(buf.String(), "reading MIG mode"); n != 1 {
		t.Errorf("MIG read errors logged %d times, want once (GPU 3 only):\n%s", n, buf.String())
	}
}

func TestWatchEventsRecoveryAction(t *testing.T) {
	s := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(s)
	inv := discover(t, s)
	out := make(chan nvml.Event)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go nvml.NewMonitor(s, inv, nil).WatchEvents(ctx, out)
	events <- gonvml.EventData{Device: inv.Handle(6), EventType: gonvml.EventTypeGpuRecoveryAction, EventData: uint64(gonvml.GPU_RECOVERY_ACTION_GPU_RESET)}
	select {
	case got := <-out:
		if want := (nvml.Event{GPU: 6, Kind: nvml.EventRecoveryAction}); got != want {
			t.Fatalf("event = %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
}

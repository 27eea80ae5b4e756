package nvml_test

import (
	"context"
	"errors"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

func discover(t testing.TB, lib nvml.Library) *nvml.Inventory {
	t.Helper()
	inv, err := nvml.Discover(lib, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestSample(t *testing.T) {
	s := nvmltest.NewDGXA100()
	d := nvmltest.Device(s, 2)
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 91, gonvml.SUCCESS }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return nvml.ReasonHWThermalSlowdown, gonvml.SUCCESS }
	lost := nvmltest.Device(s, 5)
	lost.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
	broken := nvmltest.Device(s, 6)
	broken.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }

	m := nvml.NewMonitor(s, discover(t, s), nil)
	if got := m.Sample(0); got.Err != nil || got.TempC != 40 || got.SlowdownC != nvmltest.SlowdownC || got.ShutdownC != nvmltest.ShutdownC {
		t.Errorf("GPU 0 sample = %+v", got)
	}
	if got := m.Sample(2); got.TempC != 91 || got.Reasons != nvml.ReasonHWThermalSlowdown {
		t.Errorf("GPU 2 sample = %+v", got)
	}
	if got := m.Sample(5); !got.Lost || !errors.Is(got.Err, gonvml.ERROR_GPU_IS_LOST) {
		t.Errorf("GPU 5 sample = %+v", got)
	}
	if got := m.Sample(6); got.Lost || !errors.Is(got.Err, gonvml.ERROR_UNKNOWN) {
		t.Errorf("GPU 6 sample = %+v", got)
	}
}

func TestWatchEvents(t *testing.T) {
	s := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(s)
	// GPU 7 cannot register: it is left to polling, the rest still work.
	nvmltest.Device(s, 7).RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.ERROR_NOT_SUPPORTED }
	inv := discover(t, s)
	m := nvml.NewMonitor(s, inv, nil)
	out := make(chan nvml.Event)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.WatchEvents(ctx, out) }()

	events <- gonvml.EventData{Device: inv.Handle(3), EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	events <- gonvml.EventData{Device: inv.Handle(4), EventType: gonvml.EventTypeDoubleBitEccError}
	for _, want := range []nvml.Event{{GPU: 3, Kind: nvml.EventXID, XID: 79}, {GPU: 4, Kind: nvml.EventDoubleBitECC}} {
		select {
		case got := <-out:
			if got != want {
				t.Fatalf("event = %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
	}
	start := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %s", d)
	}
}

func TestWatchEventsFailsWhenNoGPUCanRegister(t *testing.T) {
	s := nvmltest.NewDGXA100()
	for i := range 8 {
		nvmltest.Device(s, i).GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	}
	m := nvml.NewMonitor(s, discover(t, s), nil)
	if err := m.WatchEvents(context.Background(), make(chan nvml.Event)); err == nil {
		t.Fatal("no error")
	}
}

// TestWatchEventsMIG: an XID on a MIG instance arrives on the parent's
// handle with the instance ids; Event.MIG names the instance, or is nil
// for the whole GPU, for a GPU not in MIG mode, and for other events.
func TestWatchEventsMIG(t *testing.T) {
	const none = 0xFFFFFFFF
	s := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(s)
	nvmltest.WithMIG(s, 2,
		&nvmltest.MIG{GPUInstance: 1, ComputeInstance: 0, GISlices: 3, MemoryMiB: 19968},
		&nvmltest.MIG{GPUInstance: 1, ComputeInstance: 1, GISlices: 3, CISlices: 1, MemoryMiB: 19968},
	)
	inv := discover(t, s)
	out := make(chan nvml.Event)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go nvml.NewMonitor(s, inv, nil).WatchEvents(ctx, out)

	xid := uint64(gonvml.EventTypeXidCriticalError)
	tests := []struct {
		name string
		data gonvml.EventData
		want *nvml.Instance
	}{
		{name: "compute instance", data: gonvml.EventData{Device: inv.Handle(2), EventType: xid, EventData: 43, GpuInstanceId: 1, ComputeInstanceId: 1}, want: &nvml.Instance{GPUInstance: 1, ComputeInstance: 1}},
		{name: "GPU and compute instance 0", data: gonvml.EventData{Device: inv.Handle(2), EventType: xid, EventData: 43, GpuInstanceId: 0, ComputeInstanceId: 0}, want: &nvml.Instance{}},
		{name: "every compute instance of a GPU instance", data: gonvml.EventData{Device: inv.Handle(2), EventType: xid, EventData: 43, GpuInstanceId: 1, ComputeInstanceId: none}, want: &nvml.Instance{GPUInstance: 1, ComputeInstance: -1}},
		{name: "whole GPU", data: gonvml.EventData{Device: inv.Handle(2), EventType: xid, EventData: 79, GpuInstanceId: none, ComputeInstanceId: none}},
		{name: "GPU not in MIG mode", data: gonvml.EventData{Device: inv.Handle(3), EventType: xid, EventData: 79, GpuInstanceId: 0, ComputeInstanceId: 0}},
		{name: "not an XID", data: gonvml.EventData{Device: inv.Handle(2), EventType: gonvml.EventTypeDoubleBitEccError, GpuInstanceId: 1, ComputeInstanceId: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events <- tt.data
			select {
			case got := <-out:
				if (got.MIG == nil) != (tt.want == nil) || (got.MIG != nil && *got.MIG != *tt.want) {
					t.Errorf("event MIG = %+v, want %+v", got.MIG, tt.want)
				}
				if tt.data.EventType == xid && got.XID != tt.data.EventData {
					t.Errorf("event XID = %d, want %d", got.XID, tt.data.EventData)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no event")
			}
		})
	}
}

// TestRebind: after a reset a GPU is looked up again by UUID; the monitor
// reads it through the new handle and WatchEvents registers that handle,
// so its events reach the watcher again.
func TestRebind(t *testing.T) {
	s := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(s)
	inv := discover(t, s)
	registered := make(chan uint64, 1)
	fresh := &mock.Device{
		GetTemperatureFunc: func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 55, gonvml.SUCCESS },
		GetTemperatureThresholdFunc: func(gonvml.TemperatureThresholds) (uint32, gonvml.Return) {
			return 80, gonvml.SUCCESS
		},
		GetCurrentClocksEventReasonsFunc: func() (uint64, gonvml.Return) { return 0, gonvml.SUCCESS },
		GetFieldValuesFunc:               nvmltest.RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction { return gonvml.GPU_RECOVERY_ACTION_NONE }),
		GetRemappedRowsFunc:              func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.SUCCESS },
		GetSupportedEventTypesFunc: func() (uint64, gonvml.Return) {
			return gonvml.EventTypeXidCriticalError, gonvml.SUCCESS
		},
		RegisterEventsFunc: func(mask uint64, _ gonvml.EventSet) gonvml.Return {
			select { // once or twice: at WatchEvents' start if Rebind came first, and at its next turn
			case registered <- mask:
			default:
			}
			return gonvml.SUCCESS
		},
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(uuid string) (gonvml.Device, gonvml.Return) {
		if uuid == inv.GPUs[1].UUID {
			return fresh, gonvml.SUCCESS
		}
		return byUUID(uuid)
	}
	m := nvml.NewMonitor(s, inv, nil)
	out := make(chan nvml.Event)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.WatchEvents(ctx, out)

	if err := m.Rebind(1); err != nil {
		t.Fatal(err)
	}
	if got := m.Sample(1); got.TempC != 55 || got.SlowdownC != 80 {
		t.Errorf("sample after Rebind = %+v, want the new handle's 55C of 80C", got)
	}
	select {
	case mask := <-registered:
		if mask != gonvml.EventTypeXidCriticalError {
			t.Errorf("registered %#x", mask)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the new handle was not registered for events")
	}
	events <- gonvml.EventData{Device: fresh, EventType: gonvml.EventTypeXidCriticalError, EventData: 48}
	select {
	case got := <-out:
		if got.GPU != 1 || got.XID != 48 {
			t.Errorf("event = %+v, want XID 48 on GPU 1", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event from the new handle")
	}
	if err := m.Rebind(1); err != nil { // again: fine
		t.Fatal(err)
	}
}

package nvml_test

import (
	"context"
	"errors"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml/nvmltest"
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

package mocknvml

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestFaults(t *testing.T) {
	dir := t.TempDir()
	runChild(t, "TestChildFaults",
		"MOCK_NVML_PROFILE="+profilePath("dgx-h100"),
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"),
		"MOCK_NVML_LOG="+filepath.Join(dir, "log"))
}

// faultEnv is the library and handles a fault test drives.
type faultEnv struct {
	lib     gonvml.Interface
	ctl     *Control
	handles []gonvml.Device
	all     gonvml.EventSet // every GPU, every supported event
	only3   gonvml.EventSet // GPU 3, double-bit ECC only
}

func openFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	ctl, err := OpenControl(os.Getenv("MOCK_NVML_CONTROL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	e := &faultEnv{lib: lib, ctl: ctl}
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS || n != 8 {
		t.Fatalf("DeviceGetCount = %d, %v; want 8", n, ret)
	}
	for i := range n {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
		e.handles = append(e.handles, h)
	}
	const supported = gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypeSingleBitEccError | gonvml.EventTypeGpuRecoveryAction
	if e.all, ret = lib.EventSetCreate(); ret != gonvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	for i, h := range e.handles {
		if got, ret := h.GetSupportedEventTypes(); ret != gonvml.SUCCESS || got != supported {
			t.Fatalf("GPU %d: GetSupportedEventTypes = %#x, %v; want %#x", i, got, ret, supported)
		}
		if ret := h.RegisterEvents(supported, e.all); ret != gonvml.SUCCESS {
			t.Fatalf("GPU %d: RegisterEvents: %v", i, ret)
		}
	}
	if e.only3, ret = lib.EventSetCreate(); ret != gonvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	if ret := e.handles[3].RegisterEvents(gonvml.EventTypeDoubleBitEccError, e.only3); ret != gonvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	return e
}

func (e *faultEnv) inject(t *testing.T, line string) {
	t.Helper()
	if err := e.ctl.Inject(line); err != nil {
		t.Fatal(err)
	}
}

// wantEvent waits for one event on set and checks it.
func wantEvent(t *testing.T, set gonvml.EventSet, dev gonvml.Device, typ, data uint64) {
	t.Helper()
	got, ret := set.Wait(5000)
	if ret != gonvml.SUCCESS {
		t.Fatalf("Wait: %v, want an event", ret)
	}
	if got.Device != dev || got.EventType != typ || got.EventData != data {
		t.Fatalf("event = %+v, want type %#x data %d on %v", got, typ, data, dev)
	}
}

// wantNoEvent checks nothing is queued on set (Inject has returned, so
// whatever the command queued is there already).
func wantNoEvent(t *testing.T, set gonvml.EventSet) {
	t.Helper()
	if got, ret := set.Wait(0); ret != gonvml.ERROR_TIMEOUT {
		t.Fatalf("Wait = %+v, %v; want TIMEOUT", got, ret)
	}
}

// TestChildFaults injects every kind of fault through the FIFO into the
// dgx-h100 profile and checks what go-nvml's real binding then reads.
// The steps share one library and run in order.
func TestChildFaults(t *testing.T) {
	childOnly(t)
	e := openFaultEnv(t)
	h := e.handles

	t.Run("a wait with nothing pending times out", func(t *testing.T) {
		start := time.Now()
		_, ret := e.all.Wait(50)
		if took := time.Since(start); ret != gonvml.ERROR_TIMEOUT || took < 45*time.Millisecond || took > 2*time.Second {
			t.Fatalf("Wait(50) = %v after %v, want TIMEOUT after about 50ms", ret, took)
		}
	})

	t.Run("an injected XID wakes a blocked wait", func(t *testing.T) {
		type result struct {
			data gonvml.EventData
			ret  gonvml.Return
			at   time.Time
		}
		var latencies []time.Duration
		for range 20 {
			done := make(chan result, 1)
			waiting := make(chan struct{})
			go func() {
				close(waiting)
				d, ret := e.all.Wait(5000)
				done <- result{d, ret, time.Now()}
			}()
			<-waiting
			start := time.Now()
			e.inject(t, "xid 3 79")
			r := <-done
			if r.ret != gonvml.SUCCESS || r.data.Device != h[3] || r.data.EventType != gonvml.EventTypeXidCriticalError || r.data.EventData != 79 {
				t.Fatalf("Wait = %+v, %v; want XID 79 on GPU 3", r.data, r.ret)
			}
			if r.data.GpuInstanceId != 0xFFFFFFFF || r.data.ComputeInstanceId != 0xFFFFFFFF {
				t.Errorf("instance ids = %#x %#x, want 0xFFFFFFFF (no MIG)", r.data.GpuInstanceId, r.data.ComputeInstanceId)
			}
			latencies = append(latencies, r.at.Sub(start))
		}
		slices.Sort(latencies)
		t.Logf("injection to event latency over %d runs: min %v, median %v, max %v",
			len(latencies), latencies[0], latencies[len(latencies)/2], latencies[len(latencies)-1])
		if worst := latencies[len(latencies)-1]; worst > 500*time.Millisecond {
			t.Errorf("slowest event took %v, want well under the 5s wait", worst)
		}
		wantNoEvent(t, e.only3) // registered for ECC only
	})

	t.Run("an event reaches every set registered for it", func(t *testing.T) {
		e.inject(t, "ecc 3")
		wantEvent(t, e.all, h[3], gonvml.EventTypeDoubleBitEccError, 0)
		wantEvent(t, e.only3, h[3], gonvml.EventTypeDoubleBitEccError, 0)
		e.inject(t, "ecc 4 single")
		wantEvent(t, e.all, h[4], gonvml.EventTypeSingleBitEccError, 0)
		wantNoEvent(t, e.only3)
		// Events queue in order while nobody waits.
		e.inject(t, "xid 1 13")
		e.inject(t, "xid 2 31")
		wantEvent(t, e.all, h[1], gonvml.EventTypeXidCriticalError, 13)
		wantEvent(t, e.all, h[2], gonvml.EventTypeXidCriticalError, 31)
		wantNoEvent(t, e.all)
	})

	t.Run("temperature and throttling show in the next read", func(t *testing.T) {
		thresholds := map[gonvml.TemperatureThresholds]uint32{
			gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN: 90,
			gonvml.TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
			gonvml.TEMPERATURE_THRESHOLD_GPU_MAX:  87,
		}
		for th, want := range thresholds {
			if got, ret := h[2].GetTemperatureThreshold(th); ret != gonvml.SUCCESS || got != want {
				t.Errorf("threshold %d = %d, %v; want %d", th, got, ret, want)
			}
		}
		e.inject(t, "temp 2 95")
		e.inject(t, "throttle 2 0x48")
		checkHealth(t, h[2], 95, 0x48)
		checkHealth(t, h[1], 33, 0)
		e.inject(t, "recover 2")
		checkHealth(t, h[2], 33, 0)
	})

	t.Run("a lost GPU fails every call and raises XID 79", func(t *testing.T) {
		e.inject(t, "lost 5")
		wantEvent(t, e.all, h[5], gonvml.EventTypeXidCriticalError, 79)
		if _, ret := h[5].GetUUID(); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetUUID on a lost GPU: %v, want GPU_IS_LOST", ret)
		}
		if _, ret := h[5].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("GetTemperature on a lost GPU: %v, want GPU_IS_LOST", ret)
		}
		if _, ret := e.lib.DeviceGetHandleByIndex(5); ret != gonvml.ERROR_GPU_IS_LOST {
			t.Errorf("DeviceGetHandleByIndex(5): %v, want GPU_IS_LOST", ret)
		}
		if _, ret := h[4].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GetUUID on GPU 4: %v", ret)
		}
		e.inject(t, "recover 5")
		if _, ret := h[5].GetUUID(); ret != gonvml.SUCCESS {
			t.Errorf("GetUUID after recover: %v", ret)
		}
	})

	t.Run("fail makes every device call fail until unfail", func(t *testing.T) {
		e.inject(t, "fail")
		for i, d := range h {
			if _, ret := d.GetName(); ret != gonvml.ERROR_UNKNOWN {
				t.Errorf("GPU %d: GetName while failing: %v, want UNKNOWN", i, ret)
			}
		}
		if _, ret := e.lib.DeviceGetHandleByUUID("GPU-a4c123b1-612d-d272-d137-1c17149d4395"); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("DeviceGetHandleByUUID while failing: %v, want UNKNOWN", ret)
		}
		if n, ret := e.lib.DeviceGetCount(); ret != gonvml.SUCCESS || n != 8 {
			t.Errorf("DeviceGetCount while failing = %d, %v; want 8 (not a device call)", n, ret)
		}
		e.inject(t, "unfail")
		if name, ret := h[0].GetName(); ret != gonvml.SUCCESS || name != "NVIDIA H100 80GB HBM3" {
			t.Errorf("GetName after unfail = %q, %v", name, ret)
		}
	})

	t.Run("a malformed command is rejected with the reason", func(t *testing.T) {
		for line, reason := range map[string]string{
			"xid 8 79":    "no GPU 8",
			"xid 3":       "usage: xid <index> <code>",
			"temp 1 hot":  "not a temperature",
			"reboot 1":    "unknown command reboot",
			"ecc 1 tripe": "usage: ecc",
			`xid 3 "79`:   "unterminated quote",
			"xid 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16": "too many words",
		} {
			err := e.ctl.Inject(line)
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), reason) {
				t.Errorf("Inject(%q) = %v, want ErrRejected saying %q", line, err, reason)
			}
		}
	})

	t.Run("the log records each fault", func(t *testing.T) {
		b, err := os.ReadFile(os.Getenv("MOCK_NVML_LOG"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"injected: xid 3 79", "injected: lost 5", "rejected: xid 8 79: xid: no GPU 8"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("log lacks %q:\n%s", want, b)
			}
		}
	})

	t.Run("freeing a set wakes its waiter", func(t *testing.T) {
		set, ret := e.lib.EventSetCreate()
		if ret != gonvml.SUCCESS {
			t.Fatalf("EventSetCreate: %v", ret)
		}
		if ret := h[0].RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			t.Fatalf("RegisterEvents: %v", ret)
		}
		done := make(chan gonvml.Return, 1)
		waiting := make(chan struct{})
		go func() {
			close(waiting)
			_, ret := set.Wait(5000)
			done <- ret
		}()
		<-waiting
		start := time.Now()
		if ret := set.Free(); ret != gonvml.SUCCESS {
			t.Fatalf("Free: %v", ret)
		}
		if ret := <-done; ret != gonvml.ERROR_INVALID_ARGUMENT || time.Since(start) > time.Second {
			t.Errorf("Wait across Free = %v after %v, want INVALID_ARGUMENT at once", ret, time.Since(start))
		}
		if ret := set.Free(); ret != gonvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("second Free = %v, want INVALID_ARGUMENT", ret)
		}
		e.inject(t, "xid 0 43") // delivered to the other sets only
		wantEvent(t, e.all, h[0], gonvml.EventTypeXidCriticalError, 43)
	})

	t.Run("shutdown wakes a blocked wait, and init starts afresh", func(t *testing.T) {
		e.inject(t, "temp 0 70")
		done := make(chan gonvml.Return, 1)
		waiting := make(chan struct{})
		go func() {
			close(waiting)
			_, ret := e.all.Wait(5000)
			done <- ret
		}()
		<-waiting
		start := time.Now()
		if ret := e.lib.Shutdown(); ret != gonvml.SUCCESS {
			t.Fatalf("Shutdown: %v", ret)
		}
		if ret := <-done; ret != gonvml.ERROR_UNINITIALIZED || time.Since(start) > time.Second {
			t.Errorf("Wait across Shutdown = %v after %v, want UNINITIALIZED at once", ret, time.Since(start))
		}
		if ret := e.lib.Init(); ret != gonvml.SUCCESS {
			t.Fatalf("Init again: %v", ret)
		}
		defer e.lib.Shutdown()
		// The same handle, back at the profile's temperature; the control thread runs again.
		checkHealth(t, h[0], 33, 0)
		e.inject(t, "temp 0 71")
		checkHealth(t, h[0], 71, 0)
	})
}

func checkHealth(t *testing.T, d gonvml.Device, temp uint32, reasons uint64) {
	t.Helper()
	if got, ret := d.GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS || got != temp {
		t.Errorf("GetTemperature = %d, %v; want %d", got, ret, temp)
	}
	if got, ret := d.GetCurrentClocksEventReasons(); ret != gonvml.SUCCESS || got != reasons {
		t.Errorf("GetCurrentClocksEventReasons = %#x, %v; want %#x", got, ret, reasons)
	}
	if got, ret := d.GetCurrentClocksThrottleReasons(); ret != gonvml.SUCCESS || got != reasons {
		t.Errorf("GetCurrentClocksThrottleReasons = %#x, %v; want %#x", got, ret, reasons)
	}
}

func TestControlFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(path, []byte("xid 1 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runChild(t, "TestChildControlFile", "MOCK_NVML_PROFILE="+profilePath("pcie-4gpu"), "MOCK_NVML_CONTROL="+path)
}

// TestChildControlFile checks a regular control file is tailed: lines
// already there at nvmlInit are skipped, lines appended later are applied.
func TestChildControlFile(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	h, _ := lib.DeviceGetHandleByIndex(1)
	set, _ := lib.EventSetCreate()
	defer set.Free()
	if ret := h.RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	f, err := os.OpenFile(os.Getenv("MOCK_NVML_CONTROL"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	if _, err := f.WriteString("temp 1 80\nxid 1 48\n"); err != nil {
		t.Fatal(err)
	}
	wantEvent(t, set, h, gonvml.EventTypeXidCriticalError, 48)
	t.Logf("appended line to event: %v", time.Since(start))
	// The temp line came first, so it is applied by now.
	if got, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS || got != 80 {
		t.Errorf("GetTemperature = %d, %v; want 80", got, ret)
	}
}

package health

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

type dgxa100Server = dgxa100.Server

// mockNode is go-nvml's mock DGX A100 behind the real Monitor, so these
// tests pin what NVML answers turn into, end to end.
type mockNode struct {
	w   *Watcher
	r   *recorder
	log *bytes.Buffer
	ids []string
}

func newMockNode(t *testing.T, p policy.Policy, edit func(*dgxa100Server)) *mockNode {
	t.Helper()
	s := nvmltest.NewDGXA100()
	if edit != nil {
		edit(s)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	inv, err := nvml.Discover(s, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	n := &mockNode{r: &recorder{}, log: &buf}
	for _, g := range inv.GPUs {
		n.ids = append(n.ids, g.UUID)
	}
	if n.w, err = NewWatcher(p, n.ids, nvml.NewMonitor(s, inv, log), n.r, nil, log); err != nil {
		t.Fatal(err)
	}
	return n
}

// unhealthy returns the unhealthy GPUs by position, with their reasons.
func (n *mockNode) unhealthy() map[int]string {
	out := map[int]string{}
	for i := range n.ids {
		if ok, reason := n.w.State(i); !ok {
			out[i] = reason
		}
	}
	return out
}

// logLines counts log lines with msg that carry every key=value in kv.
func logLines(buf *bytes.Buffer, msg string, kv ...string) int {
	count := 0
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil || e["msg"] != msg {
			continue
		}
		match := true
		for k := 0; k+1 < len(kv); k += 2 {
			match = match && fmt.Sprint(e[kv[k]]) == kv[k+1]
		}
		if match {
			count++
		}
	}
	return count
}

// TestNotSupportedIsNotAFailure: a node whose GPUs answer NOT_SUPPORTED to
// temperature and clock reasons (a vGPU guest) stays Healthy, and says so
// once per GPU and signal.
func TestNotSupportedIsNotAFailure(t *testing.T) {
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		for i := range s.Devices {
			d := nvmltest.Device(s, i)
			d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
			d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		}
	})
	for range 5 {
		n.w.Poll()
	}
	if u := n.unhealthy(); len(u) != 0 {
		t.Fatalf("unhealthy GPUs %v; NOT_SUPPORTED says nothing about a GPU", u)
	}
	const msg = "GPU does not support this health signal; its check is off for this GPU"
	for _, sig := range []string{"temperature", "clock-reasons"} {
		if got := logLines(n.log, msg, "device", n.ids[0], "signal", sig); got != 1 {
			t.Errorf("%s unsupported logged %d times for GPU 0, want once\n%s", sig, got, n.log)
		}
	}
}

// TestTransientErrorOnEveryGPU: one poll in which every GPU fails is
// logged, not acted on.
func TestTransientErrorOnEveryGPU(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		for i := range s.Devices {
			d := nvmltest.Device(s, i)
			d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
				if failing.Load() {
					return 0, gonvml.ERROR_UNKNOWN
				}
				return 40, gonvml.SUCCESS
			}
			d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
				if failing.Load() {
					return 0, gonvml.ERROR_UNKNOWN
				}
				return 0, gonvml.SUCCESS
			}
			d.GetFieldValuesFunc = func([]gonvml.FieldValue) gonvml.Return { return gonvml.ERROR_UNKNOWN }
			d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_UNKNOWN }
		}
	})
	n.w.Poll()
	if u := n.unhealthy(); len(u) != 0 {
		t.Fatalf("one failed poll made GPUs unhealthy: %v", u)
	}
	n.w.Poll()
	n.w.Poll()
	if u := n.unhealthy(); len(u) != len(n.ids) || !strings.HasPrefix(u[0], "nvml: ") {
		t.Fatalf("after %d failed polls unhealthy = %v, want every GPU with nvml: ...", policy.DefaultNVMLFailurePolls, u)
	}
}

// TestRepeatedWarningsAreRateLimited: a GPU failing the same read at every
// poll is logged once per warnEvery, with the count of those left out.
func TestRepeatedWarningsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	s, r := newSampler(2), &recorder{}
	w, err := NewWatcher(policy.Default(), []string{"GPU-0", "GPU-1"}, s, r, nil, slog.New(slog.NewJSONHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_000_000, 0)}
	w.now = c.now
	s.set(1, func(x *nvml.Sample) {
		x.Failed, x.Err = nvml.SignalRemappedRows, fmt.Errorf("reading remapped-rows: %w", gonvml.ERROR_UNKNOWN)
	})
	const msg = "reading GPU health failed; health unchanged"
	for range 10 {
		w.Poll()
		c.t = c.t.Add(5 * time.Second)
	}
	if got := logLines(&buf, msg, "device", "GPU-1"); got != 1 {
		t.Fatalf("logged %d times in 50s, want once\n%s", got, buf.String())
	}
	c.t = c.t.Add(warnEvery)
	w.Poll()
	if got := logLines(&buf, msg, "device", "GPU-1", "suppressed", "9"); got != 1 {
		t.Fatalf("no second warning counting the 9 left out\n%s", buf.String())
	}
	expect(t, r.take())
}

// TestMIGEnabledGPUIsNotHandedOut: discovery's MIG mode makes the GPU
// Unhealthy "mig-enabled" at the first poll, and only that GPU.
func TestMIGEnabledGPUIsNotHandedOut(t *testing.T) {
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		nvmltest.Device(s, 3).MigMode = gonvml.DEVICE_MIG_ENABLE
		// A GPU that cannot do MIG answers NOT_SUPPORTED: not an error.
		nvmltest.Device(s, 4).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED }
	})
	n.w.Poll()
	if u := n.unhealthy(); len(u) != 1 || u[3] != "mig-enabled" {
		t.Fatalf("unhealthy = %v, want only GPU 3 mig-enabled", u)
	}
	if got := logLines(n.log, "reading MIG mode; taking MIG as off"); got != 0 {
		t.Errorf("NOT_SUPPORTED MIG mode logged as an error\n%s", n.log)
	}
}

// TestRecoveryAction: a GPU the driver says needs a reboot is Unhealthy
// until the driver says none; a fatal XID followed by an action and then
// none clears too, and one with no action in between does not.
func TestRecoveryAction(t *testing.T) {
	var action [8]atomic.Int32
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		for i := range s.Devices {
			nvmltest.Device(s, i).GetFieldValuesFunc = nvmltest.RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction {
				return gonvml.DeviceGpuRecoveryAction(action[i].Load())
			})
		}
	})
	set := func(i int, a gonvml.DeviceGpuRecoveryAction) { action[i].Store(int32(a)) }

	set(1, gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT)
	set(2, gonvml.GPU_RECOVERY_ACTION_GPU_RESET)
	set(3, gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P)
	n.w.Poll()
	want := map[int]string{1: "recovery-action=reboot", 2: "recovery-action=reset", 3: "recovery-action=drain"}
	if u := n.unhealthy(); fmt.Sprint(u) != fmt.Sprint(want) {
		t.Fatalf("unhealthy = %v, want %v", u, want)
	}
	for i := 1; i <= 3; i++ {
		set(i, gonvml.GPU_RECOVERY_ACTION_NONE)
	}
	n.w.Poll()
	if u := n.unhealthy(); len(u) != 0 {
		t.Fatalf("unhealthy = %v after the driver said none", u)
	}

	// GPU 5: XID 79, the driver asks for a reset, then says none.
	// GPU 6: XID 79 and no action at all: stays until restart.
	for _, i := range []int{5, 6} {
		n.w.Event(nvml.Event{GPU: i, Kind: nvml.EventXID, XID: 79})
	}
	set(5, gonvml.GPU_RECOVERY_ACTION_GPU_RESET)
	n.w.Poll()
	if got := n.unhealthy()[5]; got != "recovery-action=reset, xid=79" {
		t.Fatalf("GPU 5 reason = %q", got)
	}
	set(5, gonvml.GPU_RECOVERY_ACTION_NONE)
	n.w.Poll()
	if u := n.unhealthy(); len(u) != 1 || u[6] != "xid=79" {
		t.Fatalf("unhealthy = %v, want only GPU 6 xid=79", u)
	}
}

// TestRecoveryActionEvent: the driver's recovery-action event re-reads the
// GPU at once, without waiting for a poll.
func TestRecoveryActionEvent(t *testing.T) {
	var action atomic.Int32
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		nvmltest.Device(s, 2).GetFieldValuesFunc = nvmltest.RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction {
			return gonvml.DeviceGpuRecoveryAction(action.Load())
		})
	})
	action.Store(int32(gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT))
	n.w.Event(nvml.Event{GPU: 2, Kind: nvml.EventRecoveryAction})
	expect(t, n.r.take(), change{n.ids[2], false, "recovery-action=reboot"})
	action.Store(int32(gonvml.GPU_RECOVERY_ACTION_NONE))
	n.w.Event(nvml.Event{GPU: 2, Kind: nvml.EventRecoveryAction})
	expect(t, n.r.take(), change{n.ids[2], true, ""})
}

func TestRemappedRows(t *testing.T) {
	n := newMockNode(t, policy.Default(), func(s *dgxa100Server) {
		nvmltest.Device(s, 0).GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, false, gonvml.SUCCESS }
		nvmltest.Device(s, 1).GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, true, gonvml.SUCCESS }
		// A GPU without HBM row remapping.
		nvmltest.Device(s, 2).GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED }
	})
	n.w.Poll()
	want := map[int]string{0: "row-remap-pending", 1: "row-remap-failure"}
	if u := n.unhealthy(); fmt.Sprint(u) != fmt.Sprint(want) {
		t.Fatalf("unhealthy = %v, want %v", u, want)
	}
}

// TestDisabledChecks: a disabled check never makes a GPU Unhealthy.
func TestDisabledChecks(t *testing.T) {
	tests := []struct {
		check string
		set   func(*nvml.Sample)
	}{
		{policy.CheckThermal, func(x *nvml.Sample) { x.TempC = 99 }},
		{policy.CheckHWSlowdown, func(x *nvml.Sample) { x.Reasons = nvml.ReasonHWSlowdown | nvml.ReasonHWThermalSlowdown }},
		{policy.CheckPowerBrake, func(x *nvml.Sample) { x.Reasons = nvml.ReasonHWPowerBrake }},
		{policy.CheckLost, func(x *nvml.Sample) { x.Lost, x.Failed, x.Err = true, nvml.AllSignals, gonvml.ERROR_GPU_IS_LOST }},
		{policy.CheckRecoveryAction, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryReboot }},
		{policy.CheckRemappedRows, func(x *nvml.Sample) { x.RowRemapPending, x.RowRemapFailure = true, true }},
	}
	for _, tt := range tests {
		t.Run(tt.check, func(t *testing.T) {
			for _, disabled := range []bool{false, true} {
				p := policy.Default()
				if disabled {
					p.Disabled = []string{tt.check}
				}
				w, s, _, _ := newWatcher(t, 1, p)
				s.set(0, tt.set)
				for range policy.DefaultSlowdownSamples {
					w.Poll()
				}
				if healthy, reason := w.State(0); healthy != disabled {
					t.Errorf("disabled %v: healthy = %v (%s)", disabled, healthy, reason)
				}
			}
		})
	}
}

// TestStickyExportAndRestore: fatal XIDs and double-bit ECC are exported
// as they change, and a new Watcher seeded with them starts Unhealthy
// and can still clear them through the driver's recovery action.
func TestStickyExportAndRestore(t *testing.T) {
	var hooked [][]StickyCondition
	ids := []string{"GPU-0", "GPU-1", "GPU-2"}
	s, r := newSampler(3), &recorder{}
	w, err := NewWatcher(policy.Default(), ids, s, r, nil, nil, OnStickyChange(func(c []StickyCondition) { hooked = append(hooked, c) }))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_000_000, 0)}
	w.now = c.now
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 79})
	w.Event(nvml.Event{GPU: 2, Kind: nvml.EventDoubleBitECC})
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 61}) // transient: not sticky
	s.set(1, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryReset })
	w.Poll()
	s.set(1, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryNone })
	saved := w.Sticky()
	want := []StickyCondition{
		{Device: "GPU-1", Kind: StickyXID, XID: 79, Since: c.t, ActionSeen: true},
		{Device: "GPU-2", Kind: StickyECC, Since: c.t},
	}
	if fmt.Sprint(saved) != fmt.Sprint(want) {
		t.Fatalf("Sticky() = %+v, want %+v", saved, want)
	}
	if len(hooked) != 3 || fmt.Sprint(hooked[2]) != fmt.Sprint(want) {
		t.Fatalf("OnStickyChange calls = %+v", hooked)
	}

	// The plugin restarts; GPU-9 has left the node.
	saved = append(saved, StickyCondition{Device: "GPU-9", Kind: StickyXID, XID: 48})
	r2 := &recorder{}
	w2, err := NewWatcher(policy.Default(), ids, s, r2, nil, nil, WithSticky(saved))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, r2.take(), change{"GPU-1", false, "xid=79"}, change{"GPU-2", false, "ecc=double-bit"})
	if got := w2.Sticky(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored Sticky() = %+v, want %+v", got, want)
	}
	// The driver already asked for a reset before the restart; it now
	// says none, so GPU-1 is fine. GPU-2 saw no action and stays out.
	w2.Poll()
	expect(t, r2.take(), change{"GPU-1", true, ""})
	if got := w2.Sticky(); len(got) != 1 || got[0].Device != "GPU-2" {
		t.Fatalf("Sticky() after recovery = %+v", got)
	}
}

// The saved form of a sticky condition is documented in docs/health.md:
// its keys are pinned here.
func TestStickyConditionJSON(t *testing.T) {
	c := StickyCondition{Device: "GPU-a", Kind: StickyXID, XID: 79, Since: time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC), ActionSeen: true}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"device":"GPU-a","kind":"xid","xid":79,"since":"2026-11-24T01:02:03Z","actionSeen":true}`
	if string(b) != want {
		t.Fatalf("JSON %s, want %s", b, want)
	}
}

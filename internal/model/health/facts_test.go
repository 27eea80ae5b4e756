package health

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

type factsLog struct{ got []string }

func (l *factsLog) add(gpu string, f Facts) {
	l.got = append(l.got, fmt.Sprintf("%s healthy=%t reason=%q action=%s xids=%v pending=%t failure=%t lost=%t",
		gpu, f.Healthy, f.Reason, f.Action, f.XIDs, f.RowRemapPending, f.RowRemapFailure, f.Lost))
}

func (l *factsLog) take() []string {
	out := l.got
	l.got = nil
	return out
}

func factsWatcher(t *testing.T, n int, opts ...Option) (*Watcher, *fakeSampler, *recorder, *factsLog) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%d", i)
	}
	s, r, l := newSampler(n), &recorder{}, &factsLog{}
	w, err := NewWatcher(policy.Default(), ids, s, r, nil, nil, append(opts, OnFacts(l.add))...)
	if err != nil {
		t.Fatal(err)
	}
	w.now = (&clock{t: time.Unix(1_000_000, 0)}).now
	return w, s, r, l
}

func wantFacts(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
		t.Fatalf("facts\n%q\nwant\n%q", got, want)
	}
}

// The facts reach OnFacts when they change, each XID once as it arrives;
// an unchanged poll and an ignored XID say nothing.
func TestFactsOnChange(t *testing.T) {
	w, s, _, l := factsWatcher(t, 2)
	w.Poll()
	wantFacts(t, l.take())
	s.set(1, func(x *nvml.Sample) {
		x.RecoveryAction = nvml.RecoveryReset
		x.RowRemapPending = true
	})
	w.Poll()
	wantFacts(t, l.take(), `GPU-1 healthy=false reason="recovery-action=reset, row-remap-pending" action=reset xids=[] pending=true failure=false lost=false`)
	w.Poll()
	wantFacts(t, l.take())
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 13}) // ignored
	wantFacts(t, l.take())
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 48})
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 48})
	wantFacts(t, l.take(),
		`GPU-1 healthy=false reason="recovery-action=reset, row-remap-pending, xid=48" action=reset xids=[48] pending=true failure=false lost=false`,
		`GPU-1 healthy=false reason="recovery-action=reset, row-remap-pending, xid=48" action=reset xids=[48] pending=true failure=false lost=false`)
	s.set(0, func(x *nvml.Sample) { x.Lost, x.Err = true, fmt.Errorf("GPU is lost") })
	w.Poll()
	wantFacts(t, l.take(), `GPU-0 healthy=false reason="gpu-lost" action=none xids=[] pending=false failure=false lost=true`)
}

// A GPU unhealthy at start (a sticky condition restored) is told at once,
// its restored XID not as a new one.
func TestFactsAtStart(t *testing.T) {
	_, _, _, l := factsWatcher(t, 2, WithSticky([]StickyCondition{{Device: "GPU-1", Kind: StickyXID, XID: 79}}))
	wantFacts(t, l.take(), `GPU-1 healthy=false reason="xid=79" action=none xids=[] pending=false failure=false lost=false`)
}

// An XID on one MIG instance is the GPU's new XID too.
func TestFactsOfParts(t *testing.T) {
	l := &factsLog{}
	w, _, _, _ := migWatcher(t, OnFacts(l.add))
	w.Poll()
	l.take()
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 94, MIG: &nvml.Instance{GPUInstance: 2, ComputeInstance: 0}})
	wantFacts(t, l.take(), `GPU-0 healthy=true reason="" action=none xids=[94] pending=false failure=false lost=false`)
}

// ClearSticky drops a GPU's XID and ECC conditions, its parts' too, saves
// the sticky set without them and reports the GPU healthy; another GPU's
// stay.
func TestClearSticky(t *testing.T) {
	var saved [][]StickyCondition
	w, _, r, l := factsWatcher(t, 2, OnStickyChange(func(c []StickyCondition) { saved = append(saved, c) }))
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 48})
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventDoubleBitECC})
	r.take()
	l.take()
	w.ClearSticky("GPU-1")
	w.ClearSticky("GPU-9") // not watched: nothing
	w.Poll()
	expect(t, r.take(), change{"GPU-1", true, ""})
	wantFacts(t, l.take(), `GPU-1 healthy=true reason="" action=none xids=[] pending=false failure=false lost=false`)
	if last := saved[len(saved)-1]; len(last) != 1 || last[0].Device != "GPU-0" {
		t.Fatalf("saved %+v, want GPU-0's XID only", last)
	}
	if h, reason := w.State(0); h || reason != "xid=79" {
		t.Fatalf("GPU-0 = %v %q", h, reason)
	}

	m, _, mr, _ := migWatcher(t)
	m.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79, MIG: &nvml.Instance{GPUInstance: 1, ComputeInstance: 0}})
	mr.take()
	m.ClearSticky("GPU-0")
	m.Poll()
	expect(t, mr.take(), change{"MIG-a", true, ""})
}

// ClearSticky also drops what the last poll read of the conditions a
// reset clears (the recovery action, a pending row remap, the GPU lost
// while the reset had it removed): the probe has
// just read them clean, so Facts with the old action, which would start
// a second remediation, are not told when the XID goes. The next poll
// reads them again.
func TestClearStickyDropsWhatTheResetCleared(t *testing.T) {
	w, s, r, l := factsWatcher(t, 1)
	s.set(0, func(x *nvml.Sample) {
		x.RecoveryAction = nvml.RecoveryDrainAndReset
		x.RowRemapPending = true
	})
	w.Poll()
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 94})
	r.take()
	l.take()
	// The reset removed it a while: NVML answered GPU_IS_LOST.
	s.set(0, func(x *nvml.Sample) { x.Lost, x.Err = true, fmt.Errorf("GPU is lost") })
	w.Poll()
	r.take()
	l.take()
	// The reset cleared it all; no poll has read the GPU since.
	s.set(0, func(x *nvml.Sample) {
		x.Lost, x.Err = false, nil
		x.RecoveryAction = nvml.RecoveryNone
		x.RowRemapPending = false
	})
	w.ClearSticky("GPU-0")
	w.applyClears()
	expect(t, r.take(), change{"GPU-0", true, ""})
	wantFacts(t, l.take(), `GPU-0 healthy=true reason="" action=none xids=[] pending=false failure=false lost=false`)
	w.Poll()
	wantFacts(t, l.take())

	// Still asked for after the reset: the next poll says so again.
	s.set(0, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryReset })
	w.ClearSticky("GPU-0")
	w.Poll()
	wantFacts(t, l.take(), `GPU-0 healthy=false reason="recovery-action=reset" action=reset xids=[] pending=false failure=false lost=false`)
}

// Run applies a ClearSticky at once, without waiting for a poll.
func TestClearStickyWakesRun(t *testing.T) {
	w, _, r, _ := factsWatcher(t, 1)
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	w.Poll()
	r.take()
	r.ch = make(chan change, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	w.ClearSticky("GPU-0")
	if c := <-r.ch; c != (change{"GPU-0", true, ""}) {
		t.Fatalf("got %+v", c)
	}
	cancel()
	<-done
}

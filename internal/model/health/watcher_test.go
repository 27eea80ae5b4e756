package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// fakeSampler returns whatever the test set for each GPU.
type fakeSampler struct {
	mu      sync.Mutex
	samples []nvml.Sample
}

func newSampler(n int) *fakeSampler {
	s := &fakeSampler{samples: make([]nvml.Sample, n)}
	for i := range s.samples {
		s.samples[i] = nvml.Sample{TempC: 40, SlowdownC: 90, ShutdownC: 95}
	}
	return s
}

func (s *fakeSampler) Sample(i int) nvml.Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples[i]
}

func (s *fakeSampler) set(i int, f func(*nvml.Sample)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.samples[i])
}

type change struct {
	id      string
	healthy bool
	reason  string
}

type recorder struct {
	mu      sync.Mutex
	changes []change
	ch      chan change
}

func (r *recorder) SetHealth(id string, healthy bool, reason string) bool {
	r.mu.Lock()
	r.changes = append(r.changes, change{id, healthy, reason})
	r.mu.Unlock()
	if r.ch != nil {
		r.ch <- change{id, healthy, reason}
	}
	return true
}

func (r *recorder) take() []change {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.changes
	r.changes = nil
	return out
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newWatcher(t *testing.T, n int, p policy.Policy) (*Watcher, *fakeSampler, *recorder, *clock) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%d", i)
	}
	s, r := newSampler(n), &recorder{}
	w, err := NewWatcher(p, ids, s, r, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_000_000, 0)}
	w.now = c.now
	return w, s, r, c
}

func expect(t *testing.T, got []change, want ...change) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("changes = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("change %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestXIDClasses(t *testing.T) {
	tests := []struct {
		name  string
		xid   uint64
		want  []change
		after []change // changes once XIDRecovery has passed
	}{
		{name: "application XID ignored", xid: 13},
		{name: "ignored list is configurable", xid: 31},
		{name: "fatal XID is sticky", xid: 79, want: []change{{"GPU-1", false, "xid=79"}}},
		{name: "fatal wins over ignore", xid: 48, want: []change{{"GPU-1", false, "xid=48"}}},
		{name: "other XID recovers after quiet period", xid: 61,
			want: []change{{"GPU-1", false, "xid=61"}}, after: []change{{"GPU-1", true, ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy.Default()
			p.FatalXIDs = append(p.FatalXIDs, 48)
			p.IgnoredXIDs = append(p.IgnoredXIDs, 48)
			w, _, r, c := newWatcher(t, 4, p)
			w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: tt.xid})
			expect(t, r.take(), tt.want...)
			c.t = c.t.Add(p.XIDRecovery + time.Second)
			w.Poll()
			expect(t, r.take(), tt.after...)
		})
	}
}

func TestXIDRecoveryZeroIsSticky(t *testing.T) {
	p := policy.Default()
	p.XIDRecovery = 0
	w, _, r, c := newWatcher(t, 2, p)
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 61})
	c.t = c.t.Add(24 * time.Hour)
	w.Poll()
	expect(t, r.take(), change{"GPU-0", false, "xid=61"})
}

func TestStickyXIDNotDowngraded(t *testing.T) {
	p := policy.Default()
	w, _, r, c := newWatcher(t, 1, p)
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 61})
	c.t = c.t.Add(p.XIDRecovery * 2)
	w.Poll()
	expect(t, r.take(), change{"GPU-0", false, "xid=79"})
	if h, _ := w.State(0); h {
		t.Fatal("a transient XID after a fatal one made the GPU healthy")
	}
}

func TestDoubleBitECC(t *testing.T) {
	w, _, r, _ := newWatcher(t, 2, policy.Default())
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventDoubleBitECC})
	w.Poll()
	expect(t, r.take(), change{"GPU-1", false, "ecc=double-bit"})
}

func TestThermalHysteresis(t *testing.T) {
	p := policy.Default()
	w, s, r, _ := newWatcher(t, 2, p)
	poll := func(temp int) []change {
		s.set(0, func(x *nvml.Sample) { x.TempC = temp })
		w.Poll()
		return r.take()
	}
	expect(t, poll(89))
	expect(t, poll(91), change{"GPU-0", false, "thermal=91C>=slowdown 90C"})
	expect(t, poll(93)) // still hot: no new transition, reason kept
	expect(t, poll(87)) // below threshold but inside the margin
	expect(t, poll(84))
	expect(t, poll(84))
	expect(t, poll(86)) // back inside the margin: the count restarts
	expect(t, poll(80))
	expect(t, poll(80))
	expect(t, poll(80), change{"GPU-0", true, ""})
}

func TestHardwareSlowdown(t *testing.T) {
	w, s, r, _ := newWatcher(t, 1, policy.Default())
	poll := func(reasons uint64) []change {
		s.set(0, func(x *nvml.Sample) { x.Reasons = reasons })
		w.Poll()
		return r.take()
	}
	const slow = nvml.ReasonHWSlowdown | nvml.ReasonHWPowerBrake | 0x4
	// Two samples and a clear one: a flicker under load, not a slowdown.
	expect(t, poll(slow))
	expect(t, poll(slow))
	expect(t, poll(0))
	expect(t, poll(slow))
	expect(t, poll(slow))
	expect(t, poll(slow), change{"GPU-0", false, "hw-slowdown+hw-power-brake"})
	expect(t, poll(0x4)) // software power cap only
	expect(t, poll(0x4))
	expect(t, poll(0x4), change{"GPU-0", true, ""})
}

func TestLostGPU(t *testing.T) {
	w, s, r, _ := newWatcher(t, 3, policy.Default())
	s.set(2, func(x *nvml.Sample) {
		x.Err, x.Lost = fmt.Errorf("reading temperature: %w", gonvml.ERROR_GPU_IS_LOST), true
	})
	w.Poll()
	expect(t, r.take(), change{"GPU-2", false, "gpu-lost"})
	s.set(2, func(x *nvml.Sample) { x.Err, x.Lost = nil, false })
	for range 3 {
		w.Poll()
	}
	expect(t, r.take(), change{"GPU-2", true, ""})
}

func TestOneFailedReadLeavesHealthAlone(t *testing.T) {
	w, s, r, _ := newWatcher(t, 3, policy.Default())
	s.set(1, func(x *nvml.Sample) { x.Err = errors.New("reading temperature: Unknown Error") })
	w.Poll()
	expect(t, r.take())
}

func failAll(x *nvml.Sample) {
	x.Err, x.Failed = fmt.Errorf("reading temperature: %w", gonvml.ERROR_UNKNOWN), nvml.AllSignals
}

func TestNVMLFailureTakesEveryGPU(t *testing.T) {
	w, s, r, _ := newWatcher(t, 2, policy.Default())
	for i := range 2 {
		s.set(i, failAll)
	}
	for range policy.DefaultNVMLFailurePolls - 1 {
		w.Poll()
		expect(t, r.take())
	}
	w.Poll()
	got := r.take()
	if len(got) != 2 || got[0].healthy || got[1].healthy || !strings.HasPrefix(got[0].reason, "nvml: ") {
		t.Fatalf("changes = %+v", got)
	}
	for i := range 2 {
		s.set(i, func(x *nvml.Sample) { x.Err, x.Failed = nil, 0 })
	}
	w.Poll()
	expect(t, r.take(), change{"GPU-0", true, ""}, change{"GPU-1", true, ""})
}

func TestOneGPUNodeSurvivesTransientErrors(t *testing.T) {
	w, s, r, _ := newWatcher(t, 1, policy.Default())
	for range 5 {
		// Failing polls short of the count, each followed by a good one.
		for range policy.DefaultNVMLFailurePolls - 1 {
			s.set(0, failAll)
			w.Poll()
		}
		s.set(0, func(x *nvml.Sample) { x.Err, x.Failed = nil, 0 })
		w.Poll()
	}
	expect(t, r.take())
}

func TestReasonsCombine(t *testing.T) {
	w, s, r, _ := newWatcher(t, 1, policy.Default())
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	s.set(0, func(x *nvml.Sample) { x.TempC = 95 })
	w.Poll()
	expect(t, r.take(), change{"GPU-0", false, "xid=79"}, change{"GPU-0", false, "xid=79, thermal=95C>=slowdown 90C"})
}

func TestRunReportsEventsAtOnceAndStops(t *testing.T) {
	p := policy.Default()
	p.PollInterval = time.Hour
	w, _, r, _ := newWatcher(t, 2, p)
	r.ch = make(chan change, 4)
	events := make(chan nvml.Event)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, events); close(done) }()
	events <- nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 79}
	select {
	case c := <-r.ch:
		if c != (change{"GPU-1", false, "xid=79"}) {
			t.Fatalf("change = %+v", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("event not reported")
	}
	cancel()
	<-done
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*policy.Policy)
		valid bool
	}{
		{name: "default", edit: func(*policy.Policy) {}, valid: true},
		{name: "zero counts mean the defaults", edit: func(p *policy.Policy) { p.SlowdownSamples, p.NVMLFailurePolls = 0, 0 }, valid: true},
		{name: "every check disabled", edit: func(p *policy.Policy) { p.Disabled = policy.Checks() }, valid: true},
		{name: "zero recovery polls", edit: func(p *policy.Policy) { p.RecoveryPolls = 0 }},
		{name: "negative slowdown samples", edit: func(p *policy.Policy) { p.SlowdownSamples = -1 }},
		{name: "negative NVML failure polls", edit: func(p *policy.Policy) { p.NVMLFailurePolls = -1 }},
		{name: "unknown check", edit: func(p *policy.Policy) { p.Disabled = []string{"thermal", "hw_slowdown"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy.Default()
			tt.edit(&p)
			_, err := NewWatcher(p, nil, newSampler(0), &recorder{}, nil, nil)
			if (err == nil) != tt.valid {
				t.Fatalf("NewWatcher: err = %v, want valid %v", err, tt.valid)
			}
		})
	}
}

package dra

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// fakeClock is the driver's clock and AfterFunc: timers fire, in order and
// on the caller's goroutine, only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Time
	f    func()
	done bool
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// advance moves the clock by d, firing the timers due on the way.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.done && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		next.done = true
		c.now = next.at
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
}

// pending is how long until each live timer fires.
func (c *fakeClock) pending() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, t := range c.timers {
		if !t.done {
			out = append(out, t.at.Sub(c.now))
		}
	}
	return out
}

func taintedOf(t *testing.T, pub *fakePublisher) []string {
	t.Helper()
	var out []string
	for _, dv := range pub.last(t) {
		if len(dv.Taints) > 0 {
			out = append(out, dv.Name)
		}
	}
	return out
}

func startedDriver(t *testing.T) (*Driver, *fakePublisher) {
	t.Helper()
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	d.SetGPUs(context.Background(), testGPUs())
	if pub.count() != 1 {
		t.Fatalf("%d publications at start, want 1, at once", pub.count())
	}
	pub.clock.advance(time.Minute)
	return d, pub
}

// A burst of XIDs on one node is one slice update, made once the burst
// has been quiet for 250 ms.
func TestBurstIsOnePublication(t *testing.T) {
	d, pub := startedDriver(t)
	for i, g := range []string{"GPU-a", "GPU-b", "GPU-c", "GPU-a", "GPU-b"} {
		d.SetHealth(g, false, fmt.Sprintf("xid=%d", 79+i))
		pub.clock.advance(100 * time.Millisecond)
	}
	// Last change at 400 ms; quiet until 650 ms.
	pub.clock.advance(149 * time.Millisecond)
	if pub.count() != 1 {
		t.Fatalf("published during the burst: %d", pub.count())
	}
	pub.clock.advance(time.Millisecond)
	if pub.count() != 2 {
		t.Fatalf("%d publications once the burst was quiet, want 2", pub.count())
	}
	if got := taintedOf(t, pub); !slices.Equal(got, []string{"gpu-0", "gpu-1", "gpu-2"}) {
		t.Errorf("tainted %v, want every GPU of the burst", got)
	}
	pub.clock.advance(time.Hour)
	if pub.count() != 2 {
		t.Errorf("%d publications an hour later, want 2", pub.count())
	}
}

// A change that does not stop is published once a second, each change at
// most a second after it happened.
func TestStormPublishesOnceASecond(t *testing.T) {
	d, pub := startedDriver(t)
	for i := range 100 { // every 100 ms for 10 s
		d.SetHealth("GPU-a", false, fmt.Sprintf("xid=%d", 13+i%2))
		if w := pub.clock.pending(); len(w) != 1 || w[0] > DefaultPublishMaxDelay {
			t.Fatalf("change %d: timers %v, want one within a second", i, w)
		}
		pub.clock.advance(100 * time.Millisecond)
	}
	if n := pub.count() - 1; n != 10 {
		t.Errorf("%d publications in 10 s of changes every 100 ms, want 10", n)
	}
	pub.clock.advance(DefaultPublishMaxDelay)
	if got := byName(pub.last(t))["gpu-0"].Taints; len(got) != 1 || got[0].Value != "14" {
		t.Errorf("last publication's taints %+v, want the last change's xid=14", got)
	}
	if n := pub.count() - 1; n > 11 {
		t.Errorf("%d publications for 10 s of storm", n)
	}
}

// A lone change after a quiet spell waits only the quiet time; one just
// after a publication waits until a second after it.
func TestLoneChangeDelay(t *testing.T) {
	d, pub := startedDriver(t)
	d.SetHealth("GPU-b", false, "xid=79")
	if w := pub.clock.pending(); len(w) != 1 || w[0] != DefaultPublishQuiet {
		t.Fatalf("timers %v, want one of %v", w, DefaultPublishQuiet)
	}
	pub.clock.advance(DefaultPublishQuiet)
	if pub.count() != 2 {
		t.Fatalf("%d publications", pub.count())
	}
	pub.clock.advance(100 * time.Millisecond)
	d.SetHealth("GPU-b", true, "")
	if w := pub.clock.pending(); len(w) != 1 || w[0] != 900*time.Millisecond {
		t.Fatalf("timers %v, want one at a second after the last publication", w)
	}
}

// Slices are published again only when they change: the same health, a
// flap that ends where it began, the same GPUs or NICs again, none makes
// a publication.
func TestNoRepublishAtRest(t *testing.T) {
	d, pub := startedDriver(t)
	ctx := context.Background()
	for range 100 {
		if d.SetHealth("GPU-a", true, "") {
			t.Fatal("the same health counted as a change")
		}
	}
	d.SetHealth("GPU-a", false, "xid=79")
	d.SetHealth("GPU-a", true, "")
	pub.settle()
	d.SetGPUs(ctx, testGPUs())
	nic := sysfs.NIC{Address: "0000:0c:00.0", Vendor: "15b3", Device: "1021"}
	pool := draslice.NICPool{Name: "example.com/rdma", NICs: []sysfs.NIC{nic}}
	d.SetNICPool(ctx, pool, []device.Device{{ID: nic.Address, Healthy: true}}, true)
	if pub.count() != 2 {
		t.Fatalf("%d publications, want 2 (start, the NIC pool)", pub.count())
	}
	d.SetNICPool(ctx, pool, []device.Device{{ID: nic.Address, Healthy: true}}, false)
	pub.clock.advance(24 * time.Hour)
	if pub.count() != 2 {
		t.Errorf("%d publications after a day at rest, want 2", pub.count())
	}
}

// A publication made at once (a source reporting) carries the pending
// changes and takes the place of the debounced one.
func TestImmediatePublicationCarriesPendingChanges(t *testing.T) {
	d, pub := startedDriver(t)
	d.SetHealth("GPU-c", false, "xid=79")
	d.SetGPUs(context.Background(), testGPUs())
	if pub.count() != 2 || !slices.Equal(taintedOf(t, pub), []string{"gpu-2"}) {
		t.Fatalf("%d publications, tainted %v", pub.count(), taintedOf(t, pub))
	}
	if w := pub.clock.pending(); len(w) != 0 {
		t.Errorf("timers %v left after the publication", w)
	}
	pub.settle()
	if pub.count() != 2 {
		t.Errorf("%d publications, want 2", pub.count())
	}
}

// Nothing is published once the publisher's context has ended.
func TestNoPublicationAfterStop(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	ctx, cancel := context.WithCancel(context.Background())
	d.SetPublisher(ctx, pub)
	d.SetGPUs(ctx, testGPUs())
	n := pub.count()
	d.SetHealth("GPU-a", false, "xid=79")
	cancel()
	pub.settle()
	if pub.count() != n {
		t.Errorf("published after the context ended")
	}
}

type chanPublisher chan slicepub.DriverResources

func (c chanPublisher) PublishResources(_ context.Context, r slicepub.DriverResources) error {
	c <- r
	return nil
}

// Without a test clock the debounce runs on time.AfterFunc.
func TestDebounceOnRealTimers(t *testing.T) {
	d, err := New(Options{
		DriverName: testDriver, NodeName: testNode, SysfsRoot: fakeSysfs(t), Sources: 1,
		GPUCDIID: func(string) string { return "" }, NICCDIID: func(string, string) string { return "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	pub := make(chanPublisher, 4)
	d.SetPublisher(context.Background(), pub)
	d.SetGPUs(context.Background(), testGPUs())
	<-pub
	d.SetHealth("GPU-a", false, "xid=79")
	select {
	case r := <-pub:
		if ts := r.Pools[testNode].Slices[0].Devices[0].Taints; len(ts) != 1 {
			t.Errorf("taints %+v", ts)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the change was never published")
	}
}

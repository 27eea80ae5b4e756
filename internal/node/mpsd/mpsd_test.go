package mpsd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// fakeClock hands out timers that fire when the test says.
type fakeClock struct {
	mu      sync.Mutex
	waiters []waiter
	added   chan struct{}
}

type waiter struct {
	d  time.Duration
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{added: make(chan struct{}, 1)} }

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.waiters = append(c.waiters, waiter{d, ch})
	c.mu.Unlock()
	select {
	case c.added <- struct{}{}:
	default:
	}
	return ch
}

// fire waits for a timer of d and fires it.
func (c *fakeClock) fire(t *testing.T, d time.Duration) {
	t.Helper()
	c.await(t, d, true)
}

// await waits for a timer of d to be started, and fires it if told to.
func (c *fakeClock) await(t *testing.T, d time.Duration, fire bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		i := slices.IndexFunc(c.waiters, func(w waiter) bool { return w.d == d })
		if i >= 0 {
			w := c.waiters[i]
			if fire {
				c.waiters = slices.Delete(c.waiters, i, i+1)
			}
			c.mu.Unlock()
			if fire {
				w.ch <- time.Time{}
			}
			return
		}
		c.mu.Unlock()
		select {
		case <-c.added:
		case <-deadline:
			t.Fatalf("no timer of %v was started", d)
		}
	}
}

func waitState(t *testing.T, m *Manager, uuid string, up bool) State {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if s, ok := m.State(uuid); ok && s.Up == up {
			return s
		}
		select {
		case <-m.Changes():
		case <-deadline:
			s, ok := m.State(uuid)
			t.Fatalf("%s: state %+v (%v), want up %v", uuid, s, ok, up)
		}
	}
}

func recorded(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

const (
	probe   = 10 * time.Second
	backoff = time.Second
)

func newManager(t *testing.T, bin string) (*Manager, *fakeClock, string) {
	root := filepath.Join(t.TempDir(), "mps")
	clk := newFakeClock()
	m := New(Options{Binary: bin, Root: root, Clock: clk, ProbeInterval: probe, MinBackoff: backoff, MaxBackoff: 4 * backoff, StopGrace: time.Second})
	t.Cleanup(func() { m.Set(context.Background(), nil) }) // no daemon left behind by a failed test
	return m, clk, root
}

func TestLimits(t *testing.T) {
	for _, tt := range []struct {
		g       GPU
		percent int
		mib     uint64
	}{
		{GPU{Replicas: 8, Memory: 80 << 30}, 12, 10240},
		{GPU{Replicas: 8, MaxShares: 1, Memory: 80 << 30}, 12, 10240},
		{GPU{Replicas: 8, MaxShares: 3, Memory: 80 << 30}, 37, 30720},
		{GPU{Replicas: 3, MaxShares: 3, Memory: 80 << 30}, 100, 81920},
		{GPU{Replicas: 3, MaxShares: 9}, 100, 0},
		// A DRA claim's own limits.
		{GPU{Replicas: 1, MaxShares: 1, ThreadPercentage: 30, Memory: 10 << 30}, 30, 10240},
	} {
		if p, m := tt.g.DefaultThreadPercentage(), tt.g.DefaultMemoryMiB(); p != tt.percent || m != tt.mib {
			t.Errorf("%+v: %d%%, %d MiB; want %d%%, %d MiB", tt.g, p, m, tt.percent, tt.mib)
		}
	}
}

// modes records the compute modes a manager sets.
type modes struct {
	mu  sync.Mutex
	set []string
}

func (c *modes) ComputeMode(uuid string, exclusive bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set = append(c.set, fmt.Sprintf("%s %v", uuid, exclusive))
	return nil
}

func (c *modes) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.set)
}

// started is what a daemon started for GPU{Replicas: 4, Memory: 80 GiB}
// is told: its limits, read back.
var started = []string{"start", "set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 0 20480M",
	"get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"}

// A daemon outlives the process that started it: the next one adopts it
// and gives it its limits in place (no restart, so its clients keep
// running); new limits are given in place too; and it is stopped when its
// GPU is no longer shared.
func TestAdoptAcrossRestarts(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	record := filepath.Join(t.TempDir(), "record")
	t.Setenv("MOCKMPS_RECORD", record)
	root := filepath.Join(t.TempDir(), "mps")
	cm := &modes{}
	manager := func() *Manager {
		return New(Options{Binary: bin, Root: root, Clock: newFakeClock(), ProbeInterval: probe, MinBackoff: backoff, ComputeMode: cm.ComputeMode, StopGrace: time.Second})
	}
	g := GPU{UUID: "GPU-a", Replicas: 4, Memory: 80 << 30}

	ctx, cancel := context.WithCancel(t.Context())
	first := manager()
	first.Set(ctx, []GPU{g})
	waitState(t, first, g.UUID, true)
	cancel() // the process ends; the daemon stays
	t.Cleanup(func() { manager().Set(context.Background(), nil) })

	ctx2, cancel2 := context.WithCancel(t.Context())
	second := manager()
	second.Set(ctx2, []GPU{g})
	waitState(t, second, g.UUID, true)
	adopted := []string{"get_default_active_thread_percentage", "get_server_list", "set_default_active_thread_percentage 25",
		"set_default_device_pinned_mem_limit 0 20480M", "get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"}
	if got := recorded(t, record); !slices.Equal(got, append(slices.Clone(started), adopted...)) {
		t.Errorf("adopting: told %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, g.UUID, "shm")); err != nil {
		t.Errorf("shared memory directory: %v", err)
	}

	// Other limits: given in place, no restart.
	g.Replicas = 2
	n := len(recorded(t, record))
	second.Set(ctx2, []GPU{g})
	want := []string{"get_server_list", "set_default_active_thread_percentage 50", "set_default_device_pinned_mem_limit 0 40960M",
		"get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"}
	awaitRecorded(t, record, n+len(want))
	if got := recorded(t, record)[n:]; !slices.Equal(got, want) {
		t.Errorf("new limits: told %q, want %q", got, want)
	}
	cancel2()

	// A Set after the daemons' ctx ended still stops what it no longer
	// lists, as a test's cleanup does after its context is done.
	ctx3, cancel3 := context.WithCancel(t.Context())
	third := manager()
	third.Set(ctx3, []GPU{g})
	waitState(t, third, g.UUID, true)
	cancel3()
	third.Set(context.Background(), nil)
	if got := recorded(t, record); got[len(got)-1] != "quit -t 1" {
		t.Errorf("a Set after ctx ended did not stop the daemon: told %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, g.UUID)); !os.IsNotExist(err) {
		t.Errorf("directories left: %v", err)
	}
	if got := cm.got(); !slices.Contains(got, "GPU-a true") || got[len(got)-1] != "GPU-a false" {
		t.Errorf("compute modes set: %q", got)
	}
}

// awaitRecorded waits until the daemon has recorded n commands.
func awaitRecorded(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(recorded(t, path)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("recorded %q, want %d commands", recorded(t, path), n)
		}
		// Another process writes it: asked again shortly.
		<-time.After(5 * time.Millisecond)
	}
}

// A daemon is started with its limits, killed, seen down, restarted after
// the backoff with its limits again, and stopped with its directories
// removed when its GPU is no longer shared.
func TestDaemonLifecycle(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	record := filepath.Join(t.TempDir(), "record")
	t.Setenv("MOCKMPS_RECORD", record)
	m, clk, root := newManager(t, bin)
	ctx := t.Context()
	g := GPU{UUID: "GPU-a", Replicas: 4, Memory: 80 << 30}

	m.Set(ctx, []GPU{g})
	waitState(t, m, g.UUID, true)
	if got := recorded(t, record); !slices.Equal(got, started) {
		t.Fatalf("told %q, want %q", got, started)
	}
	if log := recorded(t, filepath.Join(m.LogDir(g.UUID), "control.log")); !slices.Equal(log, started) {
		t.Errorf("the GPU's own log dir has %q", log)
	}
	clk.fire(t, probe)         // answers: still up,
	clk.await(t, probe, false) // and waits for the next probe
	pipe := m.PipeDir(g.UUID)
	pipeInode := inode(t, pipe)

	b, err := os.ReadFile(filepath.Join(pipe, "nvidia-cuda-mps-control.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	clk.fire(t, probe)
	s := waitState(t, m, g.UUID, false)
	if s.Reason != ReasonDown || s.Err == nil {
		t.Errorf("dead daemon: %+v", s)
	}
	clk.fire(t, backoff)
	waitState(t, m, g.UUID, true)
	if got := recorded(t, record); !slices.Equal(got, append(append(slices.Clone(started), "get_default_active_thread_percentage"), started...)) {
		t.Errorf("after the restart, told %q", got)
	}
	if inode(t, pipe) != pipeInode {
		t.Error("the pipe directory was replaced: clients' mounts would not see the new daemon")
	}

	if st := m.Query(g.UUID); !st.Up || st.Servers != 0 || st.Clients != 0 || st.Err != nil {
		t.Errorf("query of a daemon up: %+v", st)
	}
	m.Set(ctx, nil)
	if _, ok := m.State(g.UUID); ok {
		t.Error("a state after sharing was turned off")
	}
	if st := m.Query(g.UUID); st.Up || st.Err == nil {
		t.Errorf("query of a daemon stopped: %+v", st)
	}
	if got := recorded(t, record); got[len(got)-1] != "quit -t 1" {
		t.Errorf("not told quit: %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, g.UUID)); !os.IsNotExist(err) {
		t.Errorf("directories left: %v", err)
	}
}

// A daemon that does not start keeps its GPU down, retried with doubling
// backoff up to the maximum; its replicas changing restarts it.
func TestStartFailure(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho no GPU >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, clk, root := newManager(t, bin)
	g := GPU{UUID: "GPU-b", Replicas: 2}
	m.Set(t.Context(), []GPU{g})
	for _, d := range []time.Duration{backoff, 2 * backoff, 4 * backoff, 4 * backoff} {
		clk.fire(t, d)
	}
	s := waitState(t, m, g.UUID, false)
	if s.Reason != ReasonDown || s.Err == nil || !strings.Contains(s.Err.Error(), "no GPU") {
		t.Errorf("state %+v", s)
	}
	m.Set(t.Context(), nil)
	if _, err := os.Stat(filepath.Join(root, g.UUID)); !os.IsNotExist(err) {
		t.Errorf("directories left: %v", err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestMissingBinaryWarnsOncePerStep: a failure every GPU meets (here no MPS
// binary) is one warning at each step of the backoff, not one per GPU; the
// others are at debug level.
func TestMissingBinaryWarnsOncePerStep(t *testing.T) {
	var logs logtest.Buffer
	root := filepath.Join(t.TempDir(), "mps")
	clk := newFakeClock()
	m := New(Options{Binary: filepath.Join(t.TempDir(), "nvidia-cuda-mps-control"), Root: root, Clock: clk, ProbeInterval: probe,
		MinBackoff: backoff, MaxBackoff: 8 * backoff, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Cleanup(func() { m.Set(context.Background(), nil) })
	gpus := []GPU{{UUID: "GPU-a", Replicas: 2}, {UUID: "GPU-b", Replicas: 2}, {UUID: "GPU-c", Replicas: 2}, {UUID: "GPU-d", Replicas: 2}}
	m.Set(t.Context(), gpus)
	// Each step's wait is its own length, so no GPU's next wait is taken
	// for another's.
	steps := []time.Duration{backoff, 2 * backoff, 4 * backoff}
	for _, d := range steps {
		for range gpus { // every GPU failed and waits d: each has logged
			clk.await(t, d, true)
		}
	}
	clk.awaitAll(t, 8*backoff, len(gpus))
	out := logs.String()
	warn := strings.Count(out, `level=WARN msg="MPS control daemon did not start`)
	debug := strings.Count(out, `level=DEBUG msg="MPS control daemon did not start`)
	if want := len(steps) + 1; warn != want || debug != want*(len(gpus)-1) {
		t.Errorf("%d warnings and %d debug lines, want %d and %d (one warning a step, for %d GPUs):\n%s", warn, debug, want, want*(len(gpus)-1), len(gpus), out)
	}
}

// awaitAll waits until n timers of d are started, firing none.
func (c *fakeClock) awaitAll(t *testing.T, d time.Duration, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		k := 0
		for _, w := range c.waiters {
			if w.d == d {
				k++
			}
		}
		c.mu.Unlock()
		if k >= n {
			return
		}
		select {
		case <-c.added:
		case <-deadline:
			t.Fatalf("%d timers of %v started, want %d", k, d, n)
		}
	}
}

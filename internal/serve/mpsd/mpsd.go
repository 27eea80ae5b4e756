// Package mpsd runs and watches one MPS control daemon per GPU shared
// through MPS: the driver's nvidia-cuda-mps-control, started with -d and
// CUDA_VISIBLE_DEVICES naming the GPU, its pipe and log directories under
// <root>/<uuid>/, the default limits of its clients set to one replica's
// share. A daemon that stops answering is reported down and restarted
// with backoff; one no longer wanted is told quit and its directories
// removed.
//
// Death is detected by asking the daemon through its own control client
// (get_default_active_thread_percentage) every probe interval, not by
// waiting on a process: -d forks, so the daemon is not our child, and a
// pid file can outlive its process or name a reused pid. The control pipe
// answering is also exactly what a client needs from it.
package mpsd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ReasonDown is the health reason of a GPU whose daemon is not running.
const ReasonDown = "mps-daemon-down"

// GPU is one GPU to share through MPS.
type GPU struct {
	UUID string
	// Replicas is how many shares the GPU is served as; each client's
	// default limits are one share: 100/Replicas percent of the threads
	// and Memory/Replicas of the memory.
	Replicas int
	// Memory is the GPU's memory in bytes; 0 sets no memory limit.
	Memory uint64
}

// DefaultThreadPercentage is one share's percentage of a GPU's threads.
func (g GPU) DefaultThreadPercentage() int { return 100 / g.Replicas }

// DefaultMemoryMiB is one share's pinned memory in MiB; 0 for none.
func (g GPU) DefaultMemoryMiB() uint64 { return g.Memory / uint64(g.Replicas) >> 20 }

// Clock is the time the manager waits on; tests pass a fake.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Options configure a Manager.
type Options struct {
	// Binary is nvidia-cuda-mps-control's path.
	Binary string
	// Root holds each GPU's directories: <Root>/<uuid>/pipe and /log.
	Root string
	// ProbeInterval is how often each daemon is asked whether it
	// answers; 0: 10s.
	ProbeInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart, doubled
	// at each failure in a row; 0: 1s and 1m.
	MinBackoff, MaxBackoff time.Duration
	// CommandTimeout bounds each run of the binary; 0: 30s.
	CommandTimeout time.Duration
	Clock          Clock
	Log            *slog.Logger
}

// State is one GPU's daemon as last seen.
type State struct {
	Up bool
	// Reason is ReasonDown while not up; Err the last failure.
	Reason string
	Err    error
}

// Manager runs the daemons of the GPUs last Set.
type Manager struct {
	o       Options
	changes chan struct{}

	mu      sync.Mutex
	daemons map[string]*daemon
	states  map[string]State
}

type daemon struct {
	gpu    GPU
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Manager running no daemon.
func New(o Options) *Manager {
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 10 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = 30 * time.Second
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{o: o, changes: make(chan struct{}, 1), daemons: map[string]*daemon{}, states: map[string]State{}}
}

// Changes receives after any daemon's state changes (coalesced: read
// State after each receive).
func (m *Manager) Changes() <-chan struct{} { return m.changes }

// State is the GPU's daemon state; false when it has none.
func (m *Manager) State(uuid string) (State, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.states[uuid]
	return s, ok
}

// PipeDir is the GPU's pipe directory, which clients mount: its inode
// stays the same across restarts, so their mounts see the next daemon.
func (m *Manager) PipeDir(uuid string) string { return filepath.Join(m.o.Root, uuid, "pipe") }

// LogDir is the GPU's log directory.
func (m *Manager) LogDir(uuid string) string { return filepath.Join(m.o.Root, uuid, "log") }

// Set makes the running daemons those of gpus: it stops (quit, and
// directories removed) those of GPUs no longer listed or whose replicas
// or memory changed, then starts the others, each reported down until
// its first start succeeds. The daemons live until ctx ends or the next
// Set; Set returns once the stopped ones are gone. Stop with Set(ctx, nil).
func (m *Manager) Set(ctx context.Context, gpus []GPU) {
	want := map[string]GPU{}
	for _, g := range gpus {
		want[g.UUID] = g
	}
	m.mu.Lock()
	var stopping []*daemon
	for uuid, d := range m.daemons {
		if g, ok := want[uuid]; !ok || g != d.gpu {
			d.cancel()
			stopping = append(stopping, d)
			delete(m.daemons, uuid)
		}
	}
	m.mu.Unlock()
	for _, d := range stopping {
		<-d.done
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, uuid := range slices.Sorted(maps.Keys(want)) {
		if _, running := m.daemons[uuid]; running {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		d := &daemon{gpu: want[uuid], cancel: cancel, done: make(chan struct{})}
		m.daemons[uuid] = d
		m.states[uuid] = State{Reason: ReasonDown, Err: errors.New("not started yet")}
		go m.run(dctx, d)
	}
	m.notify()
}

func (m *Manager) notify() {
	select {
	case m.changes <- struct{}{}:
	default:
	}
}

func (m *Manager) setState(uuid string, s State) {
	m.mu.Lock()
	old, had := m.states[uuid]
	m.states[uuid] = s
	m.mu.Unlock()
	if !had || old.Up != s.Up {
		m.notify()
	}
}

// run keeps one GPU's daemon up until ctx ends, then stops it.
func (m *Manager) run(ctx context.Context, d *daemon) {
	defer close(d.done)
	g, log := d.gpu, m.o.Log.With("gpu", d.gpu.UUID)
	backoff := m.o.MinBackoff
	for ctx.Err() == nil {
		if err := m.start(ctx, g); err != nil {
			log.Warn("MPS control daemon did not start; its shares are withheld", "err", err, "retryIn", backoff)
			_ = m.quit(g) // a half-started daemon
			m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
			if !m.wait(ctx, backoff) {
				break
			}
			backoff = min(2*backoff, m.o.MaxBackoff)
			continue
		}
		backoff = m.o.MinBackoff
		log.Info("MPS control daemon up", "threadPercentage", g.DefaultThreadPercentage(), "pinnedMemoryMiB", g.DefaultMemoryMiB())
		m.setState(g.UUID, State{Up: true})
		err := m.watch(ctx, g)
		if ctx.Err() != nil {
			break
		}
		log.Warn("MPS control daemon stopped answering; its shares are withheld until it is restarted", "err", err)
		m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
		_ = m.quit(g) // one that hangs rather than died
		if !m.wait(ctx, backoff) {
			break
		}
	}
	m.stop(g, log)
}

// wait waits d on the clock; false when ctx ended first.
func (m *Manager) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-m.o.Clock.After(d):
		return true
	}
}

// watch probes the daemon until it fails to answer or ctx ends.
func (m *Manager) watch(ctx context.Context, g GPU) error {
	for m.wait(ctx, m.o.ProbeInterval) {
		if _, err := m.control(g, "get_default_active_thread_percentage"); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// start starts the daemon and sets its clients' default limits. Stale
// files of a dead daemon in the pipe directory are removed first, but not
// the directory, which running clients have mounted.
func (m *Manager) start(ctx context.Context, g GPU) error {
	if g.Replicas < 1 {
		return fmt.Errorf("%d replicas", g.Replicas)
	}
	pipe, logDir := m.PipeDir(g.UUID), m.LogDir(g.UUID)
	for _, dir := range []string{pipe, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("MPS directory: %w", err)
		}
	}
	if err := emptyDir(pipe); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, m.o.CommandTimeout)
	defer cancel()
	// Output goes to a file, not a pipe: the forked daemon would hold a
	// pipe open and Wait would never return.
	out, err := os.Create(filepath.Join(logDir, "start.log"))
	if err != nil {
		return fmt.Errorf("MPS start log: %w", err)
	}
	defer out.Close()
	cmd := m.command(cctx, g, "-d")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		said, _ := os.ReadFile(out.Name())
		return fmt.Errorf("%s -d: %w: %s", m.o.Binary, err, lastLine(said))
	}
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", g.DefaultThreadPercentage())}
	if mib := g.DefaultMemoryMiB(); mib > 0 {
		// Device 0: CUDA_VISIBLE_DEVICES shows the daemon this GPU alone.
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", mib))
	}
	for _, c := range cmds {
		if _, err := m.control(g, c); err != nil {
			return err
		}
	}
	return nil
}

// stop tells the daemon to quit and removes its directories.
func (m *Manager) stop(g GPU, log *slog.Logger) {
	if err := m.quit(g); err != nil {
		log.Debug("MPS control daemon quit", "err", err)
	}
	if err := os.RemoveAll(filepath.Join(m.o.Root, g.UUID)); err != nil {
		log.Warn("removing the MPS directories", "err", err)
	}
	m.mu.Lock()
	delete(m.states, g.UUID)
	m.mu.Unlock()
	m.notify()
	log.Info("MPS control daemon stopped")
}

func (m *Manager) quit(g GPU) error {
	_, err := m.control(g, "quit")
	return err
}

// control sends one command through the control client, as
// `echo cmd | nvidia-cuda-mps-control` does, and returns its answer.
func (m *Manager) control(g GPU, command string) (string, error) {
	// Not the daemon's ctx: quit must still go out once it has ended.
	ctx, cancel := context.WithTimeout(context.Background(), m.o.CommandTimeout)
	defer cancel()
	cmd := m.command(ctx, g)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("MPS control %q: %w: %s", command, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (m *Manager) command(ctx context.Context, g GPU, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, m.o.Binary, args...)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") || strings.HasPrefix(kv, "CUDA_MPS_")
	})
	cmd.Env = append(env,
		"CUDA_VISIBLE_DEVICES="+g.UUID,
		"CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir(g.UUID),
		"CUDA_MPS_LOG_DIRECTORY="+m.LogDir(g.UUID))
	return cmd
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("MPS pipe directory: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("MPS pipe directory: %w", err)
		}
	}
	return nil
}

// lastLine is the last non-empty line of b, bounded: what a failing
// command said last.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := lines[len(lines)-1]
	if len(l) > 200 {
		l = l[:200] + "…"
	}
	return l
}

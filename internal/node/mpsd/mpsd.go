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

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// ReasonDown is the health reason of a GPU whose daemon is not running.
const ReasonDown = "mps-daemon-down"

// GPU is one GPU to share through MPS.
type GPU struct {
	UUID string
	// Replicas is how many shares the GPU is served as.
	Replicas int
	// MaxShares is the most shares one container may be given (0: 1).
	// Each client's limits, which the daemon enforces whatever the
	// client's environment says, are that many shares: MaxShares/Replicas
	// of the threads and of Memory. A container's own environment narrows
	// them to the shares it holds.
	MaxShares int
	// Memory is the GPU's memory in bytes; 0 sets no memory limit.
	Memory uint64
	// ThreadPercentage, when set, is each client's share of the threads
	// in place of the replicas' (a DRA claim's own limit).
	ThreadPercentage int
}

func (g GPU) maxShares() int { return min(max(g.MaxShares, 1), max(g.Replicas, 1)) }

// DefaultThreadPercentage is the percentage of the GPU's threads the
// daemon allows each client.
func (g GPU) DefaultThreadPercentage() int {
	if g.ThreadPercentage > 0 {
		return min(g.ThreadPercentage, 100)
	}
	return max(100*g.maxShares()/max(g.Replicas, 1), 1)
}

// DefaultMemoryMiB is the pinned memory the daemon allows each client, in
// MiB; 0 for no limit.
func (g GPU) DefaultMemoryMiB() uint64 {
	return g.Memory * uint64(g.maxShares()) / uint64(max(g.Replicas, 1)) >> 20
}

// Dirs are one GPU's directories as this process sees them.
type Dirs struct{ Pipe, Log, Shm string }

// Clock is the time the manager waits on; tests pass a fake.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Options configure a Manager.
type Options struct {
	// Binary is nvidia-cuda-mps-control's path, run directly when Command
	// is nil.
	Binary string
	// Command, when set, builds each run of the control program: env
	// (CUDA_VISIBLE_DEVICES) and args (-d, or none for the control
	// client) for the GPU with dirs. The daemon must see dirs.Shm as its
	// /dev/shm, which the containers get mounted there: production runs
	// it confined (package mpsexec). Run directly, it uses this process's
	// /dev/shm, which only tests may.
	Command func(ctx context.Context, dirs Dirs, env []string, args ...string) (*exec.Cmd, error)
	// ComputeMode, when set, puts the GPU in exclusive-process compute
	// mode before its daemon starts, so only the MPS server holds a
	// context on it, and back to default after the daemon is stopped. A
	// GPU whose mode cannot be set gets no daemon: its shares are
	// withheld. IsExclusive reads the mode back at every probe, so that a
	// reset or a driver reload, which puts the default back, is undone.
	ComputeMode func(uuid string, exclusive bool) error
	IsExclusive func(uuid string) (bool, error)
	// Servers, when set, finds the MPS servers running on the GPU with
	// uuid (package mpsd's ProcServers reads /proc). One left by a daemon
	// that died still serves its clients through the pipe directory, so
	// no daemon is started, and the directory is left alone, until it
	// ends.
	Servers func(uuid string) ([]int, error)
	// ShmSize, when set, is the size in bytes of a tmpfs mounted on each
	// GPU's shared-memory directory: its clients' /dev/shm, which they
	// fill no further. 0: a plain directory (tests).
	ShmSize uint64
	// StopGrace bounds how long stopping a daemon waits for its clients
	// to end before its servers are shut down by force; 0: 30s.
	StopGrace time.Duration
	// Root holds each GPU's directories (gpu.MPSDir).
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
	// swept is set once the directories of GPUs no longer shared, left
	// by an earlier process, were cleaned up.
	swept bool
	// changed is closed and replaced at every change of states or
	// daemons, waking every WaitUp.
	changed chan struct{}
	// warned is the start failure warned about at each failure in a row
	// (the backoff's step): one that every GPU meets (a missing binary, no
	// driver) is one warning a step, the other GPUs' at debug level. GPUs
	// drift a step or two apart; older steps are forgotten.
	warned map[int]string
	// held is, by GPU UUID, why a GPU's daemon is held stopped (Hold).
	held map[string]string
}

type daemon struct {
	// gpu is what Set last asked for, guarded by Manager.mu; a change of
	// limits is applied to the running daemon in place.
	gpu    GPU
	cancel context.CancelFunc
	done   chan struct{}
	// poke wakes run after gpu or the GPU's hold changed.
	poke chan struct{}
	// retire is set by Set before cancel: the daemon is stopped, not
	// left running for the next plugin process to adopt. stopped is set
	// once run stopped it.
	retire, stopped bool
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
	if o.StopGrace <= 0 {
		o.StopGrace = 30 * time.Second
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{o: o, changes: make(chan struct{}, 1), daemons: map[string]*daemon{}, states: map[string]State{}, swept: !sweepable(o.Root), changed: make(chan struct{}), warned: map[int]string{}, held: map[string]string{}}
}

// sweepable says whether root may hold daemons of an earlier process.
func sweepable(root string) bool { _, err := os.Stat(root); return err == nil }

// Changes receives after any daemon's state changes (coalesced: read
// State after each receive).
func (m *Manager) Changes() <-chan struct{} { return m.changes }

// bumpLocked wakes the WaitUp callers.
func (m *Manager) bumpLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Running says whether the manager runs a daemon for the GPU (up or not).
func (m *Manager) Running(uuid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.daemons[uuid]
	return ok
}

// WaitUp waits until the daemon of the GPU with uuid is up. It fails at
// once when the manager runs none for it, and when ctx ends first, with
// the daemon's last error.
func (m *Manager) WaitUp(ctx context.Context, uuid string) error {
	for {
		m.mu.Lock()
		s := m.states[uuid]
		_, running := m.daemons[uuid]
		ch := m.changed
		m.mu.Unlock()
		switch {
		case s.Up && running:
			return nil
		case !running:
			return fmt.Errorf("no MPS control daemon is run for GPU %s", uuid)
		}
		select {
		case <-ctx.Done():
			if s.Err != nil {
				return fmt.Errorf("the MPS control daemon of GPU %s is not up: %w", uuid, s.Err)
			}
			return fmt.Errorf("the MPS control daemon of GPU %s is not up yet: %w", uuid, ctx.Err())
		case <-ch:
		}
	}
}

// Up says, by GPU UUID, which daemons are up.
func (m *Manager) Up() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.states))
	for uuid, s := range m.states {
		out[uuid] = s.Up
	}
	return out
}

// Status is what a GPU's daemon says of itself through its control
// client.
type Status struct {
	// Up: the daemon answered.
	Up bool
	// Servers and Clients count its MPS servers (one per user running
	// clients) and their client processes.
	Servers, Clients int
	Err              error
}

// Query asks the daemon of the GPU with uuid, whether or not this Manager
// runs it (list asks those of the serving process).
func (m *Manager) Query(uuid string) Status {
	g := GPU{UUID: uuid}
	out, err := m.control(g, "get_server_list")
	if err != nil {
		return Status{Err: err}
	}
	st := Status{Up: true}
	for _, pid := range strings.Fields(out) {
		st.Servers++
		clients, err := m.control(g, "get_client_list "+pid)
		if err != nil {
			st.Err = err
			continue
		}
		st.Clients += len(strings.Fields(clients))
	}
	return st
}

// State is the GPU's daemon state; false when it has none.
func (m *Manager) State(uuid string) (State, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.states[uuid]
	return s, ok
}

// PipeDir is the GPU's pipe directory, which clients mount: its inode
// stays the same across restarts, so their mounts see the next daemon.
func (m *Manager) PipeDir(uuid string) string { return gpu.MPSDir(m.o.Root, uuid, gpu.MPSPipe) }

// LogDir is the GPU's log directory.
func (m *Manager) LogDir(uuid string) string { return gpu.MPSDir(m.o.Root, uuid, gpu.MPSLog) }

func (m *Manager) dirs(uuid string) Dirs {
	return Dirs{Pipe: m.PipeDir(uuid), Log: m.LogDir(uuid), Shm: gpu.MPSDir(m.o.Root, uuid, gpu.MPSShm)}
}

// Set makes the running daemons those of gpus: it stops (clients given
// StopGrace to end, then quit, and directories removed) those of GPUs no
// longer listed, gives those whose limits changed their new limits in
// place (their running clients keep running), then starts the others,
// each reported down until its first start succeeds. A daemon an earlier
// plugin process left running is adopted, not restarted, so its clients
// keep running across a plugin restart or upgrade; the first Set also
// stops those left for GPUs no longer listed. The daemons stay up when
// ctx ends, for the next process to adopt: stop them with Set(ctx, nil).
// Set returns once the stopped ones are gone.
func (m *Manager) Set(ctx context.Context, gpus []GPU) {
	want := map[string]GPU{}
	for _, g := range gpus {
		want[g.UUID] = g
	}
	m.mu.Lock()
	var stopping []*daemon
	for uuid, d := range m.daemons {
		g, ok := want[uuid]
		switch {
		case !ok:
			d.retire = true
			d.cancel()
			stopping = append(stopping, d)
			delete(m.daemons, uuid)
		case g != d.gpu:
			d.gpu = g
			poke(d.poke)
		}
	}
	sweep := !m.swept
	m.swept = true
	m.mu.Unlock()
	for _, d := range stopping {
		<-d.done
		m.mu.Lock()
		stopped := d.stopped
		m.mu.Unlock()
		if !stopped {
			// Its run ended with its ctx, leaving it up for a next
			// process; this one wants it stopped after all.
			m.stop(d.gpu, m.o.Log.With("gpu", d.gpu.UUID))
		}
	}
	if sweep {
		m.sweep(want)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, uuid := range slices.Sorted(maps.Keys(want)) {
		if _, running := m.daemons[uuid]; running {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		d := &daemon{gpu: want[uuid], cancel: cancel, done: make(chan struct{}), poke: make(chan struct{}, 1)}
		m.daemons[uuid] = d
		m.states[uuid] = State{Reason: ReasonDown, Err: errors.New("not started yet")}
		go m.run(dctx, d)
	}
	m.bumpLocked()
	m.notify()
}

// Hold holds the daemon of the GPU with uuid stopped while held, for
// reason: its servers are shut down by force, so that their clients fail
// at once rather than hang on a faulted GPU and a reset can proceed, and
// the daemon quits. Its directories stay, so the pods that mount them
// reach the daemon started again once the hold is lifted. A hold outlasts
// Set, and applies to a daemon started later.
func (m *Manager) Hold(uuid string, held bool, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, was := m.held[uuid]
	if held == was {
		return
	}
	if held {
		m.held[uuid] = reason
	} else {
		delete(m.held, uuid)
	}
	if d, ok := m.daemons[uuid]; ok {
		poke(d.poke)
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wanted is what d is to run now, and why it is held ("": not held).
func (m *Manager) wanted(d *daemon) (GPU, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	why, held := m.held[d.gpu.UUID]
	return d.gpu, why, held
}

// sweep stops the daemons an earlier process left for GPUs not in want
// (sharing turned off, or the GPU gone) and removes their directories.
func (m *Manager) sweep(want map[string]GPU) {
	entries, err := os.ReadDir(m.o.Root)
	if err != nil {
		return
	}
	for _, e := range entries {
		uuid := e.Name()
		if _, ok := want[uuid]; ok || !e.IsDir() || !strings.HasPrefix(uuid, "GPU-") {
			continue
		}
		log := m.o.Log.With("gpu", uuid)
		log.Info("GPU no longer shared through MPS; stopping the control daemon an earlier run left")
		m.stop(GPU{UUID: uuid}, log)
	}
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
	m.bumpLocked()
	m.mu.Unlock()
	if !had || old.Up != s.Up {
		m.notify()
	}
}

// errHeld ends watch: the GPU's daemon is to be held stopped.
var errHeld = errors.New("held")

// run keeps one GPU's daemon up until ctx ends, then stops it.
func (m *Manager) run(ctx context.Context, d *daemon) {
	defer close(d.done)
	log := m.o.Log.With("gpu", d.gpu.UUID)
	backoff, step := m.o.MinBackoff, 0
	for ctx.Err() == nil {
		g, why, held := m.wanted(d)
		if held {
			m.setState(g.UUID, State{Reason: ReasonDown, Err: fmt.Errorf("held stopped: %s", why)})
			select {
			case <-ctx.Done():
			case <-d.poke:
			}
			continue
		}
		adopted, err := m.start(ctx, g, log)
		if err != nil {
			level := slog.LevelWarn
			if m.warnedAlready(err, step) {
				level = slog.LevelDebug
			}
			step++
			log.Log(ctx, level, "MPS control daemon did not start; its shares are withheld", "err", err, "retryIn", backoff)
			m.undoStart(g, log)
			m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
			if !m.waitOrPoke(ctx, d, backoff) {
				break
			}
			backoff = min(2*backoff, m.o.MaxBackoff)
			continue
		}
		backoff, step = m.o.MinBackoff, 0
		log.Info("MPS control daemon up", "adopted", adopted, "threadPercentage", g.DefaultThreadPercentage(), "pinnedMemoryMiB", g.DefaultMemoryMiB())
		m.setState(g.UUID, State{Up: true})
		err = m.watch(ctx, d, g, log)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errHeld) {
			_, why, _ := m.wanted(d)
			log.Warn("GPU faulted: its MPS servers are shut down by force and its control daemon stopped until it is healthy again", "reason", why)
			m.halt(g, log)
			continue
		}
		log.Warn("MPS control daemon stopped answering; its shares are withheld until it is restarted", "err", err)
		m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
		_ = m.quit(g) // one that hangs rather than died
		if !m.waitOrPoke(ctx, d, backoff) {
			break
		}
	}
	m.mu.Lock()
	retire := d.retire
	d.stopped = retire
	g := d.gpu
	m.mu.Unlock()
	if retire {
		m.stop(g, log)
	}
}

// warnedAlready says whether another GPU's daemon warned of the same
// failure at the same step of its backoff; if not, this one will.
func (m *Manager) warnedAlready(err error, step int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warned[step] == err.Error() {
		return true
	}
	m.warned[step] = err.Error()
	delete(m.warned, step-3)
	return false
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

// waitOrPoke is wait, cut short when d's GPU is held or its limits
// change.
func (m *Manager) waitOrPoke(ctx context.Context, d *daemon, dur time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-m.o.Clock.After(dur):
	case <-d.poke:
	}
	return true
}

// watch probes the daemon until it fails to answer, ctx ends or its GPU
// is held (errHeld), and gives it the new limits Set asks for in place.
// applied is what the daemon was given.
func (m *Manager) watch(ctx context.Context, d *daemon, applied GPU, log *slog.Logger) error {
	tick := m.o.Clock.After(m.o.ProbeInterval)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if err := m.probe(applied, log); err != nil {
				return err
			}
			tick = m.o.Clock.After(m.o.ProbeInterval)
		case <-d.poke:
			g, _, held := m.wanted(d)
			if held {
				return errHeld
			}
			if limitsOf(g) == limitsOf(applied) {
				continue
			}
			if err := m.relimit(g, true); err != nil {
				return fmt.Errorf("giving the daemon new limits: %w", err)
			}
			log.Info("MPS limits changed in place; running clients keep theirs", "threadPercentage", g.DefaultThreadPercentage(), "pinnedMemoryMiB", g.DefaultMemoryMiB())
			applied = g
		}
	}
}

// probe asks the daemon whether it answers, and puts the GPU back in
// exclusive-process mode where a reset or a driver reload took it out.
func (m *Manager) probe(g GPU, log *slog.Logger) error {
	if _, err := m.control(g, "get_default_active_thread_percentage"); err != nil {
		return err
	}
	if m.o.IsExclusive == nil || m.o.ComputeMode == nil {
		return nil
	}
	excl, err := m.o.IsExclusive(g.UUID)
	if err != nil || excl {
		return nil // a failed read changes nothing; the next probe reads again
	}
	log.Warn("the GPU left exclusive-process compute mode (a reset or a driver reload?); setting it again")
	if err := m.o.ComputeMode(g.UUID, true); err != nil {
		return fmt.Errorf("the GPU left exclusive-process compute mode and cannot be put back: %w", err)
	}
	return nil
}

// start starts the daemon and sets its clients' default limits, or adopts
// one an earlier process left that answers, giving it g's limits in
// place (true). The pipe directory is emptied of a dead daemon's files,
// but kept, for running clients have it mounted, and not while a server
// of the dead daemon still runs.
func (m *Manager) start(ctx context.Context, g GPU, log *slog.Logger) (adopted bool, err error) {
	if g.Replicas < 1 {
		return false, fmt.Errorf("%d replicas", g.Replicas)
	}
	dirs := m.dirs(g.UUID)
	if adopted, err := m.adopt(g, dirs, log); adopted || err != nil {
		return adopted, err
	}
	_ = m.quit(g) // one that hangs
	if m.o.Servers != nil {
		pids, err := m.o.Servers(g.UUID)
		if err != nil {
			return false, fmt.Errorf("looking for MPS servers left on the GPU: %w", err)
		}
		if len(pids) > 0 {
			return false, fmt.Errorf("MPS server %v of an earlier control daemon still runs on the GPU and serves its clients; no daemon is started, and its pipe directory is left alone, until it ends (or is killed)", pids)
		}
	}
	for _, dir := range []string{dirs.Pipe, dirs.Log, dirs.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("MPS directory: %w", err)
		}
	}
	if err := m.mountShm(dirs.Shm, log); err != nil {
		return false, err
	}
	// Clients of any user share the memory, as they would /dev/shm.
	if err := os.Chmod(dirs.Shm, 0o1777); err != nil {
		return false, fmt.Errorf("MPS shared memory directory: %w", err)
	}
	if err := emptyDir(dirs.Pipe); err != nil {
		return false, err
	}
	_ = os.Remove(filepath.Join(m.o.Root, g.UUID, limitsFile))
	if err := m.exclusive(g.UUID); err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.o.CommandTimeout)
	defer cancel()
	// Output goes to a file, not a pipe: the forked daemon would hold a
	// pipe open and Wait would never return.
	out, err := os.Create(filepath.Join(dirs.Log, "start.log"))
	if err != nil {
		return false, fmt.Errorf("MPS start log: %w", err)
	}
	defer out.Close()
	cmd, err := m.command(cctx, g, "-d")
	if err != nil {
		return false, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		said, _ := os.ReadFile(out.Name())
		return false, fmt.Errorf("%s -d: %w: %s", m.o.Binary, err, lastLine(said))
	}
	if err := m.relimit(g, false); err != nil {
		return false, err
	}
	if err := m.writeLimits(g); err != nil {
		log.Warn("the limits set were not recorded; a previous release would restart this daemon rather than adopt it", "err", err)
	}
	return false, nil
}

// exclusive puts the GPU in exclusive-process compute mode: without it a
// container that bypasses its daemon gets a context of its own, and the
// whole GPU, so a GPU whose mode cannot be set is not shared.
func (m *Manager) exclusive(uuid string) error {
	if m.o.ComputeMode == nil {
		return nil
	}
	if err := m.o.ComputeMode(uuid, true); err != nil {
		return fmt.Errorf("cannot put the GPU in exclusive-process compute mode, without which a container that bypasses its MPS daemon gets the whole GPU; its shares are withheld: %w", err)
	}
	return nil
}

// undoStart undoes what a failed start left: a half-started daemon, and
// the exclusive compute mode, unless a server of an earlier daemon still
// runs there.
func (m *Manager) undoStart(g GPU, log *slog.Logger) {
	_ = m.quit(g)
	if m.o.ComputeMode == nil {
		return
	}
	if m.o.Servers != nil {
		if pids, err := m.o.Servers(g.UUID); err != nil || len(pids) > 0 {
			return
		}
	}
	if err := m.o.ComputeMode(g.UUID, false); err != nil {
		log.Debug("cannot set the GPU's compute mode back to default after a failed start", "err", err)
	}
}

// adopt takes over a daemon an earlier process left that answers on the
// GPU's pipe: it gets g's limits in place, the GPU exclusive-process mode
// again, and its clients keep running.
func (m *Manager) adopt(g GPU, dirs Dirs, log *slog.Logger) (bool, error) {
	if _, err := os.Stat(dirs.Shm); err != nil {
		return false, nil
	}
	if _, err := m.control(g, "get_default_active_thread_percentage"); err != nil {
		return false, nil
	}
	if err := m.exclusive(g.UUID); err != nil {
		return false, err
	}
	if err := m.relimit(g, true); err != nil {
		return false, fmt.Errorf("adopting the running MPS control daemon: %w", err)
	}
	if m.o.ShmSize > 0 && !isMountPoint(dirs.Shm) {
		log.Info("the daemon's shared memory is a plain directory, as an earlier release made it; it becomes a tmpfs of its own at the daemon's next start")
	}
	if err := m.writeLimits(g); err != nil {
		log.Warn("the limits set were not recorded; a previous release would restart this daemon rather than adopt it", "err", err)
	}
	return true, nil
}

// control sends one command through the control client, as
// `echo cmd | nvidia-cuda-mps-control` does, and returns its answer.
func (m *Manager) control(g GPU, command string) (string, error) {
	// Not the daemon's ctx: quit must still go out once it has ended.
	ctx, cancel := context.WithTimeout(context.Background(), m.o.CommandTimeout)
	defer cancel()
	cmd, err := m.command(ctx, g)
	if err != nil {
		return "", err
	}
	cmd.Stdin = strings.NewReader(command + "\n")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("MPS control %q: %w: %s", command, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (m *Manager) command(ctx context.Context, g GPU, args ...string) (*exec.Cmd, error) {
	dirs, env := m.dirs(g.UUID), []string{"CUDA_VISIBLE_DEVICES=" + g.UUID}
	if m.o.Command != nil {
		return m.o.Command(ctx, dirs, env, args...)
	}
	cmd := exec.CommandContext(ctx, m.o.Binary, args...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") || strings.HasPrefix(kv, "CUDA_MPS_")
	}), append(env,
		"CUDA_MPS_PIPE_DIRECTORY="+dirs.Pipe,
		"CUDA_MPS_LOG_DIRECTORY="+dirs.Log)...)
	return cmd, nil
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

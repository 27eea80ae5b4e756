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
	"context"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
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
	// Root holds each GPU's directories (sharing.MPSDir).
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
	held map[string]map[string]string
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
	return &Manager{o: o, changes: make(chan struct{}, 1), daemons: map[string]*daemon{}, states: map[string]State{}, swept: !sweepable(o.Root), changed: make(chan struct{}), warned: map[int]string{}, held: map[string]map[string]string{}}
}

// sweepable says whether root may hold daemons of an earlier process.
func sweepable(root string) bool { _, err := os.Stat(root); return err == nil }

// bumpLocked wakes the WaitUp callers.
func (m *Manager) bumpLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// PipeDir is the GPU's pipe directory, which clients mount: its inode
// stays the same across restarts, so their mounts see the next daemon.
func (m *Manager) PipeDir(uuid string) string { return sharing.MPSDir(m.o.Root, uuid, sharing.MPSPipe) }

// LogDir is the GPU's log directory.
func (m *Manager) LogDir(uuid string) string { return sharing.MPSDir(m.o.Root, uuid, sharing.MPSLog) }

func (m *Manager) dirs(uuid string) Dirs {
	return Dirs{Pipe: m.PipeDir(uuid), Log: m.LogDir(uuid), Shm: sharing.MPSDir(m.o.Root, uuid, sharing.MPSShm)}
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

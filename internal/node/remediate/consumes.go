package remediate

import (
	"context"
	"time"
)

// What the service consumes, each defined here where it is used: the
// resets and probes, the MPS daemons, the front-end, the reporting, the
// metrics, the state file, the health watcher and the clock.

// Resetter resets GPUs and reads them after; package nvml's is one.
type Resetter interface {
	// Processes counts the compute and graphics processes on the GPU;
	// an error means they are not known (never "none").
	Processes(uuid string) (int, error)
	// Reset resets the GPUs, by UUID, in one go.
	Reset(ctx context.Context, uuids []string) error
	// Verify checks that the GPU reads clean after a reset.
	Verify(uuid string) error
}

// Prober proves a GPU works (the confined CUDA probe).
type Prober interface {
	Probe(ctx context.Context, uuid string) error
}

// MPS is the GPUs' MPS control daemons (package mpsd's Manager).
type MPS interface {
	// Running says whether the GPU's daemon is up now.
	Running(uuid string) bool
	// Stop holds the GPU's daemon stopped until Start, whatever else
	// would start it again.
	Stop(ctx context.Context, uuid string) error
	Start(uuid string)
}

// Evicter evicts the pods holding a GPU: the DRA front-end, whose device
// taints take the NoExecute effect while on. Device-plugin mode has none.
type Evicter interface {
	Evict(uuid string, on bool)
}

// Reporter tells the cluster: Events on the GPU's holders and the Node,
// and the Node condition while the node needs a reboot.
type Reporter interface {
	Event(gpu, reason, msg string)
	NodeReboot(reason string, on bool)
}

// Cordoner keeps this plugin's own Node cordoned while a GPU needs a node
// reboot (package cordon's Keeper). It never blocks: its API calls and
// their retries are its own, and a GPU stays out whether they work or not.
type Cordoner interface {
	// Cordon asks for the Node cordoned, saying why (on); off lifts a
	// cordon of the plugin's own, and no other.
	Cordon(why string, on bool)
}

// Recorder passes the remediation to metrics.
type Recorder interface {
	// Reset counts a reset's result: ResultSuccess or ResultFailure.
	Reset(result string)
	// Recovered counts a GPU given back, and how long it was out.
	Recovered(took time.Duration)
	// State is the GPU's state now.
	State(gpu, state string)
}

// The results Recorder.Reset counts.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"
)

// Store keeps the Machine's state across restarts (package state's Store).
type Store interface {
	Load(v any) (bool, error)
	Save(v any) error
}

// Health is the health watcher, whose conditions from before a proven
// reset are dropped when the GPU is given back.
type Health interface {
	ClearSticky(gpu string)
}

// Clock is the time the service reads and waits on; tests pass a fake.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Package remedy decides, per GPU, how a faulted GPU heals: it drains only
// that GPU (and, where nvidia-smi's NVLink rule requires it, its peers),
// asks for a reset once nothing runs on it, asks for a probe that proves it
// works, and only then gives it back. A GPU that cannot heal this way stays
// out with a reason for a human, or sets "node needs reboot".
//
// It is apart from package health on purpose: health says whether a GPU may
// be offered now, and clears itself; remedy is a plan that outlives health
// turning healthy mid-way (a GPU it has withheld stays out until it has been
// proven and given back), has a budget, and survives restarts.
//
// Machine is a pure state machine, like health's rules: no goroutines, no
// clock (every event carries now), no I/O. Events go in (Fault, Healthy,
// Usage, ResetDone, ProbeDone, Tick, Release) and Commands come out
// (withhold, evict, stop MPS, reset, probe, give back, ask a human, node
// reboot, and a transition line for each change of state). The node
// service that owns the Machine carries the commands out and reports their
// results as events; it maps a GPU to its shares and MIG devices.
//
// Its state is saved with Machine.Save and restored by New: JSON with
// lowerCamelCase keys, a newer release's keys kept (internal/jsonkeep).
// Diagram returns the state diagram that docs/health.md shows.
package remedy

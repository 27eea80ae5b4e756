// Package health decides whether each GPU is healthy. It turns NVML
// events (XID, double-bit ECC, recovery action) and polled samples
// (temperature, clock-event reasons, the driver's recovery action,
// remapped rows, MIG mode, lost GPUs, NVML failures) into per-GPU
// conditions with hysteresis and recovery rules, and reports every
// transition at once to a Notifier, which is the kubelet-facing server.
// Sticky conditions (fatal XIDs, double-bit ECC) can be exported and
// restored across restarts (Watcher.Sticky, WithSticky).
//
// Each transition and state also goes to a Recorder, when given (package
// metrics exports them). OnFacts hands the same findings, structured (the
// recovery action, new XIDs, row remaps, a lost GPU), to the remediation,
// and ClearSticky drops a GPU's XID and ECC conditions, and the lost, recovery
// action and pending row remap its last poll read, once it was reset and
// proven.
//
// It reads hardware only through the Sampler it is given and keeps all
// state in the one goroutine that runs Watcher.Run.
package health

// Package remediate runs the remediation of the node's GPUs (package
// remedy's Machine) for either front-end: it takes the health watcher's
// facts, withholds a GPU (and every unit served of it: MIG devices,
// replicas) in the health notifier chain until the Machine gives it back,
// looks at who uses a withheld GPU (the kubelet's PodResources, NVML's
// processes, its MPS daemon), and carries the Machine's commands out
// through the interfaces it defines: stop MPS, evict (DRA), reset, probe,
// Events, the Node condition, the Node's cordon while a GPU needs a
// reboot, metrics. The Machine's state is saved
// before each command is carried out, so a restart neither forgets a
// withheld GPU nor resets one twice.
//
// A human releases a GPU out for a human or a reboot through the
// Endpoint, which the plugin serves on its health socket (a Unix socket in
// its pod's own emptyDir, never the metrics port), and the Client the
// remediation command asks it with.
//
// One goroutine (Run) owns the Machine. It must not decide anything
// itself: what to do and when is remedy's; how is the hardware's and the
// reporting's, behind the interfaces.
package remediate

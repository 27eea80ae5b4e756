// Package nvml discovers NVIDIA GPUs through NVML and turns them into plain
// values (GPU, Topology) read once at start-up. It is the only package that
// calls NVML; callers get values and never handles, except the health code
// in this package, which uses the device handles kept in the Inventory.
//
// Functions newer than the oldest supported driver (MinimumDriver) are
// looked up once (CheckSymbols) and called only where the library has them:
// go-nvml binds lazily, and a missing symbol kills the process.
//
// Resetter is this package's one actuator: it resets a GPU the NVML way
// (drain, remove, rediscover) when told to, and reads what a caller needs
// to decide; when to reset is not decided here.
//
// PCI facts NVML does not own (the NUMA node the kernel assigns) come from
// the sysfs package.
package nvml

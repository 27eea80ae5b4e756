// Package mocknvml builds and drives a mock NVML library for end-to-end
// tests on machines without a GPU.
//
// The library (mocknvml.c, built by Build into libnvidia-ml.so.1) answers the
// NVML calls the device plugin makes from a profile, a text file naming the
// GPUs, their PCI addresses, NUMA nodes, NVLinks, PCIe topology and MIG
// devices (see e2e/profiles/README.md). WriteSysfs, WriteDev and WriteProc
// lay out the files the plugin reads beside NVML. The plugin loads it through go-nvml's real cgo
// binding, unchanged, so a test exercises the same code a node does.
// Faults (XID and ECC events, temperature, throttling, a lost GPU, failing
// calls, transient errors, recovery actions, remapped rows) are injected at
// run time through a control FIFO (Control). MIG GPU and compute instances
// can be created and destroyed through NVML, as a DRA driver does, and kept
// in a state file that every process shares as it would share a driver
// (LoadMIGState reads it). BuildR470 builds a variant that plays an
// R470-era driver, without the functions NVML gained since.
//
// The library reads its environment at the first nvmlInit:
//
//	MOCK_NVML_PROFILE  path of the profile (required)
//	MOCK_NVML_CONTROL  path of the control FIFO, created when missing
//	                   (a regular file is tailed instead)
//	MOCK_NVML_LOG      path of a log, one line per injected fault and per
//	                   MIG instance created or destroyed
//	MOCK_NVML_MIG_STATE  path of the file holding the MIG instances, shared
//	                   by every process naming it (unset: per process)
//	MOCK_NVML_PROC_ROOT  procfs root where created instances' capability
//	                   files are written and destroyed ones' removed
//
// A process loads one profile: dlopen cannot swap the library, and the
// profile is read once per nvmlInit/nvmlShutdown cycle, so tests that need
// several profiles run each in its own process.
//
// This package only builds, describes and drives the mock; it never loads
// the library itself (it has no cgo).
package mocknvml

// Package wholebinary runs the real gpu-device-plugin binary, built from
// cmd/gpu-device-plugin, against the kubelet's own device-plugin code, on
// each mock machine profile in e2e/profiles: the mock libnvidia-ml.so.1
// loaded through --nvml-library, NUMA nodes read from a sysfs tree written
// from the profile, faults injected through the mock's control FIFO.
//
// It has tests only, and pins what a node sees from outside the process:
// the socket, registration, ListAndWatch, Allocate and
// GetPreferredAllocation answers, health changes, and the remediation of a
// faulted GPU (remediation_test.go, as root: a reset through the mock's
// drain states, the confined CUDA probe on the mock libcuda). The process
// is started by e2e/harness; nothing of the plugin is imported but two
// fakes: cudatest, which builds the mock libcuda, and the PodResources
// API of podresourcestest.
package wholebinary

// Package suite is the end-to-end suite on a real Kubernetes node: it
// installs the plugin's Helm chart as a DaemonSet on the mock NVML library
// and checks, through the API server, what a user of the node sees: the
// node's nvidia.com/gpu capacity, pods that get their GPUs (by environment
// and device nodes, then through CDI), a request that cannot fit, faults
// reaching allocatedResourcesStatus, kubelet and plugin restarts, and an
// uninstall that leaves nothing behind.
//
// It needs a cluster prepared by e2e/cluster/cluster.sh (a local node) or
// e2e/kind/kind.sh (kind), which write the settings it reads from the
// environment (see settings.go); without E2E_FIXTURE it skips, so `go test
// ./...` stays safe anywhere. Run it through `make e2e-cluster` or
// `make e2e-kind`.
package suite

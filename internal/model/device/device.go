package device

import "errors"

// NoNUMANode marks a device whose NUMA node is unknown. A front-end
// advertises such a device without topology: the kubelet's topology
// manager never matches a negative node.
const NoNUMANode = -1

// Device is one schedulable unit of a resource.
type Device struct {
	ID       string
	NUMANode int
	Healthy  bool
	// Reason says why the device is unhealthy; empty when healthy.
	Reason string
}

// Node is a device node to create in the container.
type Node struct {
	// ContainerPath is where the node appears in the container.
	ContainerPath string
	// HostPath is the node on the host, as the container runtime sees it.
	HostPath string
	// Permissions are cgroup device permissions, such as "rw".
	Permissions string
}

// Mount is a host directory bound into the container.
type Mount struct {
	ContainerPath string
	// HostPath is the directory on the host, as the container runtime
	// sees it.
	HostPath string
	ReadOnly bool
}

// Answer is what a container gets for a set of devices, in no API's
// terms. A nil field means the allocation sets none of it.
type Answer struct {
	// Env are environment variables to set in the container.
	Env map[string]string
	// Nodes are the device nodes to create in the container.
	Nodes []Node
	// Mounts are host directories to bind into the container (an MPS
	// control daemon's pipe directory and shared memory).
	Mounts []Mount
	// CDIDevices are fully qualified CDI device names
	// (vendor/class=name) for a CDI-aware runtime to inject.
	CDIDevices []string
	// Annotations are container annotations, such as the cdi.k8s.io
	// ones runtimes read when they predate the CRI CDI field.
	Annotations map[string]string
}

// ErrNotReady, wrapped in an allocation error, says the devices cannot be
// handed out yet (their CDI spec is not written, say) but may be soon: a
// front-end reports it as retryable (the device plugin answers
// Unavailable rather than Internal).
var ErrNotReady = errors.New("not ready")

// ErrBadRequest, wrapped in an allocation error, says the request itself
// is wrong (an unknown device, one that policy refuses): a front-end
// reports it as the caller's fault (the device plugin answers
// InvalidArgument).
var ErrBadRequest = errors.New("bad request")

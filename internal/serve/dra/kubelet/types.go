package kubelet

import (
	"context"
	"errors"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DRAPlugin is what a driver implements; the helper answers the kubelet by
// calling it. The contract is kubeletplugin.DRAPlugin's: both prepare
// calls are idempotent, return one entry per claim, and are serialized by
// the helper.
type DRAPlugin interface {
	// PrepareResourceClaims prepares the claims, which the helper has
	// read from the API server and checked against the kubelet's UIDs.
	PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]PrepareResult, error)
	// UnprepareResourceClaims undoes PrepareResourceClaims; a claim not
	// prepared is no error. The claims may be gone from the API server.
	UnprepareResourceClaims(ctx context.Context, claims []NamespacedObject) (map[types.UID]error, error)
	// HandleError hears of errors in the background: a server that
	// stopped, health reports gone stale (errors.Is ErrRecoverable).
	HandleError(ctx context.Context, err error, msg string)
	// WatchHealthStatus sends a report of every device, then one at each
	// change, until ctx ends, and then returns nil; or returns
	// ErrHealthNotSupported at once.
	WatchHealthStatus(ctx context.Context, reports chan<- DeviceHealthReport) error
}

// ClaimReader reads a ResourceClaim from the API server.
type ClaimReader interface {
	GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// ErrRecoverable marks an error HandleError gets that is no reason to
// stop: errors.Is(err, ErrRecoverable).
var ErrRecoverable = errors.New("recoverable error")

// PrepareResult is one claim's preparation: Err, or its devices.
type PrepareResult struct {
	// Err, when set, fails the claim; the kubelet tries again later.
	Err error
	// Devices are the claim's devices and their CDI IDs; empty is valid.
	Devices []Device
}

// Device is one prepared device of a claim.
type Device struct {
	// Requests names the claim's requests (or "request/subrequest") the
	// device serves; the kubelet gets the request names alone. Empty
	// means all requests.
	Requests []string
	// PoolName and DeviceName name the device in its ResourceSlice.
	PoolName   string
	DeviceName string
	// CDIDeviceIDs are the device's fully qualified CDI device names.
	CDIDeviceIDs []string
	// ShareID identifies the share of a shared device; nil for none.
	ShareID *types.UID
	// Metadata is what the device's metadata file says of it, with
	// Options.DeviceMetadata; ignored otherwise.
	Metadata *DeviceMetadata
}

// DeviceMetadata is a device's attributes and network data as the
// workload reads them from its metadata file (KEP-5304).
type DeviceMetadata struct {
	// Attributes as a ResourceSlice publishes them; an unqualified name
	// belongs to the driver's domain.
	Attributes map[string]resourceapi.DeviceAttribute
	// NetworkData of a network device.
	NetworkData *resourceapi.NetworkDeviceData
}

// NamespacedObject names a claim to unprepare.
type NamespacedObject struct {
	types.NamespacedName
	UID types.UID
}

// String is "namespace/name:uid", or "namespace/name" without a UID.
func (n NamespacedObject) String() string {
	s := n.Namespace + string(types.Separator) + n.Name
	if n.UID != "" {
		s += ":" + string(n.UID)
	}
	return s
}

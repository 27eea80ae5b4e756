package snapshot

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// Node is one look at the node. Inventory, Excluded and Unmatched are
// always there; Layout when the look lays the GPUs out; the rest when it
// observes them too (nil or empty otherwise).
type Node struct {
	// Inventory is what NVML found, less the GPUs the settings leave out,
	// with each MIG device's capability minors (one without them is left
	// out, as serve leaves it out).
	Inventory *nvml.Inventory
	// Excluded are the GPUs excludeGPUs and includeGPUs leave out;
	// Unmatched their entries that name no GPU.
	Excluded  []nvml.GPU
	Unmatched []config.UnmatchedGPU
	// Layout is what the device-plugin API serves.
	Layout *layout.Node

	// Name is the node's name, its DRA pool.
	Name string
	// GPUs are Inventory's GPUs, in its order, with their state.
	GPUs []GPU
	// NICs are every NIC found, pooled or not; nil when the scan failed.
	NICs []NIC
	// DRA is what DRA mode would publish: the GPUs', then each pool's
	// ResourceSlice entries, unhealthy ones tainted.
	DRA []draslice.Device
	// Labels are the node labels nodeLabels delivers.
	Labels map[string]string
	Hook   Hook
	// Door is what the container runtimes' configs say of
	// NVIDIA_VISIBLE_DEVICES; nil when runtimeConfigRoot is empty.
	Door *runtimes.Door
}

// Values of State.Sharing.
const (
	SharingTimeSlicing = "time-slicing"
	SharingMPS         = "mps"
)

// State is how a GPU or MIG device is served and how it is.
type State struct {
	// Healthy and Reason are the health one poll with serve's policy
	// says.
	Healthy bool
	Reason  string
	// Served is how the device-plugin API serves it whole; zero when it
	// does not (a MIG GPU served as its MIG devices, say).
	Served layout.Served
	// Sharing is how its replicas are shared: SharingTimeSlicing,
	// SharingMPS, or "" when not shared.
	Sharing string
	// Holders are the containers holding it, through either kubelet API.
	Holders []podresources.Holder
}

// GPU is one selected GPU.
type GPU struct {
	Device nvml.GPU
	State
	// MPS is what its MPS control daemon says, for a GPU shared through
	// MPS; nil otherwise.
	MPS *MPS
	// Remediation is its remediation as the running plugin saved it
	// (remediation.json in stateDir, this boot's); nil when there is none
	// to show: remediation off, no file, or serving with no reset in the
	// window.
	Remediation *remedy.Status
	// MIG are its MIG devices, in Device.MIG's order.
	MIG []MIG
}

// MIG is one MIG device of a GPU.
type MIG struct {
	Device nvml.MIGDevice
	State
}

// MPS is what a GPU's MPS control daemon says of itself.
type MPS struct {
	// Up: it answered; Err says why not.
	Up               bool
	Servers, Clients int
	Err              error
}

// NIC is one NIC found. Pool is "" for a NIC in no pool: nothing serves
// it, so nothing judges it, and Healthy and Reason say nothing.
type NIC struct {
	Device  sysfs.NIC
	Pool    string
	Healthy bool
	Reason  string
	Holders []podresources.Holder
}

// Hook is the CDI hook as the GPU CDI spec would run it.
type Hook struct {
	// Path is cdiHookPath ("" when left out on purpose).
	Path string
	// Installed: the container runtime can run it there; Problem says
	// why not.
	Installed bool
	Problem   string
	// InUse: CDI answers are given at all (a cdi-* strategy, or DRA mode).
	InUse bool
}

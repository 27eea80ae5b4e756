package nvml

import (
	"fmt"
	"log/slog"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Fabric is a GPU's registration with a multi-node NVLink fabric (GB200
// NVL72 and its kin), as NVML's fabric info gives it: the NVLink domain
// (cluster UUID) and the partition of it (clique) the GPU can reach through
// NVLink, which IMEX channels and gpu.clique are made of.
type Fabric struct {
	// ClusterUUID is the NVLink domain, lower-case 8-4-4-4-12; empty when
	// NVML gave all zeros (a GPU not, or not yet, in a domain).
	ClusterUUID string `json:"clusterUUID,omitempty"`
	CliqueID    uint32 `json:"cliqueID"`
	// State is the registration's progress: FabricNotStarted,
	// FabricInProgress or FabricCompleted.
	State string `json:"state"`
	// Status is how a completed registration ended: empty when it
	// succeeded, else NVML's error.
	Status string `json:"status,omitempty"`
	// HealthMask is NVML's fabric health bits (degraded bandwidth, route
	// recovery, unhealthy route); 0 where the driver gives none (before
	// the versioned call).
	HealthMask uint32 `json:"healthMask,omitempty"`
}

// The states of a GPU's fabric registration.
const (
	FabricNotStarted = "not-started"
	FabricInProgress = "in-progress"
	FabricCompleted  = "completed"
)

// Registered says whether the GPU is in an NVLink domain now: its
// registration completed, succeeded, and named a domain.
func (f *Fabric) Registered() bool {
	return f != nil && f.State == FabricCompleted && f.Status == "" && f.ClusterUUID != ""
}

// Fabric info came with R525 (nvmlDeviceGetGpuFabricInfo, now deprecated)
// and its versioned successor with R550, which adds the health mask.
const (
	symFabricInfo  = "nvmlDeviceGetGpuFabricInfo"
	symFabricInfoV = "nvmlDeviceGetGpuFabricInfoV"
)

// fabricInfo reads a GPU's fabric registration through the versioned call
// where the driver exports it, else the first one. It is nil where the
// driver predates both, the GPU has no fabric (NOT_SUPPORTED, the answer of
// every GPU outside an NVLink domain) or NVML fails, which is logged: no
// fabric is a value, never a reason to leave a GPU out.
func fabricInfo(h gonvml.Device, syms Symbols, uuid string, log *slog.Logger) *Fabric {
	var (
		raw gonvml.GpuFabricInfo_v2
		ret gonvml.Return
	)
	switch {
	case syms.Has(symFabricInfoV):
		raw, ret = h.GetGpuFabricInfoV().V2()
	case syms.Has(symFabricInfo):
		var v1 gonvml.GpuFabricInfo
		v1, ret = h.GetGpuFabricInfo()
		raw = gonvml.GpuFabricInfo_v2{ClusterUuid: v1.ClusterUuid, Status: v1.Status, CliqueId: v1.CliqueId, State: v1.State}
	default:
		return nil
	}
	switch {
	case ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_FUNCTION_NOT_FOUND:
		return nil
	case ret != gonvml.SUCCESS:
		log.Warn("reading GPU fabric info; taking it as none", "device", uuid, "reason", ret.Error())
		return nil
	}
	f := &Fabric{CliqueID: raw.CliqueId, HealthMask: raw.HealthMask}
	switch raw.State {
	case gonvml.GPU_FABRIC_STATE_NOT_STARTED:
		f.State = FabricNotStarted
	case gonvml.GPU_FABRIC_STATE_IN_PROGRESS:
		f.State = FabricInProgress
	case gonvml.GPU_FABRIC_STATE_COMPLETED:
		f.State = FabricCompleted
	default: // GPU_FABRIC_STATE_NOT_SUPPORTED, or newer than this table
		return nil
	}
	if r := gonvml.Return(raw.Status); r != gonvml.SUCCESS {
		f.Status = r.Error()
	}
	if raw.ClusterUuid != [16]uint8{} {
		f.ClusterUUID = formatUUID(raw.ClusterUuid)
	}
	return f
}

// formatUUID writes 16 bytes as RFC 4122 text, lower case.
func formatUUID(b [16]uint8) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

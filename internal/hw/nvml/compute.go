package nvml

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SetComputeMode puts the GPU with uuid in exclusive-process compute mode,
// where one process (an MPS server) may hold a context on it, or back in
// the default mode. The mode lasts until the GPU is reset or the node
// reboots; setting it needs root.
func SetComputeMode(lib Library, uuid string, exclusive bool) error {
	h, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	mode, name := gonvml.COMPUTEMODE_DEFAULT, "default"
	if exclusive {
		mode, name = gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS, "exclusive-process"
	}
	if ret := h.SetComputeMode(mode); ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: setting compute mode %s: %w", uuid, name, ret)
	}
	return nil
}

// IsExclusive says whether the GPU with uuid is in exclusive-process
// compute mode; a reset or a driver reload puts it back in default.
func IsExclusive(lib Library, uuid string) (bool, error) {
	h, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return false, fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	mode, ret := h.GetComputeMode()
	if ret != gonvml.SUCCESS {
		return false, fmt.Errorf("GPU %s: reading its compute mode: %w", uuid, ret)
	}
	return mode == gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS, nil
}

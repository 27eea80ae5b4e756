package cdi

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// GPUKind is the CDI kind of whole GPUs. It is also the extended resource
// name, so a runtime request reads the same as the pod's.
const GPUKind = "nvidia.com/gpu"

// ControlNodes are the /dev entries every GPU shares. Each is passed only
// if present under the /dev root, since nvidia-uvm and nvidia-modeset are
// loaded on demand. The gpu package's Allocate answer uses the same list.
func ControlNodes() []string {
	return []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}
}

// GPUSpec builds the nvidia.com/gpu spec: two devices per GPU, one named by
// UUID ("GPU-…") and one by index ("0"), each carrying the GPU's
// /dev/nvidia<minor>; and common edits with the control nodes present under
// devRoot ("" means /dev) and the driver's mounts. GPUs are listed in index
// order. Host paths are under devRoot and driver.Root; container paths are
// the usual ones.
func GPUSpec(gpus []nvml.GPU, driver Driver, devRoot string) (*specs.Spec, error) {
	if devRoot == "" {
		devRoot = "/dev"
	}
	sorted := slices.SortedFunc(slices.Values(gpus), func(a, b nvml.GPU) int { return cmp.Compare(a.Index, b.Index) })
	devices := make([]Device, 0, 2*len(sorted))
	for _, g := range sorted {
		node := devNode(devRoot, "nvidia"+strconv.Itoa(g.Minor))
		for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
			devices = append(devices, Device{Name: name, Edits: Edits{Nodes: []DeviceNode{node}}})
		}
	}
	var common Edits
	for _, name := range ControlNodes() {
		if _, err := os.Stat(filepath.Join(devRoot, name)); err == nil {
			common.Nodes = append(common.Nodes, devNode(devRoot, name))
		}
	}
	common.Mounts = driver.Mounts()
	s, err := Spec(GPUKind, devices, common)
	if err != nil {
		return nil, fmt.Errorf("GPU spec: %w", err)
	}
	return s, nil
}

func devNode(devRoot, name string) DeviceNode {
	return DeviceNode{Path: "/dev/" + name, HostPath: filepath.Join(devRoot, name), Permissions: "rw"}
}

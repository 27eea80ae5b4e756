package cdi

import (
	"cmp"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// GPUKind is the CDI kind of whole GPUs. It is ours alone, not the
// resource name: the NVIDIA Container Toolkit (1.18+) regenerates
// /var/run/cdi/nvidia.yaml with kind nvidia.com/gpu and the same device
// names (index and UUID) at every boot, and a CDI cache drops every name
// two specs of equal priority both define, so sharing that kind would
// break our containers and the toolkit's alike.
const GPUKind = "gpu-device-plugin.github.io/gpu"

// MPSKind is the CDI kind of DRA claims' MPS clients: one spec, rewritten
// as claims come and go, with a device per claim sharing a GPU through
// MPS, carrying its daemon's pipe directory, shared memory and limits.
const MPSKind = "gpu-device-plugin.github.io/mps"

// MIGKind is the CDI kind of the MIG instances DRA claims create: one
// spec, rewritten as claims come and go, with a device per instance (by
// UUID) carrying its access capability nodes. A claim gets it beside its
// GPU's GPUKind device, which brings the GPU's node and the driver.
const MIGKind = "gpu-device-plugin.github.io/mig"

// HookName is the file name of our OCI hook program, and its Args[0].
const HookName = "gpu-device-plugin-cdi-hook"

// VisibleDevicesVoid is set in every GPU container: nvidia/cuda images
// carry NVIDIA_VISIBLE_DEVICES=all, which the NVIDIA runtime's legacy
// hook, where it is the node's default runtime, would honour by injecting
// every GPU on top of the ones CDI gave the container.
const VisibleDevicesVoid = "NVIDIA_VISIBLE_DEVICES=void"

// ControlNodes are the /dev entries every GPU shares. Each is passed only
// if present under the /dev root, since nvidia-uvm and nvidia-modeset are
// loaded on demand. The gpu package's Allocate answer uses the same list.
func ControlNodes() []string {
	return []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}
}

// PresentControlNodes returns the ControlNodes that exist under devRoot
// ("" means /dev) now, in ControlNodes' order. nvidia-uvm often appears
// only at the first CUDA call after boot, so callers ask again later.
func PresentControlNodes(devRoot string) []string {
	if devRoot == "" {
		devRoot = "/dev"
	}
	var out []string
	for _, name := range ControlNodes() {
		if _, err := os.Stat(filepath.Join(devRoot, name)); err == nil {
			out = append(out, name)
		}
	}
	return out
}

// GPUSpecOptions shape GPUSpec.
type GPUSpecOptions struct {
	// DevRoot is the host's /dev; "" means /dev.
	DevRoot string
	// ControlNodes are the control node names to pass (see
	// PresentControlNodes); nil looks them up under DevRoot.
	ControlNodes []string
	// IMEXChannels are the IMEX channels device-plugin mode hands out
	// (imex.channelIDs): each gets a device of its own, IMEXChannelDevice.
	IMEXChannels []int
	// HookPath is where the runtime finds our hook program on the host.
	// Empty leaves the hook out: no libcuda.so link and no ld cache
	// update in the container.
	HookPath string
}

// GPUSpec builds the GPUKind spec: two devices per GPU, one named by UUID
// ("GPU-…", the name Allocate hands out) and one by index ("0", for people
// running containers by hand), each carrying the GPU's /dev/nvidia<minor>,
// and one per MIG device (see migDevice).
// Its common edits hold the control nodes, the driver's mounts,
// NVIDIA_VISIBLE_DEVICES=void, and, with a hook path and libcuda among the
// driver's libraries, the createContainer hook that links libcuda.so and
// updates the container's ld cache (HookArgs). GPUs are listed in index
// order. Host paths are under DevRoot and driver.Root; container paths are
// the usual ones.
func GPUSpec(gpus []nvml.GPU, driver driverroot.Files, o GPUSpecOptions) (*specs.Spec, error) {
	devRoot := o.DevRoot
	if devRoot == "" {
		devRoot = "/dev"
	}
	sorted := slices.SortedFunc(slices.Values(gpus), func(a, b nvml.GPU) int { return cmp.Compare(a.Index, b.Index) })
	devices := make([]Device, 0, 2*len(sorted))
	for _, g := range sorted {
		node := devNode(devRoot, "nvidia"+strconv.Itoa(g.Minor))
		// A MIG-enabled GPU keeps its whole-GPU names: the kubelet's
		// checkpoint of an Allocate from before MIG was enabled may still
		// name them when it restarts a container, and an unresolvable name
		// fails the container where a GPU in MIG mode fails only CUDA.
		for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
			devices = append(devices, Device{Name: name, Edits: Edits{Nodes: []DeviceNode{node}}})
		}
		for _, m := range g.MIG {
			if d, ok := migDevice(devRoot, node, m); ok {
				devices = append(devices, d)
			}
		}
	}
	for _, id := range o.IMEXChannels {
		devices = append(devices, Device{Name: IMEXChannelDevice(id), Edits: Edits{Nodes: []DeviceNode{devNode(devRoot, IMEXChannelNode(id))}}})
	}
	controls := o.ControlNodes
	if controls == nil {
		controls = PresentControlNodes(devRoot)
	}
	common := Edits{Env: []string{VisibleDevicesVoid}}
	for _, name := range controls {
		common.Nodes = append(common.Nodes, devNode(devRoot, name))
	}
	common.Mounts = DriverMounts(driver)
	if args := HookArgs(driver); o.HookPath != "" && args != nil {
		common.Hooks = []Hook{{Name: "createContainer", Path: o.HookPath, Args: args, Env: HookEnv()}}
	}
	s, err := Spec(GPUKind, devices, common)
	if err != nil {
		return nil, fmt.Errorf("GPU spec: %w", err)
	}
	return s, nil
}

// DriverMounts are the driver's files as read-only bind mounts, at the
// paths they have in the driver root.
func DriverMounts(driver driverroot.Files) []Mount {
	files := driver.All()
	out := make([]Mount, len(files))
	for i, f := range files {
		out[i] = Mount{HostPath: f.HostPath, ContainerPath: f.Path, Options: ReadOnlyBind()}
	}
	return out
}

// HookEnv is our hook's whole environment in a CDI spec. The hook also
// re-executes itself with it when a runtime ignores the entry's env.
func HookEnv() []string { return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"} }

// HookArgs returns our hook's arguments (Args[0] included) for a container
// that gets driver's libraries: the libcuda.so -> libcuda.so.1 link
// next to libcuda.so.1, and every directory the libraries are mounted in
// for the ld cache. It is nil when the driver has no libcuda.so.1.
func HookArgs(driver driverroot.Files) []string {
	var cudaDir string
	var dirs []string
	for _, f := range driver.Libraries {
		dir := path.Dir(f.Path)
		if !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		if path.Base(f.Path) == "libcuda.so.1" {
			cudaDir = dir
		}
	}
	if cudaDir == "" {
		return nil
	}
	args := []string{HookName, "create-container", "--link", "libcuda.so.1::" + path.Join(cudaDir, "libcuda.so")}
	for _, d := range dirs {
		args = append(args, "--folder", d)
	}
	return args
}

// MIGCapNode is the path of MIG capability node minor under /dev.
func MIGCapNode(minor int) string { return "nvidia-caps/nvidia-cap" + strconv.Itoa(minor) }

// IMEXChannelDevice is the GPUKind device of IMEX channel id,
// "imex-channel<id>": no GPU's UUID or index can take that name. Allocate
// names it beside the GPUs when imex.channelIDs has the channel.
func IMEXChannelDevice(id int) string { return "imex-channel" + strconv.Itoa(id) }

// IMEXChannelNode is IMEX channel id's node relative to /dev (imex.Path
// is the absolute form).
func IMEXChannelNode(id int) string {
	return "nvidia-caps-imex-channels/channel" + strconv.Itoa(id)
}

// MIGCaps is the device of MIGKind for MIG device m: its access
// capability nodes only (ok false without both minors).
func MIGCaps(devRoot string, m nvml.MIGDevice) (Device, bool) {
	if len(m.CapMinors) != 2 {
		return Device{}, false
	}
	if devRoot == "" {
		devRoot = "/dev"
	}
	nodes := []DeviceNode{devNode(devRoot, MIGCapNode(m.CapMinors[0])), devNode(devRoot, MIGCapNode(m.CapMinors[1]))}
	return Device{Name: m.UUID, Edits: Edits{Nodes: nodes}}, true
}

// migDevice is a MIG device's CDI device: its parent's node, which CUDA
// opens for every MIG device, and the access capabilities of its GPU
// instance and compute instance, which admit it to that one slice. It is
// named by UUID only: MIG device indices are handed out again whenever
// instances are recreated, so a name by index could silently point at
// another slice, and both front-ends hand out UUIDs. A device without
// both capability minors is left out (ok false), never given a node set
// that CUDA would refuse.
func migDevice(devRoot string, parent DeviceNode, m nvml.MIGDevice) (Device, bool) {
	d, ok := MIGCaps(devRoot, m)
	d.Edits.Nodes = append([]DeviceNode{parent}, d.Edits.Nodes...)
	return d, ok
}

func devNode(devRoot, name string) DeviceNode {
	return DeviceNode{Path: "/dev/" + name, HostPath: filepath.Join(devRoot, name), Permissions: "rw"}
}

// CheckHook says why the hook at path cannot be run by the container
// runtime (missing, not a regular file, not executable), or nil when it can.
func CheckHook(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s is not executable", path)
	}
	return nil
}

// HookMissingMessage says what a GPU spec without the hook breaks, and how
// to install it: logs, the Node condition and list say the same.
func HookMissingMessage(path string) string {
	return "CDI hook " + HookName + " not installed at " + path + ": GPU containers get no libcuda.so link and no ld cache entry for the driver's libraries, " +
		"so where an image's library directories differ from the host's, CUDA fails at its first call; install it (the node package does; the chart's init container copies it to cdiHook.hostDir; " +
		"or run `" + HookName + " install --dir DIR` and set cdiHookPath to DIR/" + HookName + ")"
}

// ChannelKind is the CDI kind of the IMEX channels DRA's ComputeDomain
// claims get: one spec with a device per channel ("channel<N>"), each
// carrying the channel's node.
const ChannelKind = "gpu-device-plugin.github.io/imex-channel"

// ChannelDevice names IMEX channel id's ChannelKind device.
func ChannelDevice(id int) string { return "channel" + strconv.Itoa(id) }

// ChannelSpec is the ChannelKind spec of channels ids, their nodes under
// devRoot ("" is /dev) as the container runtime sees it.
func ChannelSpec(devRoot string, ids []int) (*specs.Spec, error) {
	if devRoot == "" {
		devRoot = "/dev"
	}
	devs := make([]Device, 0, len(ids))
	for _, id := range ids {
		devs = append(devs, Device{Name: ChannelDevice(id), Edits: Edits{Nodes: []DeviceNode{devNode(devRoot, IMEXChannelNode(id))}}})
	}
	return Spec(ChannelKind, devs, Edits{})
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// bootID is the mock node's /proc/sys/kernel/random/boot_id: serve keeps
// fatal health across restarts on one boot and reads it to know the boot.
const bootID = "6f1c2b9e-4d3a-4e8f-9a71-3c5d2e0b8f14\n"

// node is a mock GPU node in a temporary folder: the mock NVML library
// where a driver installs it, sysfs, /dev and /proc written from a machine
// profile (as e2e/cluster/fixture does, without root: /dev nodes are
// plain files), and the folders serve writes to.
type node struct {
	dir     string
	profile string // the profile's path: MOCK_NVML_PROFILE
	prof    *mocknvml.Profile
	control string // the mock's fault FIFO: serve's MOCK_NVML_CONTROL
}

// newNode lays out a node for profile in a new temporary folder, with
// mock (a built libnvidia-ml.so.1) as its driver's NVML library. The
// caller removes n.dir.
func newNode(profile, mock string) (n *node, err error) {
	prof, err := mocknvml.LoadProfile(profile)
	if err != nil {
		return nil, err
	}
	if len(prof.GPUs) == 0 {
		return nil, fmt.Errorf("%s has no GPUs", profile)
	}
	dir, err := shortTempDir("first-look")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	n = &node{dir: dir, profile: profile, prof: prof, control: filepath.Join(dir, "control")}

	// The library as the driver names it, so the CDI spec finds the
	// driver's version and mounts it as it would a real one.
	lib, err := os.ReadFile(mock)
	if err != nil {
		return nil, fmt.Errorf("the mock NVML library: %w", err)
	}
	libDir := filepath.Join(dir, "driver", "usr", "lib")
	real := "libnvidia-ml.so." + prof.DriverVersion
	if prof.DriverVersion == "" {
		real = mocknvml.LibraryName
	}
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(libDir, real), lib, 0o755); err != nil {
		return nil, err
	}
	if real != mocknvml.LibraryName {
		if err := os.Symlink(real, filepath.Join(libDir, mocknvml.LibraryName)); err != nil {
			return nil, err
		}
	}

	if err := prof.WriteSysfs(n.path("sys")); err != nil {
		return nil, err
	}
	if err := prof.WriteDev(n.path("dev")); err != nil {
		return nil, err
	}
	if err := prof.WriteProc(n.path("proc")); err != nil {
		return nil, err
	}
	random := n.path("proc", "sys", "kernel", "random")
	if err := os.MkdirAll(random, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(random, "boot_id"), []byte(bootID), 0o444); err != nil {
		return nil, err
	}
	for _, d := range []string{"device-plugins", "state", "cdi", "devinfo", "nfd", "mps"} {
		if err := os.Mkdir(n.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *node) path(parts ...string) string {
	return filepath.Join(append([]string{n.dir}, parts...)...)
}

// setting is one of the plugin's settings as an environment variable.
type setting struct{ name, value, what string }

// hardware are the settings that point the plugin at the node's files
// instead of the machine's (each has a flag too: --driver-root, ...).
func (n *node) hardware() []setting {
	return []setting{
		{"GPU_DEVICE_PLUGIN_DRIVER_ROOT", n.path("driver"), "the mock libnvidia-ml.so.1, under usr/lib"},
		{"GPU_DEVICE_PLUGIN_SYSFS_ROOT", n.path("sys"), "the GPUs' PCI devices and NUMA nodes"},
		{"GPU_DEVICE_PLUGIN_DEV_ROOT", n.path("dev"), "/dev/nvidia0 and the rest, as empty files"},
		{"GPU_DEVICE_PLUGIN_PROC_ROOT", n.path("proc"), "the driver's /proc files"},
	}
}

// outputs are the settings for every path serve would write to on the
// machine, and for what it would read from a kubelet or a runtime there.
func (n *node) outputs() []setting {
	return []setting{
		{"GPU_DEVICE_PLUGIN_DEVICE_PLUGIN_DIR", n.path("device-plugins"), ""},
		{"GPU_DEVICE_PLUGIN_STATE_DIR", n.path("state"), ""},
		{"GPU_DEVICE_PLUGIN_CDI_SPEC_DIR", n.path("cdi"), ""},
		{"GPU_DEVICE_PLUGIN_DEVICE_INFO_DIR", n.path("devinfo"), ""},
		{"GPU_DEVICE_PLUGIN_NFD_FEATURES_DIR", n.path("nfd"), ""},
		{"GPU_DEVICE_PLUGIN_MPS_ROOT", n.path("mps"), ""},
		// Empty turns these off: no kubelet to ask who holds what, no
		// container runtime config to read, no CDI hook installed.
		{"GPU_DEVICE_PLUGIN_POD_RESOURCES_SOCKET", "", ""},
		{"GPU_DEVICE_PLUGIN_RUNTIME_CONFIG_ROOT", "", ""},
		{"GPU_DEVICE_PLUGIN_CDI_HOOK_PATH", "", ""},
	}
}

// env is the plugin's environment on the node: this process's, without
// settings of the user's that would change what it shows, and the node's.
// Only serve gets the fault FIFO: a library reading it in another process
// would take the faults meant for serve.
func (n *node) env(serve bool, more ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPU_DEVICE_PLUGIN_") && !strings.HasPrefix(kv, "MOCK_NVML_") {
			env = append(env, kv)
		}
	}
	env = append(env, "MOCK_NVML_PROFILE="+n.profile)
	if serve {
		env = append(env, "MOCK_NVML_CONTROL="+n.control)
	}
	for _, s := range append(n.hardware(), n.outputs()...) {
		env = append(env, s.name+"="+s.value)
	}
	return append(env, more...)
}

// maxSocketPath is the room sun_path leaves for a unix socket's path.
const maxSocketPath = 108

// shortTempDir makes a fresh folder whose sockets
// (device-plugins/nvidia.com_gpu.sock) fit in sun_path: under $TMPDIR
// when that is short enough, else under /tmp.
func shortTempDir(prefix string) (string, error) {
	for _, parent := range []string{os.TempDir(), "/tmp"} {
		dir, err := os.MkdirTemp(parent, prefix+"-")
		if err != nil {
			continue
		}
		if len(dir)+len("/device-plugins/")+40 < maxSocketPath {
			return dir, nil
		}
		os.Remove(dir)
	}
	return "", fmt.Errorf("no temporary folder short enough for unix sockets (TMPDIR=%s)", os.TempDir())
}

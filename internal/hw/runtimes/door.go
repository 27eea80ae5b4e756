package runtimes

import (
	"fmt"
	"path/filepath"
	"strings"
)

// State is what the runtime configuration says of the door.
type State string

const (
	Open    State = "open"
	Closed  State = "closed"
	Unknown State = "unknown"
)

// Reasons, stable: the metric's reason label and list's reason.
const (
	// ReasonEnvvarAccepted: NVIDIA's runtime runs every container and
	// takes NVIDIA_VISIBLE_DEVICES from unprivileged ones.
	ReasonEnvvarAccepted = "envvarAccepted"
	// ReasonEnvvarRefused: it runs every container, but the toolkit's
	// config refuses the variable from unprivileged containers.
	ReasonEnvvarRefused = "envvarRefused"
	// ReasonNotDefault: NVIDIA's runtime is there, but runs only for
	// containers that ask for it (a RuntimeClass handler, an
	// annotation-gated hook).
	ReasonNotDefault = "notDefaultRuntime"
	// ReasonNoNVIDIARuntime: no runtime config names NVIDIA's runtime or hook.
	ReasonNoNVIDIARuntime = "noNVIDIARuntime"
	// ReasonUnreadableConfig: a config file could not be parsed.
	ReasonUnreadableConfig = "unreadableConfig"
)

// Runtimes, as Door.Runtime names them.
const (
	Containerd = "containerd"
	CRIO       = "cri-o"
	OCIHook    = "oci-hook" // an OCI hooks.d file (CRI-O, Podman)
)

// The toolkit's keys (NVIDIA Container Toolkit, internal/config).
const (
	KeyAcceptEnvvar       = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	KeyAcceptVolumeMounts = "accept-nvidia-visible-devices-as-volume-mounts"
)

// ToolkitConfig is where the NVIDIA Container Toolkit reads its config
// when nothing overrides it.
const ToolkitConfig = "/etc/nvidia-container-runtime/config.toml"

// Door says whether an image can reach every GPU through
// NVIDIA_VISIBLE_DEVICES. Paths are the host's, not under the root read.
type Door struct {
	State  State
	Reason string
	// Runtime is the one that runs NVIDIA's runtime or hook (Containerd,
	// CRIO, OCIHook); "" when none does.
	Runtime string
	// ConfigPath and Key are the file and key that decide: the toolkit's
	// config and KeyAcceptEnvvar when NVIDIA's runtime runs every
	// container; the runtime's config otherwise.
	ConfigPath string
	Key        string
	// Mode is the toolkit's nvidia-container-runtime.mode ("auto" when
	// unset); "" when NVIDIA's runtime does not run every container.
	Mode string
	// Fix says how to close the door; "" when closed.
	Fix string
	// Err is why the state is Unknown.
	Err error
}

// IsOpen says whether any pod can see every GPU by setting the variable.
func (d Door) IsOpen() bool { return d.State == Open }

// Sentence is the door in one sentence for the Node condition's message;
// "" when it is closed.
func (d Door) Sentence() string {
	switch d.State {
	case Open:
		return fmt.Sprintf("any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES: %s runs NVIDIA's runtime for every container and %s leaves %s true (see docs/security.md)",
			d.Runtime, d.ConfigPath, d.Key)
	case Unknown:
		return fmt.Sprintf("whether pods can see every GPU through NVIDIA_VISIBLE_DEVICES is unknown: %s could not be read", d.ConfigPath)
	}
	return ""
}

// fixFor is how to close a door opened by runtime with the toolkit
// config at path.
func fixFor(runtime, path string) string {
	return fmt.Sprintf("set %s = false and %s = true in %s, or run NVIDIA's runtime only for pods with its RuntimeClass instead of as %s's default; gpu-device-plugin's CDI specs need no NVIDIA runtime (docs/security.md)",
		KeyAcceptEnvvar, KeyAcceptVolumeMounts, path, runtime)
}

// finding is one runtime config's word on NVIDIA's runtime.
type finding struct {
	runtime string
	path    string // host path of the file that says so
	key     string
	// binary is the NVIDIA runtime's or hook's path on the host: the
	// GPU Operator's toolkit keeps its config beside it.
	binary string
	// every: it runs for every container (the default runtime, a hook
	// that always applies).
	every bool
	err   error
}

// Inspect reads the runtime configs under root and says whether the door
// is open. It reads containerd's, CRI-O's and the OCI hooks.d files, and
// the toolkit's config of any NVIDIA runtime they run for every container.
func Inspect(root string) Door {
	var fs []finding
	fs = append(fs, containerdFindings(root)...)
	fs = append(fs, crioFindings(root)...)
	fs = append(fs, hookFindings(root)...)

	var unknown, refused, handler *Door
	for _, f := range fs {
		switch {
		case f.err != nil:
			if unknown == nil {
				unknown = &Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: f.runtime, ConfigPath: f.path, Key: f.key, Err: f.err,
					Fix: "fix the syntax of " + f.path}
			}
		case f.every:
			tk, err := readToolkit(root, f.binary)
			if err != nil {
				if unknown == nil {
					unknown = &Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: f.runtime, ConfigPath: tk.path, Key: KeyAcceptEnvvar, Err: err,
						Fix: "fix the syntax of " + tk.path}
				}
				continue
			}
			if tk.acceptEnvvar {
				return Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: f.runtime, ConfigPath: tk.path, Key: KeyAcceptEnvvar, Mode: tk.mode,
					Fix: fixFor(f.runtime, tk.path)}
			}
			if refused == nil {
				refused = &Door{State: Closed, Reason: ReasonEnvvarRefused, Runtime: f.runtime, ConfigPath: tk.path, Key: KeyAcceptEnvvar, Mode: tk.mode}
			}
		default:
			if handler == nil {
				handler = &Door{State: Closed, Reason: ReasonNotDefault, Runtime: f.runtime, ConfigPath: f.path, Key: f.key}
			}
		}
	}
	for _, d := range []*Door{unknown, refused, handler} {
		if d != nil {
			return *d
		}
	}
	return Door{State: Closed, Reason: ReasonNoNVIDIARuntime}
}

// isNVIDIARuntime says whether a runtime binary is NVIDIA's
// (nvidia-container-runtime, and its .cdi and .legacy variants).
func isNVIDIARuntime(path string) bool {
	return strings.HasPrefix(filepath.Base(path), "nvidia-container-runtime") && !isNVIDIAHook(path)
}

// isNVIDIAHook says whether an OCI hook is NVIDIA's legacy prestart hook.
func isNVIDIAHook(path string) bool {
	switch filepath.Base(path) {
	case "nvidia-container-runtime-hook", "nvidia-container-toolkit":
		return true
	}
	return false
}

// under is host path p as read under root.
func under(root, p string) string { return filepath.Join(root, p) }

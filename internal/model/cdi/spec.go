package cdi

import (
	"encoding/json"
	"errors"
	"fmt"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// DeviceNode is a device node the container gets, such as /dev/nvidia0.
// Its type and major/minor numbers are left out: the runtime reads them from
// HostPath when it injects the device, so a spec stays right when a module
// reload gives a node (nvidia-uvm's, say) a new major number.
type DeviceNode struct {
	// Path is the node's path in the container.
	Path string
	// HostPath is the node on the host; empty means Path.
	HostPath string
	// Permissions is the cgroup access, a subset of "rwm"; empty means "rwm".
	Permissions string
}

// Mount is a bind mount of a host file or directory into the container.
type Mount struct {
	HostPath      string
	ContainerPath string
	// Options are the mount options; nil means ReadOnlyBind().
	Options []string
}

// NetDevice moves a host network interface into the container's network
// namespace, renamed to Name. It needs CDI 1.1.0, which the spec's
// version then says.
type NetDevice struct {
	HostInterfaceName string
	Name              string
}

// Hook is an OCI hook the runtime runs on the host for the container.
type Hook struct {
	// Name is the OCI hook point, such as "createContainer".
	Name string
	// Path is the program's absolute path on the host.
	Path string
	// Args are the program's arguments, Args[0] being its name.
	Args []string
	// Env is the program's whole environment. Never empty for a hook of ours:
	// runc runs a hook whose entry has none with the container's environment,
	// which the image chose.
	Env []string
}

// Edits are the changes a runtime makes to a container, for one device or
// for every container that gets at least one device of a spec.
type Edits struct {
	// Env holds "NAME=value" entries.
	Env        []string
	Nodes      []DeviceNode
	Mounts     []Mount
	NetDevices []NetDevice
	Hooks      []Hook
}

// Device is one named CDI device. A device must carry at least one edit.
type Device struct {
	// Name is the device's unqualified name ("0", "GPU-…"): letters,
	// digits, '_', '-', '.' and ':', starting and ending with a letter or
	// digit.
	Name string
	Edits
}

// ReadOnlyBind returns the options of a read-only bind mount that cannot
// carry setuid binaries or device nodes into the container.
func ReadOnlyBind() []string {
	return []string{"ro", "nosuid", "nodev", "bind"}
}

// Spec builds the CDI spec of kind ("vendor/class", e.g. "nvidia.com/gpu")
// holding devices, in the order given, and common, the edits every
// container that gets any of them also gets. Its version is the lowest
// CDI version that can express it, so older runtimes can read it too. The
// spec is validated (see Validate) before it is returned.
func Spec(kind string, devices []Device, common Edits) (_ *specs.Spec, err error) {
	defer recoverCDI(&err, "CDI spec "+kind)
	s := &specs.Spec{
		Kind:           kind,
		Devices:        make([]specs.Device, 0, len(devices)),
		ContainerEdits: common.spec(),
	}
	for _, d := range devices {
		s.Devices = append(s.Devices, specs.Device{Name: d.Name, ContainerEdits: d.Edits.spec()})
	}
	v, err := specs.MinimumRequiredVersion(s)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", kind, err)
	}
	s.Version = v
	if err := Validate(s); err != nil {
		return nil, err
	}
	return s, nil
}

func (e Edits) spec() specs.ContainerEdits {
	var out specs.ContainerEdits
	if len(e.Env) > 0 {
		out.Env = append([]string(nil), e.Env...)
	}
	for _, n := range e.Nodes {
		host := n.HostPath
		if host == n.Path {
			host = ""
		}
		out.DeviceNodes = append(out.DeviceNodes, &specs.DeviceNode{Path: n.Path, HostPath: host, Permissions: n.Permissions})
	}
	for _, m := range e.Mounts {
		opts := m.Options
		if opts == nil {
			opts = ReadOnlyBind()
		}
		out.Mounts = append(out.Mounts, &specs.Mount{
			HostPath:      m.HostPath,
			ContainerPath: m.ContainerPath,
			Options:       append([]string(nil), opts...),
		})
	}
	for _, d := range e.NetDevices {
		out.NetDevices = append(out.NetDevices, &specs.LinuxNetDevice{HostInterfaceName: d.HostInterfaceName, Name: d.Name})
	}
	for _, h := range e.Hooks {
		out.Hooks = append(out.Hooks, &specs.Hook{HookName: h.Name, Path: h.Path, Args: append([]string(nil), h.Args...), Env: append([]string(nil), h.Env...)})
	}
	return out
}

// Validate checks s the way the CDI library checks a spec it loads: a known
// version new enough for the fields used, a valid vendor/class kind, valid
// container edits, and at least one device, each with a valid, unique name
// and at least one edit of its own. It uses the library's own validators.
// Annotations are not checked (the library's loader, v1.1.0, does not
// check them either); Writer.Write also runs that loader on the file.
func Validate(s *specs.Spec) (err error) {
	if s == nil {
		return errors.New("CDI spec: nil")
	}
	fail := func(err error) error { return fmt.Errorf("CDI spec %s: %w", s.Kind, err) }
	defer recoverCDI(&err, "CDI spec "+s.Kind)
	if err := specs.ValidateVersion(s); err != nil {
		return fail(err)
	}
	vendor, class := parser.ParseQualifier(s.Kind)
	if vendor == "" {
		return fail(fmt.Errorf("kind %q is not vendor/class (example: %q)", s.Kind, GPUKind))
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return fail(err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return fail(err)
	}
	if err := (&cdiapi.ContainerEdits{ContainerEdits: &s.ContainerEdits}).Validate(); err != nil {
		return fail(err)
	}
	if len(s.Devices) == 0 {
		return fail(errors.New("no devices"))
	}
	seen := make(map[string]bool, len(s.Devices))
	for i := range s.Devices {
		d := &s.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return fail(fmt.Errorf("device %q: %w", d.Name, err))
		}
		if seen[d.Name] {
			return fail(fmt.Errorf("device %q appears twice", d.Name))
		}
		seen[d.Name] = true
		e := d.ContainerEdits
		if len(e.Env)+len(e.DeviceNodes)+len(e.NetDevices)+len(e.Hooks)+len(e.Mounts)+len(e.AdditionalGIDs) == 0 && e.IntelRdt == nil {
			return fail(fmt.Errorf("device %q has no container edits", d.Name))
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &e}).Validate(); err != nil {
			return fail(fmt.Errorf("device %q: %w", d.Name, err))
		}
	}
	return nil
}

// Marshal encodes s as indented JSON with a final newline, the form Writer
// writes. It does not validate s.
func Marshal(s *specs.Spec) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding CDI spec %s: %w", s.Kind, err)
	}
	return append(b, '\n'), nil
}

// QualifiedName is the name a runtime is asked for: kind "=" device, e.g.
// "gpu-device-plugin.github.io/gpu=GPU-8c3a…" or "example.com/nic=0000:4f:00.0".
func QualifiedName(kind, device string) string {
	return kind + "=" + device
}

// Annotations returns the container annotation that asks a runtime for
// devices (qualified names) the older way, for runtimes that read
// cdi.k8s.io/… annotations rather than the device-plugin CDIDevices field:
// {"cdi.k8s.io/<plugin>_<id>": "name,name"}. id makes the key unique among
// one container's requests ('/' becomes '_'); plugin+id must fit in 63
// characters.
func Annotations(plugin, id string, devices []string) (_ map[string]string, err error) {
	if len(devices) == 0 {
		return nil, errors.New("CDI annotation: no devices")
	}
	defer recoverCDI(&err, "CDI annotation")
	a, err := cdiapi.UpdateAnnotations(nil, plugin, id, devices)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// ErrCDIPanic marks a panic inside the CDI library turned into an error.
var ErrCDIPanic = errors.New("the CDI library panicked")

// recoverCDI turns a panic inside the CDI library into an error: v1.1.0
// slices a one-character vendor or class name out of range, and a bad
// name in a config file must not take the whole plugin down.
func recoverCDI(err *error, what string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%s: %w: %v", what, ErrCDIPanic, r)
	}
}

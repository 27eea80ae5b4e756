package cdi

import (
	"errors"
	"slices"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// nicDevices are what a NIC pool could publish: RDMA device nodes per
// port, the shared rdma_cm node, and a netdevice moved into the container.
func nicDevices() ([]Device, Edits) {
	devices := []Device{
		{Name: "mlx5_0", Edits: Edits{
			Nodes:      []DeviceNode{{Path: "/dev/infiniband/uverbs0", Permissions: "rw"}},
			Env:        []string{"NIC_PCI_ADDRESS=0000:0c:00.0"},
			NetDevices: []NetDevice{{HostInterfaceName: "ens1f0np0", Name: "net1"}},
		}},
		{Name: "mlx5_1", Edits: Edits{
			Nodes: []DeviceNode{{Path: "/dev/infiniband/uverbs1", HostPath: "/host/dev/infiniband/uverbs1", Permissions: "rw"}},
		}},
	}
	common := Edits{Nodes: []DeviceNode{{Path: "/dev/infiniband/rdma_cm", Permissions: "rw"}}}
	return devices, common
}

func TestSpecGenericNICGolden(t *testing.T) {
	devices, common := nicDevices()
	s, err := Spec("example.com/nic", devices, common)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "1.1.0" {
		t.Errorf("version %q, want 1.1.0, the first with netDevices", s.Version)
	}
	b, err := Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nic-example", b)
	// What Marshal writes is what the library parses back.
	back, err := cdiapi.ParseSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(back); err != nil {
		t.Fatal(err)
	}
}

func TestSpecVersionIsTheOldestThatFits(t *testing.T) {
	node := Edits{Nodes: []DeviceNode{{Path: "/dev/foo0"}}}
	tests := []struct {
		name    string
		kind    string
		devices []Device
		want    string
	}{
		{"plain nodes", "example.com/foo", []Device{{Name: "foo0", Edits: node}}, "0.3.0"},
		{"name starting with a digit", "example.com/foo", []Device{{Name: "0", Edits: node}}, "0.5.0"},
		{"host path", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{Nodes: []DeviceNode{{Path: "/dev/foo0", HostPath: "/host/dev/foo0"}}}}}, "0.5.0"},
		{"host path equal to path is left out", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{Nodes: []DeviceNode{{Path: "/dev/foo0", HostPath: "/dev/foo0"}}}}}, "0.3.0"},
		{"dotted class", "example.com/foo.bar", []Device{{Name: "foo0", Edits: node}}, "0.6.0"},
		{"net device", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{NetDevices: []NetDevice{{HostInterfaceName: "eth1", Name: "net1"}}}}}, "1.1.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Spec(tt.kind, tt.devices, Edits{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != tt.want {
				t.Errorf("version %q, want %q", s.Version, tt.want)
			}
		})
	}
}

func TestSpecMountOptions(t *testing.T) {
	s, err := Spec("example.com/foo", []Device{{Name: "foo0", Edits: Edits{Mounts: []Mount{
		{HostPath: "/a", ContainerPath: "/a"},
		{HostPath: "/b", ContainerPath: "/b", Options: []string{"rw", "bind"}},
	}}}}, Edits{})
	if err != nil {
		t.Fatal(err)
	}
	m := s.Devices[0].ContainerEdits.Mounts
	if !slices.Equal(m[0].Options, []string{"ro", "nosuid", "nodev", "bind"}) || !slices.Equal(m[1].Options, []string{"rw", "bind"}) {
		t.Errorf("options %v and %v", m[0].Options, m[1].Options)
	}
}

func TestSpecRefusesWhatCDIRefuses(t *testing.T) {
	node := Edits{Nodes: []DeviceNode{{Path: "/dev/foo0"}}}
	tests := []struct {
		name    string
		kind    string
		devices []Device
		common  Edits
		want    string
	}{
		{"device name with a space", "example.com/foo", []Device{{Name: "foo 0", Edits: node}}, Edits{}, `invalid character ' ' in device name "foo 0"`},
		{"empty device name", "example.com/foo", []Device{{Name: "", Edits: node}}, Edits{}, "invalid (empty) device name"},
		{"duplicate device", "example.com/foo", []Device{{Name: "foo0", Edits: node}, {Name: "foo0", Edits: node}}, Edits{}, `device "foo0" appears twice`},
		{"device without edits", "example.com/foo", []Device{{Name: "foo0"}}, node, `device "foo0" has no container edits`},
		{"no devices", "example.com/foo", nil, node, "no devices"},
		{"kind without a vendor", "foo", []Device{{Name: "foo0", Edits: node}}, Edits{}, `kind "foo" is not vendor/class`},
		{"vendor with a space", "exa mple.com/foo", []Device{{Name: "foo0", Edits: node}}, Edits{}, "invalid vendor"},
		{"class with a bad character", "example.com/fo:o", []Device{{Name: "foo0", Edits: node}}, Edits{}, "invalid class"},
		{"env without =", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{Env: []string{"FOO"}}}}, Edits{}, `invalid environment variable "FOO"`},
		{"common node without path", "example.com/foo", []Device{{Name: "foo0", Edits: node}}, Edits{Nodes: []DeviceNode{{HostPath: "/dev/x"}}}, "invalid (empty) device path"},
		{"bad permissions", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{Nodes: []DeviceNode{{Path: "/dev/foo0", Permissions: "rwx"}}}}}, Edits{}, `invalid permissions "rwx"`},
		{"mount without container path", "example.com/foo", []Device{{Name: "foo0", Edits: Edits{Mounts: []Mount{{HostPath: "/a"}}}}}, Edits{}, "empty container path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Spec(tt.kind, tt.devices, tt.common)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("spec %+v, error %v, want one containing %q", s, err, tt.want)
			}
		})
	}
}

func TestValidateVersion(t *testing.T) {
	s := &specs.Spec{Version: "0.3.0", Kind: "example.com/foo", Devices: []specs.Device{{
		Name: "foo0", ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{Path: "/dev/foo0", HostPath: "/x"}}},
	}}}
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), "at least v0.5.0") {
		t.Errorf("error %v, want the version refused", err)
	}
	s.Version = "9.9.9"
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), `invalid version "9.9.9"`) {
		t.Errorf("error %v, want the version refused", err)
	}
	if err := Validate(nil); err == nil {
		t.Error("nil spec accepted")
	}
}

func TestQualifiedName(t *testing.T) {
	for _, tt := range []struct{ kind, device, want string }{
		{GPUKind, "GPU-01b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d0", "gpu-device-plugin.github.io/gpu=GPU-01b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d0"},
		{GPUKind, "0", "gpu-device-plugin.github.io/gpu=0"},
		{"nvidia.com/gpu", "0", "nvidia.com/gpu=0"},
		{"example.com/nic", "mlx5_0", "example.com/nic=mlx5_0"},
	} {
		got := QualifiedName(tt.kind, tt.device)
		if got != tt.want {
			t.Errorf("QualifiedName(%q, %q) = %q, want %q", tt.kind, tt.device, got, tt.want)
		}
		if vendor, class, name, err := parser.ParseQualifiedName(got); err != nil || vendor+"/"+class != tt.kind || name != tt.device {
			t.Errorf("the CDI parser reads %q as %q %q %q, %v", got, vendor, class, name, err)
		}
	}
}

func TestAnnotations(t *testing.T) {
	names := []string{QualifiedName(GPUKind, "GPU-01b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d0"), QualifiedName(GPUKind, "3")}
	t.Run("one key per request, names joined, readable by the runtime's parser", func(t *testing.T) {
		got, err := Annotations("gpu-device-plugin", GPUKind, names)
		if err != nil {
			t.Fatal(err)
		}
		const key = "cdi.k8s.io/gpu-device-plugin_gpu-device-plugin.github.io_gpu"
		if len(got) != 1 || got[key] != strings.Join(names, ",") {
			t.Fatalf("annotations %v, want %s=%s", got, key, strings.Join(names, ","))
		}
		keys, devices, err := cdiapi.ParseAnnotations(got)
		if err != nil || !slices.Equal(keys, []string{key}) || !slices.Equal(devices, names) {
			t.Errorf("runtime parses keys %v devices %v, %v", keys, devices, err)
		}
	})
	for _, tt := range []struct {
		name, plugin, id string
		devices          []string
		want             string
	}{
		{"unqualified device", "gpu-device-plugin", "x", []string{"GPU-0"}, "unqualified device"},
		{"no devices", "gpu-device-plugin", "x", nil, "no devices"},
		{"key too long", "gpu-device-plugin", strings.Repeat("a", 60), names, "too long"},
		{"no plugin", "", "x", names, "invalid plugin name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Annotations(tt.plugin, tt.id, tt.devices)
			if err == nil || !strings.Contains(err.Error(), tt.want) || got != nil {
				t.Errorf("annotations %v, error %v, want one containing %q", got, err, tt.want)
			}
		})
	}
}

// The CDI library (v1.1.0) panics on a one-character vendor or class; a
// pool named "example.com/x" must give an error, not crash the plugin.
func TestCDILibraryPanicIsAnError(t *testing.T) {
	dev := []Device{{Name: "0000:18:00.0", Edits: Edits{Nodes: []DeviceNode{{Path: "/dev/infiniband/uverbs0"}}}}}
	tests := []struct {
		name string
		call func() error
	}{
		{name: "Spec with a one-character class", call: func() error { _, err := Spec("example.com/x", dev, Edits{}); return err }},
		{name: "Spec with a one-character vendor", call: func() error { _, err := Spec("x/nic", dev, Edits{}); return err }},
		{name: "Validate with a one-character class", call: func() error {
			return Validate(&specs.Spec{Version: "0.5.0", Kind: "example.com/x", Devices: []specs.Device{{Name: "a", ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}}}}})
		}},
		{name: "Annotations naming a one-character class", call: func() error {
			_, err := Annotations(DefaultOwner, "example.com_x", []string{"example.com/x=0000:18:00.0"})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrCDIPanic) || !strings.Contains(err.Error(), "CDI") {
				t.Errorf("err = %v, want the recovered panic", err)
			}
		})
	}
}

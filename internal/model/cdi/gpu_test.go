package cdi

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"

	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from what the code generates")

// golden compares got with testdata/<name>.golden, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./cdi/ -update to create it)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Fatalf("%s differs at line %d:\n got  %q\n want %q\n(run go test ./cdi/ -update if the change is intended)", p, i+1, gl, wl)
		}
	}
}

// dgxA100 discovers the eight GPUs of nvmltest's mock DGX A100, with
// fixed UUIDs so generated specs are stable.
func dgxA100(t *testing.T) []nvml.GPU {
	t.Helper()
	s := nvmltest.NewDGXA100()
	for i := range s.Devices {
		nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-%d1b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d%d", i, i)
	}
	inv, err := nvml.Discover(s, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 8 {
		t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
	}
	return inv.GPUs
}

// dgxHost is the fake host of testdata/driver-root with the mock DGX A100.
type dgxHost struct {
	root   string
	chars  bool // device nodes are real character devices, not FIFOs
	gpus   []nvml.GPU
	driver driverroot.Files
}

func newDGXHost(t *testing.T) dgxHost {
	t.Helper()
	root, chars := cditest.Tree(t, cditest.Manifest(t))
	d, err := driverroot.FindArch(root, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	return dgxHost{root: root, chars: chars, gpus: dgxA100(t), driver: d}
}

func (h dgxHost) devRoot() string { return filepath.Join(h.root, "dev") }

func TestGPUSpecGolden(t *testing.T) {
	h := newDGXHost(t)
	// Discovery order must not matter: the spec lists GPUs by index.
	gpus := slices.Clone(h.gpus)
	slices.Reverse(gpus)
	s, err := GPUSpec(gpus, h.driver, GPUSpecOptions{DevRoot: h.devRoot(), HookPath: "/usr/libexec/gpu-device-plugin/gpu-device-plugin-cdi-hook"})
	if err != nil {
		t.Fatal(err)
	}
	path, err := Writer{Dir: t.TempDir()}.Write(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "gpu-dgx-a100", bytes.ReplaceAll(b, []byte(h.root), []byte("$ROOT")))
}

func TestGPUSpecDevices(t *testing.T) {
	h := newDGXHost(t)
	tests := []struct {
		name      string
		gpus      []nvml.GPU
		driver    driverroot.Files
		devRoot   string
		wantErr   string
		wantNames []string
		wantNodes []string // common device nodes
		mounts    int
	}{
		{
			name:      "one GPU by UUID and by index, control nodes that exist, driver mounts",
			gpus:      []nvml.GPU{{Index: 3, UUID: "GPU-abc", Minor: 5}},
			driver:    h.driver,
			devRoot:   h.devRoot(),
			wantNames: []string{"GPU-abc", "3"},
			wantNodes: []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
			mounts:    len(DriverMounts(h.driver)),
		},
		{
			name:      "no driver: device nodes only",
			gpus:      []nvml.GPU{{Index: 0, UUID: "GPU-abc", Minor: 0}},
			devRoot:   filepath.Join(t.TempDir(), "empty-dev"),
			wantNames: []string{"GPU-abc", "0"},
		},
		{
			name:    "no GPUs is no spec",
			driver:  h.driver,
			devRoot: h.devRoot(),
			wantErr: "no devices",
		},
		{
			name:    "a UUID seen twice is refused",
			gpus:    []nvml.GPU{{Index: 0, UUID: "GPU-abc"}, {Index: 1, UUID: "GPU-abc", Minor: 1}},
			wantErr: `device "GPU-abc" appears twice`,
		},
		{
			name:    "a UUID CDI cannot name is refused",
			gpus:    []nvml.GPU{{Index: 0, UUID: "GPU abc"}},
			wantErr: `invalid character ' ' in device name "GPU abc"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := GPUSpec(tt.gpus, tt.driver, GPUSpecOptions{DevRoot: tt.devRoot})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != GPUKind || s.Version != "0.5.0" {
				t.Errorf("kind %q version %q, want %q 0.5.0 (the oldest that allows names starting with a digit)", s.Kind, s.Version, GPUKind)
			}
			var names []string
			for _, d := range s.Devices {
				names = append(names, d.Name)
				n := d.ContainerEdits.DeviceNodes
				want := "/dev/nvidia" + strconv.Itoa(tt.gpus[0].Minor)
				if len(n) != 1 || n[0].Path != want || n[0].HostPath != filepath.Join(tt.devRoot, filepath.Base(want)) || n[0].Permissions != "rw" {
					t.Errorf("device %s nodes %+v, want %s", d.Name, n[0], want)
				}
			}
			if !slices.Equal(names, tt.wantNames) {
				t.Errorf("devices %v, want %v", names, tt.wantNames)
			}
			var nodes []string
			for _, n := range s.ContainerEdits.DeviceNodes {
				nodes = append(nodes, n.Path)
			}
			if !slices.Equal(nodes, tt.wantNodes) || len(s.ContainerEdits.Mounts) != tt.mounts {
				t.Errorf("common nodes %v and %d mounts, want %v and %d", nodes, len(s.ContainerEdits.Mounts), tt.wantNodes, tt.mounts)
			}
		})
	}
}

// TestGPUSpecThroughCDICache writes the spec, loads the directory with the
// CDI library's own cache, as a runtime does, and injects devices into an
// empty OCI spec.
func TestGPUSpecThroughCDICache(t *testing.T) {
	h := newDGXHost(t)
	s, err := GPUSpec(h.gpus, h.driver, GPUSpecOptions{DevRoot: h.devRoot()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := (Writer{Dir: dir}).Write(s); err != nil {
		t.Fatal(err)
	}
	// Another vendor's spec in the same directory changes nothing.
	other := "cdiVersion: 0.5.0\nkind: example.com/fpga\ndevices:\n- name: fpga0\n  containerEdits:\n    env: [FPGA=0]\n"
	if err := os.WriteFile(filepath.Join(dir, "example.com-fpga.yaml"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}

	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	want := []string{"example.com/fpga=fpga0"}
	for _, g := range h.gpus {
		want = append(want, QualifiedName(GPUKind, g.UUID), QualifiedName(GPUKind, strconv.Itoa(g.Index)))
	}
	slices.Sort(want)
	if got := cache.ListDevices(); !slices.Equal(got, want) {
		t.Fatalf("CDI cache devices:\n got  %v\n want %v", got, want)
	}

	majors := map[string][2]int64{"nvidiactl": {195, 255}, "nvidia-uvm": {508, 0}, "nvidia-uvm-tools": {508, 1}}
	for _, g := range h.gpus {
		majors["nvidia"+strconv.Itoa(g.Minor)] = [2]int64{195, int64(g.Minor)}
	}
	// check injects names and verifies the OCI spec holds exactly the
	// given GPUs' nodes, the control nodes and the driver's mounts.
	check := func(t *testing.T, names []string, gpus ...nvml.GPU) {
		t.Helper()
		spec := &oci.Spec{}
		if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
			t.Fatalf("injecting %v: %v (unresolved %v)", names, err, unresolved)
		}
		wantNodes := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}
		for _, g := range gpus {
			wantNodes = append(wantNodes, "/dev/nvidia"+strconv.Itoa(g.Minor))
		}
		slices.Sort(wantNodes)
		var gotNodes []string
		for _, d := range spec.Linux.Devices {
			gotNodes = append(gotNodes, d.Path)
			mm := majors[filepath.Base(d.Path)]
			switch {
			case h.chars && (d.Type != "c" || d.Major != mm[0] || d.Minor != mm[1]):
				t.Errorf("%s is %s %d:%d, want c %d:%d", d.Path, d.Type, d.Major, d.Minor, mm[0], mm[1])
			case !h.chars && d.Type != "p":
				t.Errorf("%s is type %q, want the test's FIFO", d.Path, d.Type)
			}
		}
		slices.Sort(gotNodes)
		if !slices.Equal(gotNodes, wantNodes) {
			t.Errorf("device nodes %v, want %v", gotNodes, wantNodes)
		}
		if h.chars {
			allowed := 0
			for _, r := range spec.Linux.Resources.Devices {
				if r.Allow && r.Type == "c" && r.Access == "rw" {
					allowed++
				}
			}
			if allowed != len(wantNodes) {
				t.Errorf("%d device cgroup rules allow rw, want %d: %+v", allowed, len(wantNodes), spec.Linux.Resources.Devices)
			}
		}

		wantMounts := map[string]string{}
		for _, m := range DriverMounts(h.driver) {
			wantMounts[m.ContainerPath] = m.HostPath
		}
		if len(spec.Mounts) != len(wantMounts) {
			t.Errorf("%d mounts, want %d", len(spec.Mounts), len(wantMounts))
		}
		for _, m := range spec.Mounts {
			if wantMounts[m.Destination] != m.Source || !slices.Equal(m.Options, ReadOnlyBind()) {
				t.Errorf("mount %s <- %s %v, want <- %s read-only", m.Destination, m.Source, m.Options, wantMounts[m.Destination])
			}
			if _, err := os.Stat(m.Source); err != nil || !strings.HasPrefix(m.Source, h.root+"/") {
				t.Errorf("mount source %s is not in the driver root: %v", m.Source, err)
			}
		}
		if spec.Process == nil || !slices.Equal(spec.Process.Env, []string{VisibleDevicesVoid}) {
			t.Errorf("env %v, want only %s", spec.Process, VisibleDevicesVoid)
		}
	}
	for _, g := range h.gpus {
		for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
			t.Run(name, func(t *testing.T) { check(t, []string{QualifiedName(GPUKind, name)}, g) })
		}
	}
	t.Run("two GPUs share one set of control nodes and mounts", func(t *testing.T) {
		check(t, []string{QualifiedName(GPUKind, h.gpus[2].UUID), QualifiedName(GPUKind, "5")}, h.gpus[2], h.gpus[5])
	})
	t.Run("unknown GPU is unresolved", func(t *testing.T) {
		unresolved, err := cache.InjectDevices(&oci.Spec{}, QualifiedName(GPUKind, "8"))
		if err == nil || !slices.Equal(unresolved, []string{QualifiedName(GPUKind, "8")}) {
			t.Fatalf("unresolved %v, error %v", unresolved, err)
		}
	})
}

// toolkitSpec is cditest.ToolkitSpec of gpus.
func toolkitSpec(gpus []nvml.GPU, devRoot string) string {
	var tg []cditest.GPU
	for _, g := range gpus {
		tg = append(tg, cditest.GPU{Index: g.Index, Minor: g.Minor, UUID: g.UUID})
	}
	return cditest.ToolkitSpec(tg, devRoot)
}

// TestGPUSpecBesideToolkitSpec puts our spec and the toolkit's in one
// directory, as on a node with the NVIDIA Container Toolkit: the CDI
// cache must report no conflict and resolve every name of both.
func TestGPUSpecBesideToolkitSpec(t *testing.T) {
	h := newDGXHost(t)
	s, err := GPUSpec(h.gpus, h.driver, GPUSpecOptions{DevRoot: h.devRoot()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := (Writer{Dir: dir}).Write(s); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(toolkitSpec(h.gpus, h.devRoot())), 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors with both specs: %v", errs)
	}
	var ours, theirs []string
	for _, g := range h.gpus {
		ours = append(ours, QualifiedName(GPUKind, g.UUID))
		theirs = append(theirs, QualifiedName("nvidia.com/gpu", g.UUID), QualifiedName("nvidia.com/gpu", strconv.Itoa(g.Index)))
	}
	for _, names := range [][]string{ours, theirs, {"nvidia.com/gpu=all"}} {
		if unresolved, err := cache.InjectDevices(&oci.Spec{}, names...); err != nil {
			t.Errorf("%d names unresolvable beside the toolkit's spec: %v (%v)", len(unresolved), unresolved, err)
		}
	}
	if got := (Writer{Dir: dir}).Conflicts(GPUKind, dir); len(got) != 0 {
		t.Errorf("Conflicts(%s) = %v, want none: the toolkit's kind is not ours", GPUKind, got)
	}
	if got := (Writer{Dir: dir}).Conflicts("nvidia.com/gpu", dir); !slices.Equal(got, []string{filepath.Join(dir, "nvidia.yaml")}) {
		t.Errorf("Conflicts(nvidia.com/gpu) = %v, want the toolkit's file", got)
	}
}

func TestGPUSpecHook(t *testing.T) {
	h := newDGXHost(t)
	const hook = "/usr/libexec/gpu-device-plugin/" + HookName
	var cudaDir string
	for _, f := range h.driver.Libraries {
		if filepath.Base(f.Path) == "libcuda.so.1" {
			cudaDir = filepath.Dir(f.Path)
		}
	}
	if cudaDir == "" {
		t.Fatal("the test driver root has no libcuda.so.1")
	}
	noCUDA := h.driver
	noCUDA.Libraries = slices.DeleteFunc(slices.Clone(noCUDA.Libraries), func(f driverroot.File) bool {
		return strings.HasPrefix(filepath.Base(f.Path), "libcuda.so")
	})
	tests := []struct {
		name     string
		driver   driverroot.Files
		hookPath string
		want     []string
	}{
		{"link and ld cache", h.driver, hook, []string{HookName, "create-container", "--link", "libcuda.so.1::" + cudaDir + "/libcuda.so", "--folder", cudaDir}},
		{"no hook path, no hook", h.driver, "", nil},
		{"no libcuda, no hook", noCUDA, hook, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := GPUSpec(h.gpus, tt.driver, GPUSpecOptions{DevRoot: h.devRoot(), HookPath: tt.hookPath})
			if err != nil {
				t.Fatal(err)
			}
			hooks := s.ContainerEdits.Hooks
			if tt.want == nil {
				if len(hooks) != 0 {
					t.Fatalf("hooks %+v, want none", hooks)
				}
				return
			}
			if len(hooks) != 1 || hooks[0].HookName != "createContainer" || hooks[0].Path != tt.hookPath || !slices.Equal(hooks[0].Args, tt.want) {
				t.Fatalf("hooks %+v, want one createContainer hook %s %v", hooks, tt.hookPath, tt.want)
			}
			// The CDI library puts it into the OCI spec.
			dir := t.TempDir()
			if _, err := (Writer{Dir: dir}).Write(s); err != nil {
				t.Fatal(err)
			}
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			spec := &oci.Spec{}
			if _, err := cache.InjectDevices(spec, QualifiedName(GPUKind, h.gpus[0].UUID)); err != nil {
				t.Fatal(err)
			}
			if spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 1 || !slices.Equal(spec.Hooks.CreateContainer[0].Args, tt.want) {
				t.Fatalf("OCI hooks %+v, want the createContainer hook", spec.Hooks)
			}
		})
	}
}

// TestGPUSpecMIG gives GPU 0 of the DGX A100 two MIG devices and one whose
// capabilities are unknown: the spec validates through the CDI cache, each
// MIG UUID resolves to the parent's node and its own two capability
// nodes, the unknown one is left out and the GPU keeps its own names.
func TestGPUSpecMIG(t *testing.T) {
	const capMajor = 237
	caps := [][]int{{12, 13}, {21, 22}}
	manifest := cditest.Manifest(t)
	for _, c := range caps {
		for _, minor := range c {
			manifest += fmt.Sprintf("char dev/%s %d %d\n", MIGCapNode(minor), capMajor, minor)
		}
	}
	root, chars := cditest.Tree(t, manifest)
	driver, err := driverroot.FindArch(root, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	devRoot := filepath.Join(root, "dev")
	gpus := dgxA100(t)
	parent := &gpus[0]
	parent.MIGEnabled = true
	parent.MIG = []nvml.MIGDevice{
		{UUID: "MIG-11111111-2222-3333-4444-555555555555", Index: 0, GPUInstance: 1, ComputeInstance: 0, Profile: "3g.20gb", CapMinors: caps[0]},
		{UUID: "MIG-66666666-7777-8888-9999-000000000000", Index: 1, GPUInstance: 2, ComputeInstance: 0, Profile: "3g.20gb", CapMinors: caps[1]},
		{UUID: "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", Index: 2, GPUInstance: 7, ComputeInstance: 0, Profile: "1g.5gb"},
	}
	s, err := GPUSpec(gpus, driver, GPUSpecOptions{DevRoot: devRoot})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := (Writer{Dir: dir}).Write(s); err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	var want []string
	for _, g := range gpus {
		want = append(want, QualifiedName(GPUKind, g.UUID), QualifiedName(GPUKind, strconv.Itoa(g.Index)))
	}
	want = append(want, QualifiedName(GPUKind, parent.MIG[0].UUID), QualifiedName(GPUKind, parent.MIG[1].UUID))
	slices.Sort(want)
	if got := cache.ListDevices(); !slices.Equal(got, want) {
		t.Fatalf("CDI cache devices:\n got  %v\n want %v", got, want)
	}

	type node struct {
		path         string
		major, minor int64
	}
	controls := []node{{"/dev/nvidia-uvm", 508, 0}, {"/dev/nvidia-uvm-tools", 508, 1}, {"/dev/nvidiactl", 195, 255}}
	for i, m := range parent.MIG[:2] {
		t.Run(m.UUID, func(t *testing.T) {
			spec := &oci.Spec{}
			if unresolved, err := cache.InjectDevices(spec, QualifiedName(GPUKind, m.UUID)); err != nil {
				t.Fatalf("injecting: %v (unresolved %v)", err, unresolved)
			}
			wantNodes := append(slices.Clone(controls),
				node{"/dev/nvidia" + strconv.Itoa(parent.Minor), 195, int64(parent.Minor)},
				node{"/dev/" + MIGCapNode(caps[i][0]), capMajor, int64(caps[i][0])},
				node{"/dev/" + MIGCapNode(caps[i][1]), capMajor, int64(caps[i][1])})
			slices.SortFunc(wantNodes, func(a, b node) int { return strings.Compare(a.path, b.path) })
			var got []node
			for _, d := range spec.Linux.Devices {
				got = append(got, node{d.Path, d.Major, d.Minor})
				if !chars && d.Type != "p" {
					t.Errorf("%s is type %q, want the test's FIFO", d.Path, d.Type)
				}
			}
			slices.SortFunc(got, func(a, b node) int { return strings.Compare(a.path, b.path) })
			if !chars {
				// FIFOs carry no numbers: compare the paths.
				for j := range got {
					got[j].major, got[j].minor = 0, 0
				}
				for j := range wantNodes {
					wantNodes[j].major, wantNodes[j].minor = 0, 0
				}
			}
			if !slices.Equal(got, wantNodes) {
				t.Errorf("device nodes\n got  %v\n want %v", got, wantNodes)
			}
			if len(spec.Mounts) != len(DriverMounts(driver)) {
				t.Errorf("%d mounts, want the driver's %d", len(spec.Mounts), len(DriverMounts(driver)))
			}
		})
	}
	t.Run("two MIG devices of one GPU share its node", func(t *testing.T) {
		spec := &oci.Spec{}
		if _, err := cache.InjectDevices(spec, QualifiedName(GPUKind, parent.MIG[0].UUID), QualifiedName(GPUKind, parent.MIG[1].UUID)); err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, d := range spec.Linux.Devices {
			paths = append(paths, d.Path)
		}
		slices.Sort(paths)
		if len(paths) != len(slices.Compact(slices.Clone(paths))) || len(paths) != len(controls)+5 {
			t.Errorf("device nodes %v, want the controls, /dev/nvidia%d once and four capabilities", paths, parent.Minor)
		}
	})
	t.Run("a MIG device without capabilities is not handed out", func(t *testing.T) {
		name := QualifiedName(GPUKind, parent.MIG[2].UUID)
		if unresolved, err := cache.InjectDevices(&oci.Spec{}, name); err == nil || !slices.Equal(unresolved, []string{name}) {
			t.Fatalf("unresolved %v, error %v", unresolved, err)
		}
	})
}

// device-plugin mode's IMEX channels are devices of the GPU spec of their
// own, named so no GPU can take the name, each with the channel's node;
// the spec validates.
func TestGPUSpecIMEXChannels(t *testing.T) {
	dev := t.TempDir()
	s, err := GPUSpec([]nvml.GPU{{Index: 0, UUID: "GPU-abc", Minor: 0}}, driverroot.Files{}, GPUSpecOptions{DevRoot: dev, ControlNodes: []string{}, IMEXChannels: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"GPU-abc", "0", "imex-channel0"}) {
		t.Fatalf("devices %v", names)
	}
	nodes := s.Devices[2].ContainerEdits.DeviceNodes
	if len(nodes) != 1 || nodes[0].Path != "/dev/nvidia-caps-imex-channels/channel0" || nodes[0].HostPath != filepath.Join(dev, "nvidia-caps-imex-channels", "channel0") {
		t.Errorf("imex-channel0's nodes: %+v", nodes)
	}
	if err := Validate(s); err != nil {
		t.Error(err)
	}
	if got := QualifiedName(GPUKind, IMEXChannelDevice(0)); got != "gpu-device-plugin.github.io/gpu=imex-channel0" {
		t.Errorf("qualified name %q", got)
	}
}

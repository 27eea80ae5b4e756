package gpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// eightGPUs is a DGX-like node: two NUMA nodes, all pairs on NVSwitch.
func eightGPUs() ([]nvml.GPU, nvml.Topology) {
	gpus := make([]nvml.GPU, 8)
	topo := nvml.Topology{Links: make([][]nvml.Link, 8)}
	for i := range gpus {
		gpus[i] = nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08d", i), Minor: i, NUMANode: i / 4, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x10+i)}
		topo.Links[i] = make([]nvml.Link, 8)
		for j := range topo.Links[i] {
			level := nvml.LinkCrossCPU
			if i/4 == j/4 {
				level = nvml.LinkSameNUMA
			}
			topo.Links[i][j] = nvml.Link{NVLinks: 18, PCIe: level}
		}
	}
	return gpus, topo
}

func devRoot(t testing.TB, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func paths(nodes []device.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.ContainerPath)
	}
	return out
}

func TestAllocate(t *testing.T) {
	gpus, topo := eightGPUs()
	root := devRoot(t, "nvidiactl", "nvidia-uvm")
	tests := []struct {
		name     string
		strategy string
		ids      []string
		env      string
		nodes    []string
	}{
		{name: "uuid strategy", ids: []string{"GPU-00000005", "GPU-00000002"}, env: "GPU-00000002,GPU-00000005",
			nodes: []string{"/dev/nvidia2", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm"}},
		{name: "index strategy", strategy: IDStrategyIndex, ids: []string{"GPU-00000007", "GPU-00000000"}, env: "0,7",
			nodes: []string{"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(gpus, topo, Options{IDStrategy: tt.strategy, DevRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := r.Allocate(tt.ids)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Env[VisibleDevicesEnv]; got != tt.env {
				t.Errorf("%s = %q, want %q", VisibleDevicesEnv, got, tt.env)
			}
			if got := paths(resp.Nodes); !slices.Equal(got, tt.nodes) {
				t.Errorf("device nodes = %v, want %v", got, tt.nodes)
			}
			for _, d := range resp.Nodes {
				if d.HostPath != filepath.Join(root, filepath.Base(d.ContainerPath)) || d.Permissions != "rw" {
					t.Errorf("device spec %+v", d)
				}
			}
		})
	}
}

func TestAllocateUnknownGPU(t *testing.T) {
	gpus, topo := eightGPUs()
	r, err := New(gpus, topo, Options{DevRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Allocate([]string{"GPU-nope"}); err == nil {
		t.Fatal("unknown GPU allocated")
	}
}

func TestAllocateRepeatedGPU(t *testing.T) {
	gpus, topo := eightGPUs()
	r, err := New(gpus, topo, Options{DevRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	id := gpus[3].UUID
	if resp, err := r.Allocate([]string{id, gpus[1].UUID, id}); err == nil || !strings.Contains(err.Error(), id) {
		t.Fatalf("Allocate with %s twice = %v, %v; want an error naming it", id, resp, err)
	}
}

func TestNewRejects(t *testing.T) {
	gpus, topo := eightGPUs()
	if _, err := New(gpus, topo, Options{IDStrategy: "serial"}); err == nil {
		t.Error("bad strategy accepted")
	}
	gpus[1].UUID = gpus[0].UUID
	if _, err := New(gpus, topo, Options{}); err == nil {
		t.Error("duplicate UUID accepted")
	}
}

func TestDevicesCarryNUMA(t *testing.T) {
	gpus, topo := eightGPUs()
	gpus[3].NUMANode = -1
	r, err := New(gpus, topo, Options{DevRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	devs := r.Devices()
	if len(devs) != 8 || devs[5].NUMANode != 1 || devs[3].NUMANode != device.NoNUMANode || !devs[0].Healthy || devs[2].ID != "GPU-00000002" {
		t.Fatalf("devices = %+v", devs)
	}
}

func TestPreferredKeepsToOneNUMANode(t *testing.T) {
	gpus, topo := eightGPUs()
	r, err := New(gpus, topo, Options{DevRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Preferred([]string{"GPU-00000000", "GPU-00000004", "GPU-00000005", "GPU-00000006"}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range got {
		if id == "GPU-00000000" {
			t.Fatalf("preferred %v crosses NUMA nodes", got)
		}
	}
}

func TestLinkWeightOrders(t *testing.T) {
	ordered := []nvml.Link{
		{PCIe: nvml.LinkUnknown},
		{PCIe: nvml.LinkCrossCPU},
		{PCIe: nvml.LinkSameNUMA},
		{PCIe: nvml.LinkSingleSwitch},
		{NVLinks: 1, PCIe: nvml.LinkCrossCPU},
		{NVLinks: 12, PCIe: nvml.LinkCrossCPU},
	}
	for i := 1; i < len(ordered); i++ {
		if LinkWeight(ordered[i]) <= LinkWeight(ordered[i-1]) {
			t.Errorf("LinkWeight(%+v) <= LinkWeight(%+v)", ordered[i], ordered[i-1])
		}
	}
}

func TestDeviceListStrategies(t *testing.T) {
	gpus, topo := eightGPUs()
	root := devRoot(t, "nvidiactl")
	ids := []string{"GPU-00000003", "GPU-00000001"}
	byUUID := []string{cdi.QualifiedName(cdi.GPUKind, "GPU-00000001"), cdi.QualifiedName(cdi.GPUKind, "GPU-00000003")}
	tests := []struct {
		name        string
		strategies  []string
		idStrategy  string
		env         bool
		cdi         []string
		annotations bool
	}{
		{name: "envvar only", strategies: []string{StrategyEnvvar}, env: true},
		{name: "cdi-cri only", strategies: []string{StrategyCDICRI}, cdi: byUUID},
		// An index names another GPU after a reboot that renumbers them,
		// and the kubelet restarts containers with the names it kept.
		{name: "cdi-cri by index still names GPUs by UUID", strategies: []string{StrategyCDICRI}, idStrategy: IDStrategyIndex, cdi: byUUID},
		{name: "annotations only", strategies: []string{StrategyCDIAnnotations}, annotations: true},
		{name: "all three", strategies: []string{StrategyEnvvar, StrategyCDICRI, StrategyCDIAnnotations}, env: true,
			cdi: byUUID, annotations: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(gpus, topo, Options{Strategies: tt.strategies, IDStrategy: tt.idStrategy, DevRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := r.Allocate(ids)
			if err != nil {
				t.Fatal(err)
			}
			if _, has := resp.Env[VisibleDevicesEnv]; has != tt.env || (len(resp.Nodes) > 0) != tt.env {
				t.Errorf("env %v and %d device nodes, want env and nodes: %v", resp.Env, len(resp.Nodes), tt.env)
			}
			if !slices.Equal(resp.CDIDevices, tt.cdi) {
				t.Errorf("CDI devices = %v, want %v", resp.CDIDevices, tt.cdi)
			}
			// Whatever a strategy does not set stays nil, so a front-end
			// sends nothing for it.
			if !tt.env && (resp.Env != nil || resp.Nodes != nil) {
				t.Errorf("envvar not chosen, yet env %v and nodes %v", resp.Env, resp.Nodes)
			}
			if (resp.CDIDevices == nil) != (tt.cdi == nil) {
				t.Errorf("CDI devices %#v, want nil: %t", resp.CDIDevices, tt.cdi == nil)
			}
			if tt.annotations {
				v := resp.Annotations["cdi.k8s.io/gpu-device-plugin_gpu-device-plugin.github.io_gpu"]
				if v != strings.Join(byUUID, ",") {
					t.Errorf("annotations = %v", resp.Annotations)
				}
			} else if len(resp.Annotations) != 0 {
				t.Errorf("unexpected annotations %v", resp.Annotations)
			}
		})
	}
	if _, err := New(gpus, topo, Options{Strategies: []string{"volume-mounts"}}); err == nil {
		t.Error("unknown strategy accepted")
	}
}

// nvidia-uvm is often created by the first CUDA call after boot, after
// the plugin started: the next Allocate must pass it.
func TestAllocateFindsControlNodesThatAppearLater(t *testing.T) {
	gpus, topo := eightGPUs()
	root := devRoot(t, "nvidiactl")
	r, err := New(gpus, topo, Options{DevRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.Allocate([]string{"GPU-00000000"})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(resp.Nodes); !slices.Equal(got, []string{"/dev/nvidia0", "/dev/nvidiactl"}) {
		t.Fatalf("devices %v before nvidia-uvm exists", got)
	}
	for _, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resp, err = r.Allocate([]string{"GPU-00000000"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := paths(resp.Nodes), []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}; !slices.Equal(got, want) {
		t.Fatalf("devices %v after nvidia-uvm appeared, want %v", got, want)
	}
}

type fakeSpecs struct {
	err   error
	calls int
}

func (f *fakeSpecs) Ensure() error { f.calls++; return f.err }

// A CDI name is handed out only once the spec that defines it is on disk.
func TestAllocateWaitsForCDISpec(t *testing.T) {
	gpus, topo := eightGPUs()
	notReady := fmt.Errorf("%w: spec dir read-only", device.ErrNotReady)
	tests := []struct {
		name       string
		strategies []string
		err        error
		wantCalls  int
	}{
		{"cdi-cri, spec unwritten: refused", []string{StrategyCDICRI}, notReady, 1},
		{"cdi-annotations, spec unwritten: refused", []string{StrategyCDIAnnotations}, notReady, 1},
		{"cdi-cri, spec written: served", []string{StrategyCDICRI}, nil, 1},
		{"envvar alone never asks", []string{StrategyEnvvar}, notReady, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs := &fakeSpecs{err: tt.err}
			r, err := New(gpus, topo, Options{Strategies: tt.strategies, DevRoot: devRoot(t), Specs: specs})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := r.Allocate([]string{"GPU-00000002"})
			if specs.calls != tt.wantCalls {
				t.Errorf("Ensure called %d times, want %d", specs.calls, tt.wantCalls)
			}
			if tt.err != nil && tt.wantCalls > 0 {
				if !errors.Is(err, device.ErrNotReady) || resp != nil {
					t.Fatalf("Allocate = %v, %v; want an error wrapping ErrNotReady", resp, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

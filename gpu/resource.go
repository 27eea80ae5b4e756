package gpu

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// ResourceName is the extended resource GPUs are served as.
const ResourceName = "nvidia.com/gpu"

// VisibleDevicesEnv is read by the NVIDIA container runtime and CUDA.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// ID strategies: how NVIDIA_VISIBLE_DEVICES names the allocated GPUs.
const (
	IDStrategyUUID  = "uuid"
	IDStrategyIndex = "index"
)

// Device-list strategies: how Allocate tells the runtime which GPUs to
// give the container. Several may be combined.
const (
	// StrategyEnvvar: NVIDIA_VISIBLE_DEVICES and the device nodes.
	StrategyEnvvar = "envvar"
	// StrategyCDICRI: fully qualified CDI names in the CRI field.
	StrategyCDICRI = "cdi-cri"
	// StrategyCDIAnnotations: the cdi.k8s.io annotation, for runtimes
	// that predate the CRI field.
	StrategyCDIAnnotations = "cdi-annotations"
)

// AnnotationOwner names this plugin in CDI annotation keys.
const AnnotationOwner = "gpu-device-plugin"

// CDISpecs is asked before Allocate hands out CDI names: nil when the spec
// that defines them is on disk and current, else why not (wrapping
// device.ErrNotReady). The daemon implements it.
type CDISpecs interface {
	Ensure() error
}

// Options shape allocation answers.
type Options struct {
	// IDStrategy is IDStrategyUUID (default) or IDStrategyIndex. It names
	// GPUs in NVIDIA_VISIBLE_DEVICES. CDI names are always by UUID: the
	// kubelet restarts a container with the names it checkpointed, and
	// after a reboot that renumbers GPUs an index would name another GPU.
	IDStrategy string
	// Specs, with a cdi-* strategy, gates every Allocate; nil skips it.
	Specs CDISpecs
	// Strategies lists the device-list strategies; empty means envvar.
	Strategies []string
	// DevRoot is the host's /dev as both this process and the container
	// runtime see it.
	DevRoot string
}

type gpuEntry struct {
	gpu     nvml.GPU
	visible string
	cdiName string
	node    device.Node
}

// Resource serves a fixed set of GPUs. Device IDs are GPU UUIDs: unlike
// indices they never change across reboots or driver reloads.
type Resource struct {
	gpus    []gpuEntry
	byUUID  map[string]int
	devRoot string
	specs   CDISpecs
	graph   *allocator.Graph

	envvar, cdiCRI, cdiAnnotations bool
}

// New builds the resource. topo must describe gpus in the same order.
func New(gpus []nvml.GPU, topo nvml.Topology, o Options) (*Resource, error) {
	switch o.IDStrategy {
	case "":
		o.IDStrategy = IDStrategyUUID
	case IDStrategyUUID, IDStrategyIndex:
	default:
		return nil, fmt.Errorf("device ID strategy %q: want %q or %q", o.IDStrategy, IDStrategyUUID, IDStrategyIndex)
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	r := &Resource{byUUID: make(map[string]int, len(gpus)), devRoot: o.DevRoot, specs: o.Specs}
	if len(o.Strategies) == 0 {
		o.Strategies = []string{StrategyEnvvar}
	}
	for _, st := range o.Strategies {
		switch st {
		case StrategyEnvvar:
			r.envvar = true
		case StrategyCDICRI:
			r.cdiCRI = true
		case StrategyCDIAnnotations:
			r.cdiAnnotations = true
		default:
			return nil, fmt.Errorf("device-list strategy %q: want %s, %s or %s", st, StrategyEnvvar, StrategyCDICRI, StrategyCDIAnnotations)
		}
	}
	for i, g := range gpus {
		if _, dup := r.byUUID[g.UUID]; dup {
			return nil, fmt.Errorf("GPU UUID %s appears twice", g.UUID)
		}
		visible := g.UUID
		if o.IDStrategy == IDStrategyIndex {
			visible = strconv.Itoa(g.Index)
		}
		name := "nvidia" + strconv.Itoa(g.Minor)
		r.gpus = append(r.gpus, gpuEntry{gpu: g, visible: visible, cdiName: cdi.QualifiedName(cdi.GPUKind, g.UUID), node: devNode(o.DevRoot, name)})
		r.byUUID[g.UUID] = i
	}
	r.graph = NewGraph(gpus, topo)
	return r, nil
}

// NewGraph builds the allocation graph of gpus: UUIDs as IDs, their NUMA
// nodes, and LinkWeight of each pair. topo must describe gpus in the same
// order.
func NewGraph(gpus []nvml.GPU, topo nvml.Topology) *allocator.Graph {
	ids := make([]string, len(gpus))
	numa := make([]int, len(gpus))
	for i, g := range gpus {
		ids[i], numa[i] = g.UUID, g.NUMANode
	}
	return allocator.NewGraph(ids, numa, func(i, j int) int { return LinkWeight(topo.Between(i, j)) })
}

func devNode(devRoot, name string) device.Node {
	return device.Node{ContainerPath: "/dev/" + name, HostPath: filepath.Join(devRoot, name), Permissions: "rw"}
}

// LinkWeight ranks a GPU pair's connection: any NVLink beats any PCIe
// path, more NVLinks beat fewer, and a nearer PCIe ancestor beats a
// farther one. It is 1000 per NVLink (an NVSwitch fabric counts as the
// links each GPU has into it) plus the PCIe proximity: 51 same board, 41
// one switch, 31 several switches, 21 one host bridge, 11 same NUMA node,
// 1 across CPUs, 0 unknown. The allocator sums it over the pairs of a set.
func LinkWeight(l nvml.Link) int {
	w := l.NVLinks * 1000
	if l.PCIe <= nvml.LinkCrossCPU {
		w += int(nvml.LinkCrossCPU-l.PCIe) + 1
	}
	return w
}

// Devices lists the GPUs as healthy devices, in discovery order.
func (r *Resource) Devices() []device.Device {
	out := make([]device.Device, len(r.gpus))
	for i, e := range r.gpus {
		numa := e.gpu.NUMANode
		if numa < 0 {
			numa = device.NoNUMANode
		}
		out[i] = device.Device{ID: e.gpu.UUID, NUMANode: numa, Healthy: true}
	}
	return out
}

// Allocate answers for one container. The GPUs are listed in index order
// whatever order the kubelet used, so CUDA's numbering inside the
// container follows the host's. Control nodes are looked up each time:
// nvidia-uvm often appears only at the first CUDA call after boot. The
// answer is in no kubelet API's terms; the front-end serving the resource
// translates it.
func (r *Resource) Allocate(ids []string) (*device.Answer, error) {
	sel := make([]*gpuEntry, 0, len(ids))
	seen := make([]bool, len(r.gpus))
	for _, id := range ids {
		i, ok := r.byUUID[id]
		if !ok {
			return nil, fmt.Errorf("unknown GPU %q", id)
		}
		// The server refuses repeats first; this keeps a GPU from being
		// listed twice whoever calls.
		if seen[i] {
			return nil, fmt.Errorf("GPU %q requested more than once", id)
		}
		seen[i] = true
		sel = append(sel, &r.gpus[i])
	}
	if (r.cdiCRI || r.cdiAnnotations) && r.specs != nil {
		if err := r.specs.Ensure(); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(sel, func(a, b *gpuEntry) int { return cmp.Compare(a.gpu.Index, b.gpu.Index) })
	resp := &device.Answer{}
	if r.envvar {
		visible := make([]string, len(sel))
		controls := cdi.PresentControlNodes(r.devRoot)
		resp.Nodes = make([]device.Node, 0, len(sel)+len(controls))
		for k, e := range sel {
			visible[k] = e.visible
			resp.Nodes = append(resp.Nodes, e.node)
		}
		for _, name := range controls {
			resp.Nodes = append(resp.Nodes, devNode(r.devRoot, name))
		}
		resp.Env = map[string]string{VisibleDevicesEnv: strings.Join(visible, ",")}
	}
	if r.cdiCRI || r.cdiAnnotations {
		names := make([]string, len(sel))
		for k, e := range sel {
			names[k] = e.cdiName
		}
		if r.cdiCRI {
			resp.CDIDevices = names
		}
		if r.cdiAnnotations {
			ann, err := cdi.Annotations(AnnotationOwner, cdi.GPUKind, names)
			if err != nil {
				return nil, fmt.Errorf("building CDI annotations: %w", err)
			}
			resp.Annotations = ann
		}
	}
	return resp, nil
}

// Preferred picks size GPUs from available, with mustInclude among them:
// the set allocator.Graph.Choose scores best.
func (r *Resource) Preferred(available, mustInclude []string, size int) ([]string, error) {
	return r.graph.Preferred(available, mustInclude, size)
}

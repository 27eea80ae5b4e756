package gpu

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

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
	// Placement is how preferred allocations place replicas of shared
	// units: PlacementDistributed (default) or PlacementPacked.
	Placement string
	// FailRequestsGreaterThanOne refuses a request for more than one
	// replica of a shared resource (time-slicing's).
	FailRequestsGreaterThanOne bool
	// MaxMPSShares is the most shares of a GPU shared through MPS one
	// request may hold (0: 1): its daemon holds each client to that many.
	MaxMPSShares int
	// MPSRoot holds the MPS control daemons' directories (sharing.MPSDir), for
	// units shared through MPS.
	MPSRoot string
	// IMEXChannels are the IMEX channels every allocation gets (their
	// nodes ready under DevRoot): each channel's node and
	// NVIDIA_IMEX_CHANNELS with envvar, its CDI device with a cdi-*
	// strategy, as NVIDIA's device plugin injects imex.channelIDs.
	IMEXChannels []int
}

// IMEXChannelsEnv names the IMEX channels a container may use, for the
// NVIDIA container runtime (NVIDIA's plugin sets it too).
const IMEXChannelsEnv = "NVIDIA_IMEX_CHANNELS"

// Replica placements (time-slicing's placement setting).
const (
	// PlacementDistributed spreads replicas over the least-used GPUs.
	PlacementDistributed = "distributed"
	// PlacementPacked fills the most-used GPUs first, keeping others free.
	PlacementPacked = "packed"
)

type unitEntry struct {
	unit    Unit
	uuid    string
	visible string
	cdiName string
	// nodes are the unit's device nodes: the GPU's, then a MIG device's
	// capability nodes.
	nodes []device.Node
	// ids are the device IDs the unit is served as: its UUID, or one
	// "<uuid>::<n>" per replica.
	ids []string
}

// devRef locates a device ID: its unit and replica number.
type devRef struct{ unit, replica int }

// ReplicaSep joins a unit's UUID and replica number in a device ID.
const ReplicaSep = "::"

// Resource serves a fixed set of units: whole GPUs or MIG devices, each
// possibly shared by time-slicing. Device IDs are UUIDs, with a replica
// number when shared: unlike indices they never change across reboots or
// driver reloads.
type Resource struct {
	units  []unitEntry
	byUUID map[string]int
	byID   map[string]devRef
	// offset[u] is where unit u's replicas start in a flat numbering of
	// every device, for per-request bitmaps.
	offset  []int
	devRoot string
	specs   CDISpecs
	graph   *allocator.Graph
	topo    nvml.Topology
	shared  bool
	failGT1 bool
	maxMPS  int // shares of an MPS unit one request may hold
	packed  bool
	mps     bool // some units are shared through MPS
	mpsRoot string
	imex    []int

	envvar, cdiCRI, cdiAnnotations bool
}

// New builds the resource of gpus served whole. topo must describe gpus
// in the same order.
func New(gpus []nvml.GPU, topo nvml.Topology, o Options) (*Resource, error) {
	return NewUnits(WholeGPUs(gpus), topo, o)
}

// NewUnits builds the resource of units. topo must describe the GPUs the
// units' Pos index.
func NewUnits(units []Unit, topo nvml.Topology, o Options) (*Resource, error) {
	switch o.IDStrategy {
	case "":
		o.IDStrategy = IDStrategyUUID
	case IDStrategyUUID, IDStrategyIndex:
	default:
		return nil, fmt.Errorf("device ID strategy %q: want %q or %q", o.IDStrategy, IDStrategyUUID, IDStrategyIndex)
	}
	switch o.Placement {
	case "", PlacementDistributed, PlacementPacked:
	default:
		return nil, fmt.Errorf("replica placement %q: want %q or %q", o.Placement, PlacementDistributed, PlacementPacked)
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	r := &Resource{
		byUUID: make(map[string]int, len(units)), byID: make(map[string]devRef, len(units)),
		devRoot: o.DevRoot, specs: o.Specs, topo: topo,
		failGT1: o.FailRequestsGreaterThanOne, packed: o.Placement == PlacementPacked,
		maxMPS:  max(o.MaxMPSShares, 1),
		mpsRoot: o.MPSRoot,
		imex:    slices.Clone(o.IMEXChannels),
	}
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
	for i, u := range units {
		e := unitEntry{unit: u, uuid: u.UUID()}
		if _, dup := r.byUUID[e.uuid]; dup {
			return nil, fmt.Errorf("UUID %s appears twice", e.uuid)
		}
		if u.MIG != nil && len(u.MIG.CapMinors) != 2 {
			return nil, fmt.Errorf("MIG device %s: want the GPU and compute instance capability minors, have %v", e.uuid, u.MIG.CapMinors)
		}
		e.visible = e.uuid
		if o.IDStrategy == IDStrategyIndex {
			// NVIDIA's index form: "3", or "3:1" for MIG device 1 of GPU 3.
			e.visible = strconv.Itoa(u.GPU.Index)
			if u.MIG != nil {
				e.visible += ":" + strconv.Itoa(u.MIG.Index)
			}
		}
		e.cdiName = cdi.QualifiedName(cdi.GPUKind, e.uuid)
		e.nodes = []device.Node{devNode(o.DevRoot, "nvidia"+strconv.Itoa(u.GPU.Minor))}
		if u.MIG != nil {
			for _, m := range u.MIG.CapMinors {
				e.nodes = append(e.nodes, devNode(o.DevRoot, cdi.MIGCapNode(m)))
			}
		}
		if u.MPS {
			if u.Replicas < 2 || u.MIG != nil {
				return nil, fmt.Errorf("GPU %s: MPS shares a whole GPU between 2 or more replicas, have %d replicas of %s", e.uuid, u.Replicas, u.Describe())
			}
			if o.MPSRoot == "" {
				return nil, fmt.Errorf("GPU %s is shared through MPS, but no MPS root directory is set", e.uuid)
			}
			r.mps = true
		}
		if u.Replicas > 1 {
			r.shared = true
			for n := range u.Replicas {
				e.ids = append(e.ids, e.uuid+ReplicaSep+strconv.Itoa(n))
			}
		} else {
			e.ids = []string{e.uuid}
		}
		r.offset = append(r.offset, len(r.byID))
		for n, id := range e.ids {
			r.byID[id] = devRef{unit: i, replica: n}
		}
		r.byUUID[e.uuid] = i
		r.units = append(r.units, e)
	}
	r.graph = UnitGraph(units, topo)
	return r, nil
}

// UnitGraph is the allocation graph of units by UUID: each pair weighted
// LinkWeight(UnitLink(...)).
func UnitGraph(units []Unit, topo nvml.Topology) *allocator.Graph {
	ids := make([]string, len(units))
	numa := make([]int, len(units))
	for i, u := range units {
		ids[i], numa[i] = u.UUID(), u.GPU.NUMANode
	}
	return allocator.NewGraph(ids, numa, func(i, j int) int { return unitWeight(units[i], units[j], topo) })
}

// UnitLink is how two units are connected: two of one GPU (MIG devices,
// replicas) as a same-board pair, else their GPUs' link. MIG devices
// cannot reach each other over NVLink (no peer access between MIG
// devices), so for them only the PCIe path counts.
func UnitLink(a, b Unit, topo nvml.Topology) nvml.Link {
	if a.Pos == b.Pos {
		return nvml.Link{PCIe: nvml.LinkSameBoard}
	}
	l := topo.Between(a.Pos, b.Pos)
	if a.MIG != nil || b.MIG != nil {
		l.NVLinks = 0
	}
	return l
}

func unitWeight(a, b Unit, topo nvml.Topology) int { return LinkWeight(UnitLink(a, b, topo)) }

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

// Devices lists the devices as healthy, in unit order, replicas of a
// unit together.
func (r *Resource) Devices() []device.Device {
	out := make([]device.Device, 0, len(r.byID))
	for _, e := range r.units {
		numa := e.unit.GPU.NUMANode
		if numa < 0 {
			numa = device.NoNUMANode
		}
		for _, id := range e.ids {
			out = append(out, device.Device{ID: id, NUMANode: numa, Healthy: true})
		}
	}
	return out
}

// DeviceIDs are the device IDs unit uuid is served as (one per replica);
// nil when the resource does not serve it. Health of a unit goes to each.
func (r *Resource) DeviceIDs(uuid string) []string {
	i, ok := r.byUUID[uuid]
	if !ok {
		return nil
	}
	return r.units[i].ids
}

// Units lists the units served, in order.
func (r *Resource) Units() []Unit {
	out := make([]Unit, len(r.units))
	for i, e := range r.units {
		out[i] = e.unit
	}
	return out
}

// UnitOf is the UUID of the unit device ID id belongs to, and whether it
// is one of this resource's.
func (r *Resource) UnitOf(id string) (string, bool) {
	d, ok := r.byID[id]
	if !ok {
		return "", false
	}
	i := d.unit
	return r.units[i].uuid, true
}

// Allocate answers for one container. The units are listed in GPU index
// order (then MIG device order) whatever order the kubelet used, so
// CUDA's numbering inside the container follows the host's; replicas of
// one unit name it once. Control nodes are looked up each time:
// nvidia-uvm often appears only at the first CUDA call after boot. The
// answer is in no kubelet API's terms; the front-end serving the resource
// translates it.
func (r *Resource) Allocate(ids []string) (*device.Answer, error) {
	if r.failGT1 && r.shared && len(ids) > 1 {
		return nil, fmt.Errorf("%w: %d replicas requested, but failRequestsGreaterThanOne is set: a shared GPU gives no more compute for more replicas; request 1", device.ErrBadRequest, len(ids))
	}
	sel := make([]*unitEntry, 0, len(ids))
	seenID := make(map[string]bool, len(ids))
	seenUnit := make([]bool, len(r.units))
	for _, id := range ids {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", device.ErrBadRequest, id)
		}
		i := d.unit
		// The server refuses repeats first; this keeps a device from being
		// listed twice whoever calls.
		if seenID[id] {
			return nil, fmt.Errorf("%w: device %q requested more than once", device.ErrBadRequest, id)
		}
		seenID[id] = true
		if !seenUnit[i] {
			seenUnit[i] = true
			sel = append(sel, &r.units[i])
		}
	}
	if len(sel) > 1 && slices.ContainsFunc(sel, func(e *unitEntry) bool { return e.unit.MPS }) {
		return nil, fmt.Errorf("%w: devices of %d GPUs (%s and %s) requested for one container, one of them shared through MPS: a container connects to one GPU's MPS control daemon; request shares of one GPU (the preferred allocation picks them so)", device.ErrBadRequest, len(sel), sel[0].uuid, sel[1].uuid)
	}
	if len(sel) == 1 && sel[0].unit.MPS && len(ids) > r.maxMPS {
		return nil, fmt.Errorf("%w: %d MPS shares of GPU %s requested for one container, but sharing.mps.maxSharesPerContainer is %d: its daemon holds each client to that many; request at most %d, or raise maxSharesPerContainer", device.ErrBadRequest, len(ids), sel[0].uuid, r.maxMPS, r.maxMPS)
	}
	if (r.cdiCRI || r.cdiAnnotations) && r.specs != nil {
		if err := r.specs.Ensure(); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(sel, func(a, b *unitEntry) int {
		if c := cmp.Compare(a.unit.GPU.Index, b.unit.GPU.Index); c != 0 {
			return c
		}
		return cmp.Compare(migIndex(a.unit), migIndex(b.unit))
	})
	resp := &device.Answer{}
	if r.envvar {
		visible := make([]string, len(sel))
		controls := cdi.PresentControlNodes(r.devRoot)
		resp.Nodes = make([]device.Node, 0, len(sel)+len(controls))
		seenNode := map[string]bool{}
		for k, e := range sel {
			visible[k] = e.visible
			for _, n := range e.nodes {
				// Two MIG devices of one GPU share its node.
				if !seenNode[n.ContainerPath] {
					seenNode[n.ContainerPath] = true
					resp.Nodes = append(resp.Nodes, n)
				}
			}
		}
		for _, name := range controls {
			resp.Nodes = append(resp.Nodes, devNode(r.devRoot, name))
		}
		resp.Env = map[string]string{VisibleDevicesEnv: strings.Join(visible, ",")}
		if len(r.imex) > 0 {
			ids := make([]string, len(r.imex))
			for k, id := range r.imex {
				ids[k] = strconv.Itoa(id)
				resp.Nodes = append(resp.Nodes, devNode(r.devRoot, cdi.IMEXChannelNode(id)))
			}
			resp.Env[IMEXChannelsEnv] = strings.Join(ids, ",")
		}
	}
	if r.cdiCRI || r.cdiAnnotations {
		names := make([]string, len(sel), len(sel)+len(r.imex))
		for k, e := range sel {
			names[k] = e.cdiName
		}
		for _, id := range r.imex {
			names = append(names, cdi.QualifiedName(cdi.GPUKind, cdi.IMEXChannelDevice(id)))
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
	if len(sel) == 1 && sel[0].unit.MPS {
		r.addMPS(resp, sel[0].unit, len(ids))
	}
	return resp, nil
}

func migIndex(u Unit) int {
	if u.MIG == nil {
		return -1
	}
	return u.MIG.Index
}

// Preferred picks size devices from available, with mustInclude among
// them. Unshared, it is the set allocator.Graph.Choose scores best. Shared,
// see preferReplicas.
func (r *Resource) Preferred(available, mustInclude []string, size int) ([]string, error) {
	if !r.shared {
		return r.graph.Preferred(available, mustInclude, size)
	}
	return r.preferReplicas(available, mustInclude, size)
}

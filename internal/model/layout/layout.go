// Package layout turns a node's GPU inventory and the configuration into
// what is served, once, for every caller: serve builds its device-plugin
// servers from it, list and allocate show it, reporting and metrics name
// each unit by it, and DRA takes its units.
package layout

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// Resource is one extended resource of the device-plugin API: nvidia.com/gpu,
// nvidia.com/mig-<profile> or a shared GPU's name.
type Resource struct {
	Name string
	Res  *gpu.Resource
}

// Served is how one whole GPU or MIG device is served: the resource and the
// device IDs (one per time-slicing replica) the kubelet knows it by.
type Served struct {
	Unit     gpu.Unit
	Resource string
	IDs      []string
}

// Node is what the node serves through the device-plugin API.
type Node struct {
	// Resources in name order; each unit is served by one.
	Resources []Resource
	units     []Served
	byUUID    map[string]int
}

// GPUs lays the GPUs out as the MIG strategy and time-slicing say, with the
// answers' options from cfg. specs, when not nil, is asked before a CDI
// name is handed out.
func GPUs(cfg config.Config, inv *nvml.Inventory, specs gpu.CDISpecs, log *slog.Logger) (*Node, error) {
	ts, mps := cfg.Sharing.TimeSlicing, cfg.Sharing.MPS
	var sharing gpu.Sharings
	if ts.Enabled() {
		sharing.TimeSlicing = ts
	}
	if mps.Enabled() {
		sharing.MPS = mps
	}
	resources, err := gpu.Layout(inv.GPUs, cfg.MIGStrategy, sharing, log)
	if err != nil {
		return nil, err
	}
	n := &Node{byUUID: map[string]int{}}
	for _, r := range resources {
		opts := gpu.Options{
			IDStrategy: cfg.DeviceIDStrategy, Strategies: cfg.DeviceListStrategy, DevRoot: cfg.DevRoot,
			Placement: ts.Placement, FailRequestsGreaterThanOne: ts.FailRequestsGreaterThanOne,
			Specs: specs,
		}
		if slices.ContainsFunc(r.Units, func(u gpu.Unit) bool { return u.MPS }) {
			// Validation keeps a resource to one way of sharing. Placement
			// and failRequestsGreaterThanOne are time-slicing's: MPS shares
			// go to the GPU with the most free, and maxSharesPerContainer
			// bounds a container's.
			opts.FailRequestsGreaterThanOne, opts.MaxMPSShares = false, mps.SharesPerContainer()
			opts.MPSRoot, opts.Placement = cfg.MPSRoot, ""
		}
		res, err := gpu.NewUnits(r.Units, inv.Topology, opts)
		if err != nil {
			return nil, fmt.Errorf("building %s resource: %w", r.Name, err)
		}
		n.Resources = append(n.Resources, Resource{Name: r.Name, Res: res})
		for _, u := range r.Units {
			n.byUUID[u.UUID()] = len(n.units)
			n.units = append(n.units, Served{Unit: u, Resource: r.Name, IDs: res.DeviceIDs(u.UUID())})
		}
	}
	return n, nil
}

// Units are every unit served, by resource, in the resource's order.
func (n *Node) Units() []Served { return n.units }

// Of is how the unit with uuid (a GPU's or a MIG device's) is served; false
// when it is not (a MIG GPU served as its MIG devices, say).
func (n *Node) Of(uuid string) (Served, bool) {
	i, ok := n.byUUID[uuid]
	if !ok {
		return Served{}, false
	}
	return n.units[i], true
}

// DRAUnits are the units DRA publishes: the MIG devices of a MIG-enabled
// GPU, else the GPU. DRA has no MIG strategy: a claim selects by profile.
func DRAUnits(gpus []nvml.GPU) []gpu.Unit {
	var out []gpu.Unit
	for i, g := range gpus {
		if !g.MIGEnabled {
			out = append(out, gpu.Unit{GPU: g, Pos: i})
			continue
		}
		for j := range g.MIG {
			out = append(out, gpu.Unit{GPU: g, Pos: i, MIG: &g.MIG[j]})
		}
	}
	return out
}

// Select takes the GPUs that excludeGPUs and includeGPUs leave out of inv
// (they get no resource, CDI device, label or health check) and returns
// them, for list to show, with the entries that name no GPU, each warned
// about: includeGPUs: [H100] would otherwise serve nothing in silence.
func Select(cfg config.Config, inv *nvml.Inventory, log *slog.Logger) ([]nvml.GPU, []config.UnmatchedGPU) {
	names := make([]config.GPUName, len(inv.GPUs))
	for i, g := range inv.GPUs {
		names[i] = config.GPUName{Index: g.Index, UUID: g.UUID, PCIBusID: g.PCIBusID, Model: g.Name}
	}
	unmatched := cfg.UnmatchedGPUs(names)
	for _, u := range unmatched {
		log.Warn(u.String(), "setting", u.Key, "entry", u.Entry)
	}
	left := inv.Select(func(g nvml.GPU) bool { return cfg.GPUSelected(g.Index, g.UUID, g.PCIBusID, g.Name) })
	for _, g := range left {
		log.Info("GPU excluded (excludeGPUs, includeGPUs)", "index", g.Index, "uuid", g.UUID, "name", g.Name, "device", g.PCIBusID)
	}
	return left, unmatched
}

// Package layout turns a node's GPU inventory and its options into
// what is served, once, for every caller: serve builds its device-plugin
// servers from it, list and allocate show it, reporting and metrics name
// each unit by it, and DRA takes its units.
package layout

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
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

// Options are the settings the layout depends on; the daemon builds them
// once from the configuration (daemon.LayoutOptions).
type Options struct {
	// MIGStrategy is one of gpu's MIG* strategies.
	MIGStrategy string
	// IDStrategy, Strategies and DevRoot shape the Allocate answers, as
	// gpu.Options says.
	IDStrategy string
	Strategies []string
	DevRoot    string
	// MPSRoot holds the MPS control daemons' directories.
	MPSRoot string
	// IMEXChannels are the IMEX channels every allocation gets, their
	// nodes ready (gpu.Options.IMEXChannels).
	IMEXChannels []int
	// TimeSlicing and MPS are the two ways of sharing (replicas).
	TimeSlicing sharing.TimeSlicing
	MPS         sharing.MPS
}

// GPUs lays the GPUs out as the MIG strategy and sharing say, with the
// answers' options from o. specs, when not nil, is asked before a CDI
// name is handed out.
func GPUs(o Options, inv *nvml.Inventory, specs gpu.CDISpecs, log *slog.Logger) (*Node, error) {
	ts, mps := o.TimeSlicing, o.MPS
	var sharings gpu.Sharings
	if ts.Enabled() {
		sharings.TimeSlicing = ts
	}
	if mps.Enabled() {
		sharings.MPS = mps
	}
	resources, err := gpu.Layout(inv.GPUs, o.MIGStrategy, sharings, log)
	if err != nil {
		return nil, err
	}
	n := &Node{byUUID: map[string]int{}}
	for _, r := range resources {
		opts := gpu.Options{
			IDStrategy: o.IDStrategy, Strategies: o.Strategies, DevRoot: o.DevRoot,
			Placement: ts.Placement, FailRequestsGreaterThanOne: ts.FailRequestsGreaterThanOne,
			Specs: specs, IMEXChannels: o.IMEXChannels,
		}
		if slices.ContainsFunc(r.Units, func(u gpu.Unit) bool { return u.MPS }) {
			// Validation keeps a resource to one way of sharing. Placement
			// and failRequestsGreaterThanOne are time-slicing's: MPS shares
			// go to the GPU with the most free, and maxSharesPerContainer
			// bounds a container's.
			opts.FailRequestsGreaterThanOne, opts.MaxMPSShares = false, mps.SharesPerContainer()
			opts.MPSRoot, opts.Placement = o.MPSRoot, ""
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

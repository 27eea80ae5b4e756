package gpu

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// MIG strategies: how MIG devices are served through the device-plugin
// API. The names and meanings are NVIDIA's device plugin's.
const (
	// MIGNone serves whole GPUs only; a MIG-enabled GPU stays Unhealthy.
	MIGNone = "none"
	// MIGSingle serves MIG devices of one profile as nvidia.com/gpu.
	MIGSingle = "single"
	// MIGMixed serves MIG devices as nvidia.com/mig-<profile>, and GPUs
	// with MIG off as nvidia.com/gpu.
	MIGMixed = "mixed"
)

// Unit is one device a container is given: a whole GPU or a MIG device.
type Unit struct {
	// GPU is the physical GPU (a MIG device's parent); Pos its position
	// in the inventory, which the topology is indexed by.
	GPU nvml.GPU
	Pos int
	// MIG is the MIG device; nil for a whole GPU.
	MIG *nvml.MIGDevice
	// Replicas is how many containers may share the unit, by
	// time-slicing or, with MPS, as shares of an MPS control daemon; 0 or
	// 1 is not shared.
	Replicas int
	// MPS says the replicas are MPS shares (whole GPUs only).
	MPS bool
}

// UUID is the unit's NVML UUID: GPU-… or MIG-….
func (u Unit) UUID() string {
	if u.MIG != nil {
		return u.MIG.UUID
	}
	return u.GPU.UUID
}

// Model is what sharing entries match besides UUIDs: the GPU's product
// name.
func (u Unit) Model() string { return u.GPU.Name }

// Describe names the unit for people: "GPU 3" or "GPU 1 MIG 2g.20gb (gi 3, ci 0)".
func (u Unit) Describe() string {
	s := "GPU " + strconv.Itoa(u.GPU.Index)
	if u.MIG != nil {
		s += fmt.Sprintf(" MIG %s (gi %d, ci %d)", u.MIG.Profile, u.MIG.GPUInstance, u.MIG.ComputeInstance)
	}
	return s
}

// Sharing decides one way of sharing: how many replicas a unit of
// resource gets and the resource name they are served under.
// sharing.Rules (time-slicing's or MPS's) is one.
type Sharing interface {
	Replicas(resource, uuid, model string) (replicas int, name string)
}

// Sharings are both ways of sharing; nil fields share nothing. A GPU
// both would share is shared through MPS (validation refuses the
// overlaps it can see).
type Sharings struct {
	TimeSlicing, MPS Sharing
}

// ResourceUnits is one resource to serve and its units, in inventory
// order: what Layout computes per resource name.
type ResourceUnits struct {
	Name  string
	Units []Unit
}

// Layout decides what the device-plugin API serves from gpus under the
// MIG strategy, then applies sharing: MPS to whole GPUs, time-slicing to
// the other units. A layout that does not
// fit the strategy is logged with the reason and served as far as it
// safely can: under single, only MIG devices of the most common profile,
// since one resource name must mean one size of device. The result is
// sorted by resource name.
func Layout(gpus []nvml.GPU, strategy string, sharing Sharings, log *slog.Logger) ([]ResourceUnits, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var units []Unit
	var names []string
	add := func(u Unit, name string) { units, names = append(units, u), append(names, name) }
	switch strategy {
	case "", MIGNone:
		for i, g := range gpus {
			switch {
			case g.MIGEnabled && len(g.MIG) == 0:
				log.Warn("MIG is enabled on this GPU but it has no MIG devices, and migStrategy is none: it is served whole and Unhealthy; disable MIG, or create GPU and compute instances (e.g. nvidia-smi mig -cgi 1g.10gb -C) and set migStrategy single or mixed",
					"device", g.UUID, "index", g.Index, "migDevices", 0)
			case g.MIGEnabled:
				log.Warn("MIG is enabled on this GPU but migStrategy is none: it is served whole and Unhealthy; set migStrategy single or mixed to serve its MIG devices, or disable MIG",
					"device", g.UUID, "index", g.Index, "migDevices", len(g.MIG))
			}
			add(Unit{GPU: g, Pos: i}, resname.GPU)
		}
	case MIGSingle:
		profile := commonProfile(gpus)
		for i, g := range gpus {
			if !g.MIGEnabled {
				log.Warn("migStrategy single: this GPU has MIG disabled and is not served (single serves only MIG devices as nvidia.com/gpu; use mixed to serve both)",
					"device", g.UUID, "index", g.Index)
				continue
			}
			noteEmpty(g, log)
			for j := range g.MIG {
				m := &g.MIG[j]
				if m.Profile != profile {
					log.Warn("migStrategy single: MIG device not served, its profile differs from the node's most common one (one resource name must mean one size; use mixed)",
						"device", m.UUID, "parent", g.UUID, "profile", m.Profile, "served", profile)
					continue
				}
				add(Unit{GPU: g, Pos: i, MIG: m}, resname.GPU)
			}
		}
	case MIGMixed:
		for i, g := range gpus {
			if !g.MIGEnabled {
				add(Unit{GPU: g, Pos: i}, resname.GPU)
				continue
			}
			noteEmpty(g, log)
			for j := range g.MIG {
				add(Unit{GPU: g, Pos: i, MIG: &g.MIG[j]}, resname.MIG(g.MIG[j].Profile))
			}
		}
	default:
		return nil, fmt.Errorf("MIG strategy %q: want %s, %s or %s", strategy, MIGNone, MIGSingle, MIGMixed)
	}
	byName := map[string]int{}
	var out []ResourceUnits
	for k, u := range units {
		name := names[k]
		if sharing.MPS != nil && u.MIG == nil {
			// The plugin runs MPS on whole GPUs only, not on the MIG
			// devices single serves as nvidia.com/gpu too.
			if n, rename := sharing.MPS.Replicas(name, u.UUID(), u.Model()); n > 1 {
				u.Replicas, u.MPS, name = n, true, rename
			}
		}
		if sharing.TimeSlicing != nil && !u.MPS {
			if n, rename := sharing.TimeSlicing.Replicas(name, u.UUID(), u.Model()); n > 1 {
				u.Replicas, name = n, rename
			}
		}
		i, ok := byName[name]
		if !ok {
			i = len(out)
			byName[name] = i
			out = append(out, ResourceUnits{Name: name})
		}
		out[i].Units = append(out[i].Units, u)
	}
	slices.SortFunc(out, func(a, b ResourceUnits) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func noteEmpty(g nvml.GPU, log *slog.Logger) {
	if len(g.MIG) == 0 {
		log.Warn("MIG is enabled on this GPU but it has no MIG devices: nothing of it is served (create GPU and compute instances, e.g. nvidia-smi mig -cgi 1g.10gb -C, then restart the plugin)",
			"device", g.UUID, "index", g.Index)
	}
}

// commonProfile is the profile most MIG devices have; of equally common
// ones, the first in name order, so the choice does not depend on
// discovery order.
func commonProfile(gpus []nvml.GPU) string {
	count := map[string]int{}
	for _, g := range gpus {
		for _, m := range g.MIG {
			count[m.Profile]++
		}
	}
	best := ""
	for p, n := range count {
		if n > count[best] || (n == count[best] && p < best) {
			best = p
		}
	}
	return best
}

// WholeGPUs is the units of gpus served whole, unshared.
func WholeGPUs(gpus []nvml.GPU) []Unit {
	out := make([]Unit, len(gpus))
	for i, g := range gpus {
		out[i] = Unit{GPU: g, Pos: i}
	}
	return out
}

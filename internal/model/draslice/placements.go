package draslice

import (
	"log/slog"
	"maps"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// Partitions reads, through layout, what each GPU in MIG mode that
// partitioned selects (sharing.migPartitions; nil selects none) allows. A
// GPU whose layout cannot be read is logged and left out: it is published
// as without the setting.
func Partitions(gpus []nvml.GPU, partitioned func(nvml.GPU) bool, layout func(nvml.GPU) (nvml.MIGLayout, error), log *slog.Logger) map[string]Partition {
	out := map[string]Partition{}
	for _, g := range gpus {
		if !g.MIGEnabled || partitioned == nil || !partitioned(g) {
			continue
		}
		l, err := layout(g)
		if err != nil {
			log.Error("MIG: reading the placements of a partitioned GPU; it is not partitioned", "device", g.UUID, "index", g.Index, "err", err)
			continue
		}
		log.Info("MIG: GPU partitioned on demand", "device", g.UUID, "index", g.Index, "placements", len(l.Placements), "instances", len(l.Instances))
		out[g.UUID] = Partition{Layout: l}
	}
	return out
}

// CounterSet is a named set of counters that devices consume
// (partitionable devices): a partitioned GPU's memory and compute slices.
type CounterSet struct {
	Name     string           `json:"name"`
	Counters map[string]int64 `json:"counters"`
}

// CounterConsumption is what a device takes of one counter set.
type CounterConsumption struct {
	CounterSet string           `json:"counterSet"`
	Counters   map[string]int64 `json:"counters"`
}

// Counter names. A placement takes each memory slice it covers, so two
// placements over one slice exclude each other, and its compute slices,
// which the GPU has fewer of than memory slices (7 and 8). A profile the
// GPU holds fewer instances of than it has placements for (one
// 1g.10gb+me: the GPU has one set of media engines) has a counter of its
// own, "instances-<profile>", each placement taking one.
const (
	counterComputeSlices = "compute-slices"
	counterMemorySlice   = "memory-slice-"
	counterInstances     = "instances-"
)

// instanceLimit is a profile's instance counter and its value.
type instanceLimit struct {
	name  string
	limit int
}

// instanceLimits are the profiles of l whose instances are counted.
func instanceLimits(l nvml.MIGLayout) map[string]instanceLimit {
	places := map[string]int{}
	limit := map[string]int{}
	for _, p := range l.Placements {
		places[p.Profile]++
		limit[p.Profile] = p.Instances
	}
	out := map[string]instanceLimit{}
	for profile, n := range places {
		if lim := limit[profile]; lim > 0 && lim < n {
			out[profile] = instanceLimit{counterInstances + profileLabel(profile), lim}
		}
	}
	return out
}

// CounterSetName is the counter set of the GPU with index index.
func CounterSetName(index int) string { return "gpu-" + strconv.Itoa(index) + "-slices" }

// CounterSets are the counter sets of the partitioned GPUs, in GPU order.
func CounterSets(in GPUs) []CounterSet {
	var out []CounterSet
	for _, g := range in.GPUs {
		part, ok := in.Partitions[g.UUID]
		if !ok || !g.MIGEnabled {
			continue
		}
		c := map[string]int64{counterComputeSlices: int64(part.Layout.ComputeSlices)}
		for k := range part.Layout.MemorySlices {
			c[counterMemorySlice+strconv.Itoa(k)] = 1
		}
		for _, l := range instanceLimits(part.Layout) {
			c[l.name] = int64(l.limit)
		}
		out = append(out, CounterSet{Name: CounterSetName(g.Index), Counters: c})
	}
	return out
}

// PlacementDeviceName names a placement: its GPU's index, profile and
// first memory slice ("gpu-2-3g-40gb-4", "gpu-0-1g-10gb-me-6").
func PlacementDeviceName(g nvml.GPU, p nvml.MIGPlacement) string {
	return "gpu-" + strconv.Itoa(g.Index) + "-" + profileLabel(p.Profile) + "-" + strconv.Itoa(p.Start)
}

// profileLabel writes a profile name as part of a DNS label: "3g.40gb" is
// "3g-40gb"; the suffixes keep their meaning apart ("+me" is "-me", "-me"
// is "-no-me").
func profileLabel(profile string) string {
	base, suffix := profile, ""
	if i := strings.IndexAny(profile, "+-"); i >= 0 {
		base, suffix = profile[:i], profile[i:]
	}
	switch suffix {
	case "":
	case "-me":
		suffix = "-no-me"
	default:
		suffix = "-" + strings.NewReplacer("+", "", ".", "-").Replace(suffix)
	}
	return strings.ToLower(strings.ReplaceAll(base, ".", "-") + suffix)
}

// placementDevices are a partitioned GPU's placements, each consuming its
// slices of the GPU's counter set, but those over a foreign instance's
// slices. The GPU itself is not published: in MIG mode CUDA sees no
// device on it, and its full-size profile (7g) is the whole GPU.
func placementDevices(g nvml.GPU, part Partition, common map[string]Attribute, cdiID func(uuid string) string) []Device {
	out := make([]Device, 0, len(part.Layout.Placements))
	limits := instanceLimits(part.Layout)
	for _, p := range part.Layout.Placements {
		if overlapsAny(p, part.Foreign) {
			continue
		}
		attrs := map[string]Attribute{
			"type":           str(TypeMIG),
			"profile":        str(p.Profile),
			"parentUUID":     str(g.UUID),
			"parentIndex":    integer(g.Index),
			"placementStart": integer(p.Start),
			"placementSize":  integer(p.Size),
		}
		maps.Copy(attrs, common)
		counters := map[string]int64{counterComputeSlices: int64(p.ComputeSlices)}
		for k := p.Start; k < p.Start+p.Size; k++ {
			counters[counterMemorySlice+strconv.Itoa(k)] = 1
		}
		if l, ok := limits[p.Profile]; ok {
			counters[l.name] = 1
		}
		out = append(out, Device{
			Name: PlacementDeviceName(g, p), Attributes: attrs, ID: g.UUID, Type: TypeMIG, CDIIDs: []string{cdiID(g.UUID)},
			Capacity:         migCapacity(p.MemoryBytes, p.Multiprocessors),
			ConsumesCounters: []CounterConsumption{{CounterSet: CounterSetName(g.Index), Counters: counters}},
			Placement:        &p,
		})
	}
	return out
}

func overlapsAny(p nvml.MIGPlacement, gis []nvml.GPUInstance) bool {
	for _, gi := range gis {
		if p.Overlaps(gi.Start, gi.Size) {
			return true
		}
	}
	return false
}

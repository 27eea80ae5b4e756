package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/imexchan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// allocateCommand is `allocate`: the devices the plugin would prefer for a
// request on this node, and why.
func allocateCommand(open daemon.OpenFunc, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "allocate",
		Usage: "show which devices GetPreferredAllocation would choose on this node, and why",
		UsageText: "gpu-device-plugin allocate --size N [--resource NAME] [--available ID,...] [--must-include ID,...] [-o table|json]\n\n" +
			"IDs are device IDs as list shows them (UUIDs, or <uuid>::<n> for a time-slicing replica), GPU indices, or\n" +
			"<gpu>:<mig> MIG indices. In --available a shared GPU's UUID or index offers all its replicas.",
		Flags: append(settingFlags(allocateKeys...),
			&cli.IntFlag{Name: "size", Aliases: []string{"n"}, Usage: "how many devices the container asks for (required)"},
			&cli.StringFlag{Name: "resource", Value: resname.GPU, Usage: "the resource asked for, as list shows it (nvidia.com/mig-<profile>, a shared resource's name)"},
			&cli.StringSliceFlag{Name: "available", Usage: "the devices the kubelet offers, comma-separated IDs (default: every device of the resource)"},
			&cli.StringSliceFlag{Name: "must-include", Usage: "devices the answer must contain, comma-separated IDs"},
			outputFlag(),
		),
		Action: noArgs(func(c *cli.Context) error { return allocate(c, open, stdout, stderr) }),
	}
}

// allocation is what `allocate` prints. Resource, Placement and Picks
// are set for a shared or MIG resource only, so the answer for whole
// GPUs reads as it always has. Available counts device IDs.
type allocation struct {
	Size      int             `json:"size"`
	Available int             `json:"available"`
	Exact     bool            `json:"exact"`
	GPUs      []allocatedGPU  `json:"gpus"`
	Score     allocator.Score `json:"score"`
	Pairs     []allocatedPair `json:"pairs"`
	Resource  string          `json:"resource,omitempty"`
	// Placement is the time-slicing placement, for a shared resource.
	Placement string          `json:"placement,omitempty"`
	Picks     []allocatedPick `json:"picks,omitempty"`
	// IMEXChannels are imex.channelIDs' channels, which every allocation
	// of a GPU resource gets once serve has readied them; absent when
	// none is set.
	IMEXChannels []allocatedIMEX `json:"imexChannels,omitempty"`
}

// allocatedIMEX is one IMEX channel of imex.channelIDs: its node as the
// container sees it, whether serve gives it, and why not.
type allocatedIMEX struct {
	ID   int    `json:"id"`
	Path string `json:"path"`
	// Given: serve gives it with every allocation (its node is made at
	// start when missing).
	Given bool `json:"given"`
	// Present: the node is already under devRoot.
	Present bool `json:"present"`
	// Reason is why it is not given; with imex.required serve stops.
	Reason string `json:"reason,omitempty"`
}

// allocatedPick is one device ID the preferred allocation chose, its
// unit ("3" for GPU 3, "3:1" for MIG device 1 of GPU 3) and why.
type allocatedPick struct {
	ID   string `json:"id"`
	Unit string `json:"unit"`
	Why  string `json:"why"`
}

// allocatedGPU is one chosen unit: a GPU, or (UUID MIG-…) a MIG device of
// GPU Index.
type allocatedGPU struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid"`
	NUMANode int    `json:"numaNode"`
}

// allocatedPair is one pair of the chosen set, by GPU index, and what its
// link adds to Score.Link.
type allocatedPair struct {
	A       int    `json:"a"`
	B       int    `json:"b"`
	NVLinks int    `json:"nvlinks"`
	PCIe    string `json:"pcie"`
	Weight  int    `json:"weight"`
}

// checkSize refuses an allocate without --size.
func checkSize(c *cli.Context) error {
	if !c.IsSet("size") {
		return fmt.Errorf("--size is required: how many GPUs to choose")
	}
	return nil
}

func allocate(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	cfg, log, err := setUp(c, stderr, checkOutput, checkSize)
	if err != nil {
		return err
	}
	output, _ := outputFormat(c)
	node, err := daemon.Snapshot(c.Context, cfg, open, log, daemon.SnapshotOptions{Layout: true})
	if err != nil {
		return err
	}
	topo := node.Inventory.Topology
	name := c.String("resource")
	var res *gpu.Resource
	names := make([]string, 0, len(node.Layout.Resources))
	for _, r := range node.Layout.Resources {
		names = append(names, r.Name)
		if r.Name == name && res == nil {
			res = r.Res
		}
	}
	if res == nil {
		have := strings.Join(names, ", ")
		if have == "" {
			have = "none"
		}
		return fmt.Errorf("--resource: %q is not served on this node with migStrategy %s and this sharing configuration; served: %s", name, cfg.MIGStrategy, have)
	}
	units := res.Units()

	available, err := deviceIDs(res, name, "available", c.StringSlice("available"), true)
	if err != nil {
		return err
	}
	if !c.IsSet("available") {
		for _, d := range res.Devices() {
			available = append(available, d.ID)
		}
	}
	must, err := deviceIDs(res, name, "must-include", c.StringSlice("must-include"), false)
	if err != nil {
		return err
	}
	size := c.Int("size")
	shared := slices.ContainsFunc(units, func(u gpu.Unit) bool { return u.Replicas > 1 })
	mig := slices.ContainsFunc(units, func(u gpu.Unit) bool { return u.MIG != nil })
	g := gpu.UnitGraph(units, topo)

	var out allocation
	if shared || mig {
		out, err = explain(res, g, units, topo, available, must, size)
		if err != nil {
			return fmt.Errorf("choosing %d of %d devices of %s: %w", size, len(available), name, err)
		}
		out.Resource = name
		placement := cmp.Or(cfg.Sharing.TimeSlicing.Placement, gpu.PlacementDistributed)
		switch {
		case res.MPS():
			// MPS has no placement setting: a container's shares are of one
			// GPU, the one with the most free.
			placement = gpu.PlacementDistributed
			if most := daemon.MPS(cfg).SharesPerContainer(); size > most {
				log.Warn("more MPS shares than sharing.mps.maxSharesPerContainer: the kubelet's Allocate of them would be refused", "size", size, "maxSharesPerContainer", most, "resource", name)
			}
		case shared && cfg.Sharing.TimeSlicing.FailRequestsGreaterThanOne && size > 1:
			log.Warn("failRequestsGreaterThanOne is set: the kubelet's Allocate of this many replicas would be refused", "size", size, "resource", name)
		}
		if shared {
			out.Placement = placement
		}
	} else {
		choice, err := g.Choose(available, must, size)
		if err != nil {
			return fmt.Errorf("choosing %d of %d GPUs: %w", size, len(available), err)
		}
		out = allocation{Size: size, Available: len(available), Exact: choice.Exact, Score: choice.Score}
		out.GPUs, out.Pairs = chosenUnits(units, topo, choice.IDs)
	}
	for _, ch := range imexchan.Preview(daemon.IMEXChannels(cfg)) {
		out.IMEXChannels = append(out.IMEXChannels, allocatedIMEX{ID: ch.ID, Path: ch.Path, Given: ch.Given, Present: ch.Present, Reason: ch.Reason})
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	write := writeAllocation
	if out.Picks != nil {
		write = writePicks
	}
	if err := write(stdout, out); err != nil {
		return err
	}
	return writeIMEX(stdout, out.IMEXChannels, cfg.IMEX.Required)
}

// writeIMEX prints one line per IMEX channel of imex.channelIDs: what
// every allocation also gets, or why it gets none and what serve does
// about it.
func writeIMEX(w io.Writer, channels []allocatedIMEX, required bool) error {
	if len(channels) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	for _, ch := range channels {
		var err error
		switch {
		case ch.Given && ch.Present:
			_, err = fmt.Fprintf(w, "IMEX channel %d: %s with every allocation\n", ch.ID, ch.Path)
		case ch.Given:
			_, err = fmt.Fprintf(w, "IMEX channel %d: %s with every allocation (serve makes the node at start)\n", ch.ID, ch.Path)
		case required:
			_, err = fmt.Fprintf(w, "IMEX channel %d: none: %s; imex.required is true, so serve stops at start\n", ch.ID, ch.Reason)
		default:
			_, err = fmt.Fprintf(w, "IMEX channel %d: none: %s; serve warns and gives none (imex.required is false)\n", ch.ID, ch.Reason)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// chosenUnits describes the units with UUIDs ids and each pair of them.
func chosenUnits(units []gpu.Unit, topo nvml.Topology, ids []string) ([]allocatedGPU, []allocatedPair) {
	gpus := make([]allocatedGPU, 0, len(ids))
	pairs := []allocatedPair{}
	chosen := make([]gpu.Unit, 0, len(ids))
	for _, id := range ids {
		i := slices.IndexFunc(units, func(u gpu.Unit) bool { return u.UUID() == id })
		u := units[i]
		chosen = append(chosen, u)
		gpus = append(gpus, allocatedGPU{Index: u.GPU.Index, UUID: id, NUMANode: u.GPU.NUMANode})
	}
	for k, a := range chosen {
		for _, b := range chosen[k+1:] {
			l := gpu.UnitLink(a, b, topo)
			pairs = append(pairs, allocatedPair{A: a.GPU.Index, B: b.GPU.Index,
				NVLinks: l.NVLinks, PCIe: pcieName(l.PCIe), Weight: gpu.LinkWeight(l)})
		}
	}
	return gpus, pairs
}

// explain answers for a shared or MIG resource: the picks of
// Resource.ExplainPreferred, which is what GetPreferredAllocation
// answers, and the units they fall on, scored as a set of units. Exact is
// true only for an unshared resource whose set the exact search chose:
// replicas are placed greedily.
func explain(res *gpu.Resource, g *allocator.Graph, units []gpu.Unit, topo nvml.Topology, available, must []string, size int) (allocation, error) {
	picks, err := res.ExplainPreferred(available, must, size)
	if err != nil {
		return allocation{}, err
	}
	byUUID := make(map[string]gpu.Unit, len(units))
	for _, u := range units {
		byUUID[u.UUID()] = u
	}
	out := allocation{Size: size, Available: len(available), Picks: make([]allocatedPick, len(picks))}
	var chosen []string
	for i, p := range picks {
		out.Picks[i] = allocatedPick{ID: p.ID, Unit: unitLabel(byUUID[p.Unit]), Why: p.Why}
		if !slices.Contains(chosen, p.Unit) {
			chosen = append(chosen, p.Unit)
		}
	}
	// The units offered: those of the available and chosen device IDs.
	offered := slices.Clone(chosen)
	for _, id := range available {
		if uuid, ok := res.UnitOf(id); ok && !slices.Contains(offered, uuid) {
			offered = append(offered, uuid)
		}
	}
	out.Score, err = g.Score(offered, chosen)
	if err != nil {
		return allocation{}, fmt.Errorf("scoring the chosen units: %w", err)
	}
	if !slices.ContainsFunc(units, func(u gpu.Unit) bool { return u.Replicas > 1 }) {
		choice, err := g.Choose(available, must, size)
		out.Exact = err == nil && choice.Exact && sameSet(choice.IDs, chosen)
	}
	out.GPUs, out.Pairs = chosenUnits(units, topo, chosen)
	return out, nil
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(s string) bool { return !slices.Contains(b, s) })
}

// unitLabel names a unit as list's INDEX column does: "3", or "3:1" for
// MIG device 1 of GPU 3.
func unitLabel(u gpu.Unit) string {
	s := strconv.Itoa(u.GPU.Index)
	if u.MIG != nil {
		s += ":" + strconv.Itoa(u.MIG.Index)
	}
	return s
}

// deviceIDs turns --flag values into device IDs of res (named resource).
// A value is a device ID, or names a unit by UUID, GPU index ("3", a
// whole GPU) or MIG index ("3:1"); a unit named stands for its device ID,
// or with expand (the devices offered) for every replica of it. Naming a
// shared unit without expand is ambiguous and refused.
func deviceIDs(res *gpu.Resource, resource, flag string, values []string, expand bool) ([]string, error) {
	units := res.Units()
	var out []string
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if _, ok := res.UnitOf(v); ok {
			out = append(out, v)
			continue
		}
		k := slices.IndexFunc(units, func(u gpu.Unit) bool { return u.UUID() == v || unitLabel(u) == v })
		if k < 0 {
			return nil, fmt.Errorf("--%s: %q is neither the UUID nor the index of a device of %s on this node, nor one of its device IDs (list shows them)", flag, v, resource)
		}
		ids := res.DeviceIDs(units[k].UUID())
		if len(ids) > 1 && !expand {
			return nil, fmt.Errorf("--%s: %q is %s, shared as %d replicas: name one of them, %s to %s", flag, v, units[k].Describe(), len(ids), ids[0], ids[len(ids)-1])
		}
		out = append(out, ids...)
	}
	return out, nil
}

func pcieName(l nvml.LinkLevel) string {
	switch l {
	case nvml.LinkSameBoard:
		return "same-board"
	case nvml.LinkSingleSwitch:
		return "single-switch"
	case nvml.LinkMultiSwitch:
		return "multiple-switches"
	case nvml.LinkHostBridge:
		return "host-bridge"
	case nvml.LinkSameNUMA:
		return "same-numa-node"
	case nvml.LinkCrossCPU:
		return "cross-cpu"
	}
	return "unknown"
}

func writeAllocation(w io.Writer, a allocation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tUUID\tNUMA")
	for _, g := range a.GPUs {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = strconv.Itoa(g.NUMANode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", g.Index, g.UUID, numa)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	how := "exact (no other set scores higher)"
	if !a.Exact {
		how = "heuristic (bounded search; never below NUMA grouping)"
	}
	s := a.Score
	fmt.Fprintf(w, "\n%d of %d available GPUs, %s\n", a.Size, a.Available, how)
	fmt.Fprintf(w, "score, compared in this order:\n")
	fmt.Fprintf(w, "  link       %d  (sum of pair weights: 1000 per NVLink + PCIe proximity 0-51)\n", s.Link)
	fmt.Fprintf(w, "  NUMA nodes %d  (fewer is better)\n", s.NUMANodes)
	fmt.Fprintf(w, "  same-node  %d pairs\n", s.SameNUMAPairs)
	fmt.Fprintf(w, "  remaining  %d  (link sum left among the other available GPUs)\n", s.Remaining)
	if len(a.Pairs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PAIR\tNVLINKS\tPCIE\tWEIGHT")
	for _, p := range a.Pairs {
		fmt.Fprintf(tw, "%d-%d\t%d\t%s\t%d\n", p.A, p.B, p.NVLinks, p.PCIe, p.Weight)
	}
	return tw.Flush()
}

// writePicks prints the picks of a shared or MIG resource, then what the
// placement does and the score of the units they fall on.
func writePicks(w io.Writer, a allocation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE ID\tUNIT\tWHY")
	for _, p := range a.Picks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.ID, p.Unit, p.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d of %d available devices of %s\n", a.Size, a.Available, a.Resource)
	switch a.Placement {
	case gpu.PlacementPacked:
		fmt.Fprintln(w, "placement packed: replicas fill the most used GPUs first, keeping others free")
	case gpu.PlacementDistributed:
		fmt.Fprintln(w, "placement distributed: replicas spread over the least used GPUs, one per GPU while there are more")
	default:
		how := "exact (no other set scores higher)"
		if !a.Exact {
			how = "heuristic (bounded search; never below NUMA grouping)"
		}
		fmt.Fprintf(w, "not shared: the best-linked set of MIG devices, %s\n", how)
	}
	s := a.Score
	fmt.Fprintf(w, "units chosen: %d; link %d, NUMA nodes %d, same-node pairs %d, remaining %d\n",
		len(a.GPUs), s.Link, s.NUMANodes, s.SameNUMAPairs, s.Remaining)
	return nil
}

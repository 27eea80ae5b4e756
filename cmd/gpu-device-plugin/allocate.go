package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// allocateCommand is `allocate`: the GPUs the plugin would prefer for a
// request on this node, and why.
func allocateCommand(open daemon.OpenFunc, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "allocate",
		Usage:     "show which GPUs GetPreferredAllocation would choose on this node, with the score",
		UsageText: "gpu-device-plugin allocate --size N [--available ID,...] [--must-include ID,...] [-o table|json]\n\nIDs are GPU UUIDs or indices, as list shows them.",
		Flags: append(settingFlags(),
			&cli.IntFlag{Name: "size", Aliases: []string{"n"}, Usage: "how many GPUs the container asks for (required)"},
			&cli.StringSliceFlag{Name: "available", Usage: "the GPUs the kubelet offers, comma-separated UUIDs or indices (default: every GPU found)"},
			&cli.StringSliceFlag{Name: "must-include", Usage: "GPUs the answer must contain, comma-separated UUIDs or indices"},
			&cli.StringFlag{
				Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json",
				EnvVars: []string{config.EnvName("output")},
			},
		),
		Action: func(c *cli.Context) error { return allocate(c, open, stdout, stderr) },
	}
}

// allocation is what `allocate` prints.
type allocation struct {
	Size      int             `json:"size"`
	Available int             `json:"available"`
	Exact     bool            `json:"exact"`
	GPUs      []allocatedGPU  `json:"gpus"`
	Score     allocator.Score `json:"score"`
	Pairs     []allocatedPair `json:"pairs"`
}

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

func allocate(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	output := c.String("output")
	if output != "table" && output != "json" {
		return fmt.Errorf("--output: %q is not allowed; use table or json", output)
	}
	if !c.IsSet("size") {
		return fmt.Errorf("--size is required: how many GPUs to choose")
	}
	log := newLogger(cfg, stderr)
	lib, inv, err := discover(cfg, open, log)
	if err != nil {
		return err
	}
	defer lib.Shutdown()

	available, err := gpuIDs(inv.GPUs, "available", c.StringSlice("available"))
	if err != nil {
		return err
	}
	if !c.IsSet("available") {
		for _, g := range inv.GPUs {
			available = append(available, g.UUID)
		}
	}
	must, err := gpuIDs(inv.GPUs, "must-include", c.StringSlice("must-include"))
	if err != nil {
		return err
	}
	choice, err := gpu.NewGraph(inv.GPUs, inv.Topology).Choose(available, must, c.Int("size"))
	if err != nil {
		return fmt.Errorf("choosing %d of %d GPUs: %w", c.Int("size"), len(available), err)
	}

	out := allocation{Size: c.Int("size"), Available: len(available), Exact: choice.Exact, Score: choice.Score,
		GPUs: make([]allocatedGPU, 0, len(choice.IDs)), Pairs: []allocatedPair{}}
	var chosen []int // positions in inv.GPUs
	for _, id := range choice.IDs {
		i := slices.IndexFunc(inv.GPUs, func(g nvml.GPU) bool { return g.UUID == id })
		chosen = append(chosen, i)
		g := inv.GPUs[i]
		out.GPUs = append(out.GPUs, allocatedGPU{Index: g.Index, UUID: g.UUID, NUMANode: g.NUMANode})
	}
	for k, i := range chosen {
		for _, j := range chosen[k+1:] {
			l := inv.Topology.Between(i, j)
			out.Pairs = append(out.Pairs, allocatedPair{A: inv.GPUs[i].Index, B: inv.GPUs[j].Index,
				NVLinks: l.NVLinks, PCIe: pcieName(l.PCIe), Weight: gpu.LinkWeight(l)})
		}
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeAllocation(stdout, out)
}

// gpuIDs turns UUIDs or indices into UUIDs, naming the flag of one that
// matches no GPU.
func gpuIDs(gpus []nvml.GPU, flag string, values []string) ([]string, error) {
	var out []string
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		k := slices.IndexFunc(gpus, func(g nvml.GPU) bool { return g.UUID == v })
		if n, err := strconv.Atoi(v); k < 0 && err == nil {
			k = slices.IndexFunc(gpus, func(g nvml.GPU) bool { return g.Index == n })
		}
		if k < 0 {
			return nil, fmt.Errorf("--%s: %q is neither the UUID nor the index of a GPU on this node (list shows them)", flag, v)
		}
		out = append(out, gpus[k].UUID)
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

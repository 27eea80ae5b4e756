package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/snapshot"
)

func healthColumn(state, reason string) string {
	if reason != "" {
		return state + " (" + reason + ")"
	}
	return state
}

// replicasColumn is the table's REPLICAS: how many replicas a unit is
// served as, and how they are shared when through MPS, with its daemon's
// state ("4 mps: up, 2 clients"); - when it is not shared (or not served).
func replicasColumn(ids []string, sharing string, mps *listedMPS) string {
	if len(ids) < 2 {
		return "-"
	}
	n := strconv.Itoa(len(ids))
	switch {
	case sharing != snapshot.SharingMPS:
		return n
	case mps == nil:
		return n + " mps"
	case mps.Daemon != "up":
		return n + " mps: daemon down"
	}
	return fmt.Sprintf("%s mps: up, %d clients", n, mps.Clients)
}

// holderColumn is the table's HOLDER: namespace/pod/container, several
// comma-separated, - when none.
func holderColumn(hs []listedHolder) string {
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.Namespace + "/" + h.Pod + "/" + h.Container
	}
	return orDash(strings.Join(names, ","))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// underWay says whether g has a remediation under way: any state but
// serving.
func underWay(g listedGPU) bool {
	return g.Remediation != nil && g.Remediation.State != string(remedy.StateServing)
}

// remediationLine is one GPU's remediation under the table: "GPU 3
// needsHuman since ... (decision human, 1 reset in the window): why", and
// for a GPU that waits for a human, the command that gives it back.
func remediationLine(g listedGPU) string {
	r := g.Remediation
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d remediation: %s", g.Index, r.State)
	if r.Since != "" {
		b.WriteString(" since " + r.Since)
	}
	var about []string
	if r.Decision != "" {
		about = append(about, "decision "+r.Decision)
	}
	if r.Resets > 0 {
		about = append(about, fmt.Sprintf("%d reset(s) in the window", r.Resets))
	}
	if r.HeldFor != "" {
		about = append(about, "held for "+r.HeldFor)
	}
	if len(about) > 0 {
		b.WriteString(" (" + strings.Join(about, ", ") + ")")
	}
	if r.Reason != "" {
		b.WriteString(": " + r.Reason)
	}
	if remedy.State(r.State).IsTerminal() {
		b.WriteString("; once fixed, give it back: gpu-device-plugin remediation release " + g.UUID)
		if r.State == string(remedy.StateNeedsReboot) {
			b.WriteString(", or reboot the node")
		}
	}
	return b.String()
}

// writeTable prints the listing; the DRA devices only when showDRA (a
// device-plugin node's operator rarely wants them).
func writeTable(w io.Writer, l listing, showDRA bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// REMEDIATION only while one is under way somewhere, so a healthy
	// node's table stays as it was.
	remediating := slices.ContainsFunc(l.GPUs, underWay)
	remCol := func(r *listedRemediation) string {
		if !remediating {
			return ""
		}
		if r == nil || !underWay(listedGPU{Remediation: r}) {
			return "-\t"
		}
		return r.State + "\t"
	}
	head := "INDEX\tUUID\tNAME\tMEMORY\tPCI BUS ID\tNUMA\tHEALTH\t"
	if remediating {
		head += "REMEDIATION\t"
	}
	fmt.Fprintln(tw, head+"RESOURCE\tREPLICAS\tHOLDER")
	for _, g := range l.GPUs {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s%s\t%s\t%s\n", g.Index, g.UUID, g.Name, g.MemoryBytes>>20, g.PCIBusID, numa,
			healthColumn(g.Health, g.Reason), remCol(g.Remediation), orDash(g.Resource), replicasColumn(g.DeviceIDs, g.Sharing, g.MPS), holderColumn(g.AllocatedTo))
		// MIG devices under their GPU, indented, by NVIDIA's index form.
		for _, m := range g.MIG {
			fmt.Fprintf(tw, "  %d:%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s%s\t%s\t%s\n", g.Index, m.Index, m.UUID, m.Profile, m.MemoryBytes>>20, g.PCIBusID, numa,
				healthColumn(m.Health, m.Reason), remCol(nil), orDash(m.Resource), replicasColumn(m.DeviceIDs, m.Sharing, nil), holderColumn(m.AllocatedTo))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Each GPU's NVLink domain registration, for GPUs that have one: the
	// table of a node without multi-node NVLink stays as it was.
	for _, g := range l.GPUs {
		if g.Fabric != nil {
			fmt.Fprintln(w, fabricLine(g.Index, g.Fabric))
		}
	}
	// Each remediation under way in words, and how a human ends one that
	// waits for them.
	for _, g := range l.GPUs {
		if !underWay(g) {
			continue
		}
		fmt.Fprintln(w, remediationLine(g))
	}
	if len(l.NICs) > 0 {
		fmt.Fprintln(tw, "\nNIC\tVENDOR:DEVICE\tDRIVER\tNETDEVS\tRDMA\tNUMA\tPOOL\tHEALTH\tHOLDER")
		for _, n := range l.NICs {
			numa, pool, health := "-", "-", "-"
			if n.NUMANode >= 0 {
				numa = fmt.Sprint(n.NUMANode)
			}
			if n.Pool != "" {
				pool, health = n.Pool, n.Health
				if n.Reason != "" {
					health += " (" + n.Reason + ")"
				}
			}
			fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Address, n.Vendor, n.Device, orDash(n.Driver),
				orDash(strings.Join(n.Netdevs, ",")), orDash(strings.Join(n.RDMADevices, ",")), numa, pool, health, holderColumn(n.AllocatedTo))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if showDRA && len(l.DRA.Devices) > 0 {
		fmt.Fprintf(tw, "\nDRA DEVICE (%s, pool %s)\tTYPE\tID\tPCIE ROOT\tNUMA\tTAINTS\n", l.DRA.Driver, l.DRA.Pool)
		for _, d := range l.DRA.Devices {
			attr := func(name string) string {
				a := d.Attributes[name]
				switch {
				case a.String != nil:
					return *a.String
				case a.Int != nil:
					return fmt.Sprint(*a.Int)
				}
				return "-"
			}
			id := attr("uuid")
			if id == "-" {
				id = attr("resource.kubernetes.io/pciBusID")
			}
			var taints []string
			for _, t := range d.Taints {
				taints = append(taints, t.Key+"="+t.Value+":"+t.Effect)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, attr("type"), id, attr("resource.kubernetes.io/pcieRoot"),
				attr("resource.kubernetes.io/numaNode"), orDash(strings.Join(taints, ",")))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if h := l.CDIHook; h.InUse && h.Path != "" {
		if h.Installed {
			fmt.Fprintf(w, "CDI hook: %s\n", h.Path)
		} else {
			fmt.Fprintf(w, "CDI hook: NOT INSTALLED (%s): %s\n", h.Problem, cdi.HookMissingMessage(h.Path))
		}
	}
	switch d := l.RuntimeDoor; d.State {
	case string(runtimes.Open):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: OPEN: any pod can see every GPU by setting it (%s; %s: %s); fix: %s\n", d.Runtime, d.ConfigPath, d.Key, d.Fix)
	case string(runtimes.Unknown):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: UNKNOWN whether pods can see every GPU by setting it: %s\n", d.Error)
	case string(runtimes.Closed):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: closed to pods that ask for no GPU (%s)\n", d.Reason)
	}
	for _, u := range l.UnmatchedGPUEntries {
		fmt.Fprintln(w, u.String())
	}
	if l.DriverVersion != "" {
		_, err := fmt.Fprintf(w, "driver %s, NVML %s\n", l.DriverVersion, l.NVMLVersion)
		return err
	}
	return nil
}

// fabricLine is one GPU's multi-node NVLink registration in words:
// "GPU 0 fabric: clique <cluster UUID>.<clique ID>, completed, health mask 0x0".
func fabricLine(index int, f *listedFabric) string {
	clique := f.Clique
	if clique == "" {
		clique = "none"
	}
	state := f.State
	if f.Status != "" {
		state += " (" + f.Status + ")"
	}
	return fmt.Sprintf("GPU %d fabric: clique %s, cluster %s, clique ID %d, %s, health mask 0x%x", index, clique, orDash(f.ClusterUUID), f.CliqueID, state, f.HealthMask)
}

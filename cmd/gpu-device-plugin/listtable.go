package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
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

// writeTable prints the listing; the DRA devices only when showDRA (a
// device-plugin node's operator rarely wants them).
func writeTable(w io.Writer, l listing, showDRA bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tUUID\tNAME\tMEMORY\tPCI BUS ID\tNUMA\tHEALTH\tRESOURCE\tREPLICAS\tHOLDER")
	for _, g := range l.GPUs {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.UUID, g.Name, g.MemoryBytes>>20, g.PCIBusID, numa,
			healthColumn(g.Health, g.Reason), orDash(g.Resource), replicasColumn(g.DeviceIDs, g.Sharing, g.MPS), holderColumn(g.AllocatedTo))
		// MIG devices under their GPU, indented, by NVIDIA's index form.
		for _, m := range g.MIG {
			fmt.Fprintf(tw, "  %d:%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, m.Index, m.UUID, m.Profile, m.MemoryBytes>>20, g.PCIBusID, numa,
				healthColumn(m.Health, m.Reason), orDash(m.Resource), replicasColumn(m.DeviceIDs, m.Sharing, nil), holderColumn(m.AllocatedTo))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
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

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs"
)

// listedGPU is one row of `list`.
type listedGPU struct {
	nvml.GPU
	Health string `json:"health"`
	Reason string `json:"reason,omitempty"`
}

// listedNIC is one NIC row of `list`: every NIC found, pooled or not.
type listedNIC struct {
	sysfs.NIC
	Pool   string `json:"pool,omitempty"`
	Health string `json:"health,omitempty"`
	Reason string `json:"reason,omitempty"`
}

type listing struct {
	DriverVersion string      `json:"driverVersion,omitempty"`
	NVMLVersion   string      `json:"nvmlVersion,omitempty"`
	GPUs          []listedGPU `json:"gpus"`
	NICs          []listedNIC `json:"nics"`
}

// listNICs scans the NICs once and judges them as serve would.
func listNICs(cfg config.Config, log *slog.Logger) ([]listedNIC, error) {
	scan, err := sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: cfg.SysfsRoot, ProcRoot: cfg.ProcRoot, Log: log}).Scan()
	if err != nil {
		return nil, fmt.Errorf("scanning NICs: %w", err)
	}
	pools, err := nic.NewPools(cfg.NICResources, nic.Options{DevRoot: cfg.DevRoot, Log: log})
	if err != nil {
		return nil, err
	}
	type member struct{ pool, health, reason string }
	members := map[string]member{}
	for _, u := range pools.Rescan(scan) {
		for _, d := range u.Devices {
			m := member{pool: u.Pool.Resource(), health: "Healthy"}
			if !d.Healthy {
				m.health, m.reason = "Unhealthy", d.Reason
			}
			members[d.ID] = m
		}
	}
	out := make([]listedNIC, 0, len(scan))
	for _, n := range scan {
		m := members[n.Address]
		out = append(out, listedNIC{NIC: n, Pool: m.pool, Health: m.health, Reason: m.reason})
	}
	return out, nil
}

func list(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	output := c.String("output")
	if output != "table" && output != "json" {
		return fmt.Errorf("--output: %q is not allowed; use table or json", output)
	}
	log := newLogger(cfg, stderr)
	lib, inv, err := discover(cfg, open, log)
	if err != nil {
		return err
	}
	defer lib.Shutdown()
	// One poll through the same policy serve uses; events need a watch
	// over time, so list reports what the polled state says now.
	ids := make([]string, len(inv.GPUs))
	for i, g := range inv.GPUs {
		ids[i] = g.UUID
	}
	w, err := health.NewWatcher(cfg.HealthPolicy(), ids, nvml.NewMonitor(lib, inv, log), discard{}, nil, log)
	if err != nil {
		return err
	}
	w.Poll()
	out := listing{DriverVersion: inv.DriverVersion, NVMLVersion: inv.NVMLVersion, GPUs: make([]listedGPU, 0, len(inv.GPUs))}
	for i, g := range inv.GPUs {
		healthy, reason := w.State(i)
		state := "Healthy"
		if !healthy {
			state = "Unhealthy"
		}
		out.GPUs = append(out.GPUs, listedGPU{GPU: g, Health: state, Reason: reason})
	}
	// NICs are the second half of the listing: a sysfs without PCI
	// devices (a container without /sys mounted) must not hide the GPUs.
	if out.NICs, err = listNICs(cfg, log); err != nil {
		log.Warn("NICs not listed", "err", err)
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeTable(stdout, out)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// discard takes health transitions nobody serves.
type discard struct{}

func (discard) SetHealth(string, bool, string) bool { return false }

func writeTable(w io.Writer, l listing) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tUUID\tNAME\tMEMORY\tPCI BUS ID\tNUMA\tHEALTH")
	for _, g := range l.GPUs {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		health := g.Health
		if g.Reason != "" {
			health += " (" + g.Reason + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\n", g.Index, g.UUID, g.Name, g.MemoryBytes>>20, g.PCIBusID, numa, health)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(l.NICs) > 0 {
		fmt.Fprintln(tw, "\nNIC\tVENDOR:DEVICE\tDRIVER\tNETDEVS\tRDMA\tNUMA\tPOOL\tHEALTH")
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
			fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Address, n.Vendor, n.Device, orDash(n.Driver),
				orDash(strings.Join(n.Netdevs, ",")), orDash(strings.Join(n.RDMADevices, ",")), numa, pool, health)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if l.DriverVersion != "" {
		_, err := fmt.Fprintf(w, "driver %s, NVML %s\n", l.DriverVersion, l.NVMLVersion)
		return err
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
)

// remediationData is what the remediation step read of each GPU.
type remediationData struct {
	GPUs []remediationGPU `json:"gpus"`
}

type remediationGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// Faults are what would keep the GPU from being given back
	// (nvml.Condition.Faults); empty on a clean GPU.
	Faults []string `json:"faults"`
	// Decision and Reason are what the remediation would decide on the
	// driver's word now.
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	// Processes are NVML's compute and graphics processes on it.
	Processes int `json:"processes"`
	// ResetAlone says whether the reset rule lets it be reset without its
	// NVLink peers, and why.
	ResetAlone    bool   `json:"resetAlone"`
	ResetAloneWhy string `json:"resetAloneWhy"`
	// Probe is the plugin's confined CUDA probe: its result and time.
	Probe   string  `json:"probe"`
	ProbeMs float64 `json:"probeMs,omitempty"`
}

// remediation runs the parts of GPU remediation that change nothing, on
// every GPU: NVML's reads that decide and that a give-back requires, the
// decision on them, the process lists, the NVLink reset rule, and the
// plugin's own CUDA probe, confined as the running plugin confines it. It
// never resets, drains or changes a mode: gpu-check may run on a shared
// GPU.
func (c *checker) remediation(ctx context.Context, s *Step) {
	lib, err := c.nvml()
	if !s.check("NVML loads in-process", err == nil, "%s", errText(err)) {
		return
	}
	inv, err := nvml.Discover(lib, c.sysfs, c.logger())
	if !s.check("discovery in-process", err == nil, "%s", errText(err)) {
		return
	}
	data := &remediationData{GPUs: []remediationGPU{}}
	s.Data = data
	defer func() { s.Notes = remediationNotes(data) }()
	reader := nvml.NewResetter(lib)
	rule := remedy.GPUsOf(inv)
	for i, g := range inv.GPUs {
		name := fmt.Sprintf("GPU %d", g.Index)
		d := remediationGPU{Index: g.Index, UUID: g.UUID, Faults: []string{}}
		cond, err := reader.Condition(g.UUID)
		if !s.check(name+": NVML reads its condition", err == nil, "%s", errText(err)) {
			data.GPUs = append(data.GPUs, d)
			continue
		}
		d.Faults = append(d.Faults, cond.Faults()...)
		f := remedy.Facts{Lost: cond.Lost, Health: strings.Join(d.Faults, ", ")}
		if cond.Has(nvml.SignalRecoveryAction) {
			f.Action = cond.RecoveryAction
		}
		if cond.Has(nvml.SignalRemappedRows) {
			f.RowRemapPending, f.RowRemapFailure = cond.RowRemapPending, cond.RowRemapFailure
		}
		v := remedy.Decide(f)
		d.Decision, d.Reason = string(v.Decision), v.Reason
		// A clean GPU decides nothing; a GPU with a fault may be what
		// this node has, which the check reports rather than hides.
		s.check(name+": reads clean, as a give-back requires", len(d.Faults) == 0, "%s", strings.Join(d.Faults, ", "))
		s.check(name+": the remediation's decision", len(d.Faults) > 0 || v.Decision == remedy.DecisionWatch, "%s: %s", v.Decision, v.Reason)
		procs, err := reader.Processes(g.UUID)
		d.Processes = len(procs)
		s.check(name+": NVML lists its processes", err == nil, "%d (%s)", len(procs), errText(err))
		d.ResetAlone, d.ResetAloneWhy = remedy.ResetAlone(rule[i], remedy.FabricManagerUnknown)

		switch {
		case cond.MIGEnabled:
			// CUDA cannot make a context on a GPU in MIG mode, and the
			// remediation never resets one.
			d.Probe = "skipped: MIG mode"
		default:
			began := time.Now()
			res, err := cudaprobe.Run(ctx, cudaprobe.Options{
				Self: c.plugin, DriverRoot: c.node.DriverRoot, DevRoot: c.node.DevRoot, SysRoot: c.node.SysfsRoot,
				PCIBusID: g.PCIBusID, UUID: g.UUID, Minor: g.Minor, AllocBytes: 1 << 20,
			})
			d.ProbeMs = float64(time.Since(began).Microseconds()) / 1000
			d.Probe = res.String()
			if err != nil {
				d.Probe = err.Error()
			}
			s.check(name+": the plugin's confined CUDA probe makes a context", err == nil && res.OK, "%s (%.0f ms with the process)", d.Probe, d.ProbeMs)
		}
		data.GPUs = append(data.GPUs, d)
	}
}

// remediationNotes are the summary's lines: one per GPU.
func remediationNotes(d *remediationData) []string {
	var out []string
	for _, g := range d.GPUs {
		alone := "reset alone"
		if !g.ResetAlone {
			alone = "reset with its NVLink peers"
		}
		out = append(out, fmt.Sprintf("GPU %d: decision %s, %d processes, %s; probe %s", g.Index, g.Decision, g.Processes, alone, g.Probe))
	}
	return out
}

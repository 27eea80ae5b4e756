package config

import (
	"fmt"
	"strings"
)

// MIGPartitions publishes GPUs in MIG mode as the MIG placements they
// allow, each consuming its memory and compute slices of the GPU (DRA
// partitionable devices, beta in Kubernetes 1.36): the scheduler picks a
// layout that fits the claims, and Prepare creates the GPU and compute
// instance where it was allocated, Unprepare destroys it. DRA mode only.
//
// Example, from internal/config/testdata/example-mig-partitions.yaml:
//
//	kubeletAPI: dra
//	sharing:
//	  migPartitions:
//	    enabled: true
//	    devices: ["2"]  # empty: every GPU in MIG mode
//
// A partitioned GPU serves only the instances its claims create: one made
// by hand is left alone, and the placements over its slices are not
// published.
type MIGPartitions struct {
	Enabled bool `json:"enabled,omitempty"`
	// Devices picks the GPUs: UUIDs, indices, PCI addresses or model
	// names, as includeGPUs. Empty: every GPU in MIG mode.
	Devices []string `json:"devices,omitempty"`
}

// Selects says whether the GPU, in MIG mode, is partitioned on demand.
func (m MIGPartitions) Selects(index int, uuid, pciBusID, model string) bool {
	return m.Enabled && anyOrMatches(m.Devices, index, uuid, pciBusID, model)
}

// validateMIGPartitions checks sharing.migPartitions; without withMode it
// leaves out what depends on kubeletAPI, which flags may still change.
func validateMIGPartitions(c Config, withMode bool) []error {
	m := c.Sharing.MIGPartitions
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for i, d := range m.Devices {
		if strings.TrimSpace(d) == "" || strings.TrimSpace(d) != d {
			bad("sharing.migPartitions.devices[%d]: %q matches no GPU; use a UUID, index, PCI address or model name without spaces around it", i, d)
		}
		if strings.HasPrefix(strings.ToUpper(d), "MIG-") {
			bad("sharing.migPartitions.devices[%d]: %q is a MIG device; name the GPU it is on", i, d)
		}
	}
	if !m.Enabled && len(m.Devices) > 0 {
		bad("sharing.migPartitions: devices are set but enabled is not; add enabled: true, or remove the section")
	}
	if withMode && m.Enabled && c.KubeletAPI != KubeletAPIDRA {
		bad("sharing.migPartitions: MIG partitions are made for DRA claims; set kubeletAPI (--kubelet-api) to %s, or create MIG instances with nvidia-smi and set migStrategy", KubeletAPIDRA)
	}
	return errs
}

package config

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MemoryShares lets several DRA claims hold one whole GPU, each allocated
// part of its memory: the GPU is published with allowMultipleAllocations
// and a request policy on its memory capacity (consumable capacity, beta
// in Kubernetes 1.36), and a claim allocated part of a GPU's memory is
// prepared as an MPS client of that GPU's control daemon, its environment
// limited to that memory and to the same share of its threads. The daemon
// holds every client of the GPU to the largest share prepared on it, which
// holds whatever a client's environment says. DRA mode only.
//
// Example, from internal/config/testdata/example-memory-shares.yaml:
//
//	kubeletAPI: dra
//	sharing:
//	  memoryShares:
//	    enabled: true
//	    devices: ["NVIDIA H100 80GB HBM3"]  # empty: every whole GPU
//	    minimum: 2Gi
type MemoryShares struct {
	Enabled bool `json:"enabled,omitempty"`
	// Devices picks the GPUs: UUIDs, indices, PCI addresses or model
	// names, as includeGPUs. Empty: every whole GPU (MIG devices are
	// never shared this way).
	Devices []string `json:"devices,omitempty"`
	// Minimum is the smallest share a claim may be allocated, a quantity;
	// smaller requests are rounded up to it. Empty: DefaultMemoryShareMinimum.
	Minimum string `json:"minimum,omitempty"`
}

// DefaultMemoryShareMinimum is the smallest memory share by default: a
// CUDA context alone takes a few hundred MiB.
const DefaultMemoryShareMinimum = "1Gi"

// Selects says whether the GPU is shared by memory.
func (m MemoryShares) Selects(index int, uuid, pciBusID, model string) bool {
	return m.Enabled && anyOrMatches(m.Devices, index, uuid, pciBusID, model)
}

// anyOrMatches says whether devices, a list of GPUs as includeGPUs takes
// them, names the GPU; an empty list names every GPU.
func anyOrMatches(devices []string, index int, uuid, pciBusID, model string) bool {
	if len(devices) == 0 {
		return true
	}
	for _, e := range devices {
		if gpuMatches(e, index, uuid, pciBusID, model) {
			return true
		}
	}
	return false
}

// MinimumBytes is Minimum in bytes (validated by Validate).
func (m MemoryShares) MinimumBytes() uint64 {
	n, err := parseBytes(cmp.Or(m.Minimum, DefaultMemoryShareMinimum))
	if err != nil || n == 0 {
		return 1 << 30
	}
	return n
}

// parseBytes reads a size written as a Kubernetes quantity of bytes: a
// whole number with an optional suffix, binary (Ki, Mi, Gi, Ti) or decimal
// (k, M, G, T). (The device-plugin executable links no Kubernetes API
// packages, so not resource.ParseQuantity.)
func parseBytes(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	num, mult := s, uint64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	return n * mult, nil
}

// validateMemoryShares checks sharing.memoryShares; without withMode it
// leaves out what depends on kubeletAPI, which flags may still change.
func validateMemoryShares(c Config, withMode bool) []error {
	m := c.Sharing.MemoryShares
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if m.Minimum != "" {
		n, err := parseBytes(m.Minimum)
		switch {
		case err != nil:
			bad("sharing.memoryShares.minimum: %q is not a size; write a whole number of bytes with a suffix such as Mi or Gi (example: \"2Gi\")", m.Minimum)
		case n == 0:
			bad("sharing.memoryShares.minimum: %q is not above zero; use a size such as \"1Gi\", or leave it out for %s", m.Minimum, DefaultMemoryShareMinimum)
		}
	}
	for i, d := range m.Devices {
		if strings.TrimSpace(d) == "" || strings.TrimSpace(d) != d {
			bad("sharing.memoryShares.devices[%d]: %q matches no GPU; use a UUID, index, PCI address or model name without spaces around it", i, d)
		}
		if strings.HasPrefix(strings.ToUpper(d), "MIG-") {
			bad("sharing.memoryShares.devices[%d]: %q is a MIG device, and memory shares are of whole GPUs; name a GPU", i, d)
		}
	}
	if !m.Enabled && (len(m.Devices) > 0 || m.Minimum != "") {
		bad("sharing.memoryShares: devices or minimum are set but enabled is not; add enabled: true, or remove the section")
	}
	if withMode && m.Enabled && c.KubeletAPI != KubeletAPIDRA {
		bad("sharing.memoryShares: memory shares are claims' consumable capacity, a DRA feature; set kubeletAPI (--kubelet-api) to %s, or share GPUs with sharing.mps", KubeletAPIDRA)
	}
	return errs
}

package config

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// pciAddress is a PCI address as a user may write it: "18:00.0",
// "0000:18:00.0" or NVML's "00000000:18:00.0".
var pciAddress = regexp.MustCompile(`^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)

// canonicalPCI is addr in sysfs's form, "0000:18:00.0"; "" when it is no
// PCI address.
func canonicalPCI(addr string) string {
	m := pciAddress.FindStringSubmatch(strings.ToLower(addr))
	if m == nil {
		return ""
	}
	domain := strings.TrimLeft(m[1], "0")
	if len(domain) > 4 {
		return ""
	}
	return strings.Repeat("0", 4-len(domain)) + domain + ":" + m[2] + ":" + m[3] + "." + m[4]
}

// gpuMatches says whether a selection entry names the GPU: its UUID, its
// index, its PCI address or its model name (case aside).
func gpuMatches(entry string, index int, uuid, pciBusID, model string) bool {
	switch {
	case strings.EqualFold(entry, uuid):
		return true
	case entry == strconv.Itoa(index):
		return true
	case canonicalPCI(entry) != "" && canonicalPCI(entry) == canonicalPCI(pciBusID):
		return true
	}
	return strings.EqualFold(entry, model)
}

// GPUSelected says whether the GPU is served: named by includeGPUs when
// that is set, and not named by excludeGPUs.
func (c Config) GPUSelected(index int, uuid, pciBusID, model string) bool {
	named := func(list []string) bool {
		return slices.ContainsFunc(list, func(e string) bool { return gpuMatches(e, index, uuid, pciBusID, model) })
	}
	if len(c.IncludeGPUs) > 0 && !named(c.IncludeGPUs) {
		return false
	}
	return !named(c.ExcludeGPUs)
}

// GPUName is what an excludeGPUs or includeGPUs entry may name a GPU by.
type GPUName struct {
	Index    int
	UUID     string
	PCIBusID string
	Model    string
}

// UnmatchedGPU is an excludeGPUs or includeGPUs entry that names none of
// the node's GPUs; Hint is the full model name when the entry is part of
// one ("H100" for "NVIDIA H100 80GB HBM3"), else "".
type UnmatchedGPU struct {
	Key   string `json:"key"`
	Entry string `json:"entry"`
	Hint  string `json:"hint"`
}

// GPUEntryForms says what an excludeGPUs or includeGPUs entry may be.
const GPUEntryForms = "a GPU's UUID, index, PCI address or full model name, as list shows them"

// UnmatchedGPUs lists the excludeGPUs and includeGPUs entries that name
// none of gpus, in the order given.
func (c Config) UnmatchedGPUs(gpus []GPUName) []UnmatchedGPU {
	var out []UnmatchedGPU
	for _, sel := range []struct {
		key     string
		entries []string
	}{{"excludeGPUs", c.ExcludeGPUs}, {"includeGPUs", c.IncludeGPUs}} {
		for _, e := range sel.entries {
			if slices.ContainsFunc(gpus, func(g GPUName) bool { return gpuMatches(e, g.Index, g.UUID, g.PCIBusID, g.Model) }) {
				continue
			}
			u := UnmatchedGPU{Key: sel.key, Entry: e}
			for _, g := range gpus {
				if strings.Contains(strings.ToLower(g.Model), strings.ToLower(e)) {
					u.Hint = g.Model
					break
				}
			}
			out = append(out, u)
		}
	}
	return out
}

// String is the entry as one line: what matched nothing and what would.
func (u UnmatchedGPU) String() string {
	s := fmt.Sprintf("%s entry %q matches no GPU on this node; an entry is %s", u.Key, u.Entry, GPUEntryForms)
	if u.Hint != "" {
		s += fmt.Sprintf(" (did you mean %q?)", u.Hint)
	}
	return s
}

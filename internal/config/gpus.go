package config

import (
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

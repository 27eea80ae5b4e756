package nic

import (
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs"
)

// Health is a NIC's health and, when unhealthy, why.
type Health struct {
	Healthy bool
	Reason  string
}

// Check judges one NIC from a scan; present is false when the scan no
// longer lists it. A removed or failed PCI device is unhealthy. A link
// that is down is unhealthy only while its netdev is in the host's
// namespace: a netdev moved into a pod's namespace drops out of
// NIC.Netdevs, which is how the NIC is being used, not a fault.
func Check(n sysfs.NIC, present bool) Health {
	switch {
	case !present:
		return Health{Reason: "removed: gone from sysfs"}
	case n.Failed != "":
		return Health{Reason: "PCI device failed: " + n.Failed}
	}
	if down := n.LinksDown(); len(down) > 0 {
		return Health{Reason: "link down: " + strings.Join(down, ",")}
	}
	return Health{Healthy: true}
}

// HealthOf judges the NICs at addrs against a fresh scan.
func HealthOf(addrs []string, scan []sysfs.NIC) map[string]Health {
	byAddr := make(map[string]sysfs.NIC, len(scan))
	for _, n := range scan {
		byAddr[n.Address] = n
	}
	out := make(map[string]Health, len(addrs))
	for _, a := range addrs {
		n, ok := byAddr[a]
		out[a] = Check(n, ok)
	}
	return out
}

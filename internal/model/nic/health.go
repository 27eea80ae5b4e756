package nic

import (
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// Link checks, the values of a pool's linkCheck setting
// (config.NICResource.LinkCheck).
const (
	// LinkCheckRDMAPort judges the RDMA ports.
	LinkCheckRDMAPort = "rdma-port"
	// LinkCheckNetdev judges the host-namespace netdevs that are up.
	LinkCheckNetdev = "netdev"
	// LinkCheckOff never judges the link.
	LinkCheckOff = "off"
)

// Health is a NIC's health and, when unhealthy, why.
type Health struct {
	Healthy bool
	Reason  string
}

// Check judges one NIC from a scan with the default link check (see
// CheckLink); present is false when the scan no longer lists it.
func Check(n sysfs.NIC, present bool) Health {
	return CheckLink(n, present, "")
}

// CheckLink judges one NIC from a scan with a link check (a LinkCheck*
// value; empty picks rdma-port for a NIC with RDMA
// ports and netdev for one without). A removed or failed PCI device is
// unhealthy. Then:
//   - rdma-port: unhealthy while a port whose state is known is not ACTIVE
//     or not LinkUp. The IPoIB or Ethernet netdev does not matter: verbs
//     users (NCCL, UCX) do not use it, and it is often left unconfigured.
//   - netdev: unhealthy while a host-namespace netdev that is
//     administratively up has no link. An admin-down netdev (never
//     configured, or handed back down by the host-device CNI) is unused,
//     not broken, and a netdev moved into a pod drops out of NIC.Netdevs.
//   - off: the link is not judged.
func CheckLink(n sysfs.NIC, present bool, mode string) Health {
	switch {
	case !present:
		return Health{Reason: "removed: gone from sysfs"}
	case n.Failed != "":
		return Health{Reason: "PCI device failed: " + n.Failed}
	}
	if mode == "" {
		mode = LinkCheckNetdev
		if len(n.RDMAPorts) > 0 || n.IsRDMA() {
			mode = LinkCheckRDMAPort
		}
	}
	switch mode {
	case LinkCheckRDMAPort:
		if down := n.PortsDown(); len(down) > 0 {
			return Health{Reason: "RDMA port down: " + strings.Join(down, ", ")}
		}
	case LinkCheckNetdev:
		if down := n.LinksDown(); len(down) > 0 {
			return Health{Reason: "link down: " + strings.Join(down, ",")}
		}
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

package nic

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// EnvName is the environment variable that carries a pool's allocated PCI
// addresses, as the SR-IOV network device plugin names it: PCIDEVICE_ and
// the resource name upper-cased with every other character an
// underscore. example.com/rdma_numa0 gives PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0.
func EnvName(resource string) string {
	var b strings.Builder
	b.WriteString("PCIDEVICE_")
	for _, r := range resource {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Matches reports whether every set selector matches the NIC. It does not
// apply the default-route rule; see Selects.
func Matches(s config.NICSelectors, n sysfs.NIC) bool {
	return mismatch(s, n, false) == ""
}

// Selects reports whether a pool with these selectors takes the NIC: they
// match, the NIC does not carry the default route unless the pool names
// its address, and it is not a PF with VFs enabled unless the pool names
// it (by address or netdev).
func Selects(s config.NICSelectors, n sysfs.NIC) bool {
	return Matches(s, n) && (!n.DefaultRoute || namesAddress(s, n.Address)) && (!HasVFs(n) || namesNIC(s, n))
}

// HasVFs reports whether the NIC is an SR-IOV PF with VFs enabled.
func HasVFs(n sysfs.NIC) bool { return n.NumVFs > 0 || len(n.VFs) > 0 }

// namesNIC reports whether the selectors name this NIC: its PCI address,
// or one of its host netdevs.
func namesNIC(s config.NICSelectors, n sysfs.NIC) bool {
	return namesAddress(s, n.Address) || slices.ContainsFunc(n.Netdevs, func(nd string) bool { return slices.Contains(s.Netdevs, nd) })
}

// mismatch names the first selector that does not match, or returns "".
// With fixedOnly it checks only what a NIC keeps while a pod uses it
// (IDs, driver, address, NUMA node): a pod can move the netdev, and with
// it the link type and the RDMA device, out of the host's view.
func mismatch(s config.NICSelectors, n sysfs.NIC, fixedOnly bool) string {
	switch {
	case len(s.Vendors) > 0 && !containsFold(s.Vendors, n.Vendor):
		return fmt.Sprintf("vendor is %s", n.Vendor)
	case len(s.Devices) > 0 && !containsFold(s.Devices, n.Device):
		return fmt.Sprintf("device is %s", n.Device)
	case len(s.Drivers) > 0 && !slices.Contains(s.Drivers, n.Driver):
		return fmt.Sprintf("driver is %q", n.Driver)
	case len(s.PCIAddresses) > 0 && !namesAddress(s, n.Address):
		return fmt.Sprintf("address is %s", n.Address)
	case len(s.NUMANodes) > 0 && !slices.Contains(s.NUMANodes, n.NUMANode):
		return fmt.Sprintf("NUMA node is %d", n.NUMANode)
	case s.PFOnly && n.PF != "":
		return fmt.Sprintf("it is a VF of %s", n.PF)
	case s.VFOnly && n.PF == "":
		return "it is not a VF"
	case fixedOnly:
		return ""
	case len(s.Netdevs) > 0 && !slices.ContainsFunc(n.Netdevs, func(nd string) bool { return slices.Contains(s.Netdevs, nd) }):
		return fmt.Sprintf("netdevs are %v", n.Netdevs)
	case s.RDMA != nil && *s.RDMA != n.IsRDMA():
		return fmt.Sprintf("RDMA is %t", n.IsRDMA())
	case len(s.LinkTypes) > 0 && !slices.Contains(s.LinkTypes, n.LinkType):
		return fmt.Sprintf("link type is %q", n.LinkType)
	}
	return ""
}

func namesAddress(s config.NICSelectors, addr string) bool {
	for _, a := range s.PCIAddresses {
		if c, err := sysfs.PCIAddress(a); err == nil && c == addr {
			return true
		}
	}
	return false
}

func containsFold(xs []string, x string) bool {
	return slices.ContainsFunc(xs, func(v string) bool { return strings.EqualFold(v, x) })
}

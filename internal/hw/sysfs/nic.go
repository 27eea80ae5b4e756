package sysfs

// PCI class codes as the kernel prints them in <dev>/class (0xCCSSPP:
// class, subclass, programming interface).
const (
	// ClassNetwork is the network-controller base class, 0x02xxxx.
	ClassNetwork = 0x02
	// ClassNetworkInfiniBand is a network controller of subclass
	// InfiniBand, 0x0207xx.
	ClassNetworkInfiniBand = 0x0207
	// ClassSerialInfiniBand is the older serial-bus InfiniBand class,
	// 0x0c06xx, which some HCAs still report.
	ClassSerialInfiniBand = 0x0c06
)

// Link types, from the netdev's ARP hardware type or the RDMA port's link
// layer.
const (
	LinkEther      = "ether"
	LinkInfiniBand = "infiniband"
)

// DriverVFIO is the driver a NIC is bound to when user space (DPDK, a VM)
// drives it through VFIO.
const DriverVFIO = "vfio-pci"

// IsNICClass reports whether a PCI class code is a NIC's: any network
// controller (0x02xxxx, which includes InfiniBand 0x0207xx) or a
// serial-bus InfiniBand controller (0x0c06xx).
func IsNICClass(class uint32) bool {
	return class>>16 == ClassNetwork || class>>8 == ClassSerialInfiniBand
}

// NIC is one PCI network function as sysfs shows it at one scan. It is a
// plain value: nothing in it refers back to the tree it was read from.
type NIC struct {
	// Address is the canonical PCI address, e.g. "0000:18:00.0".
	Address string
	// Vendor and Device are 4-digit lower-case hex IDs ("15b3", "1021").
	Vendor string
	Device string
	// VendorName and DeviceName come from pci.ids; empty without one.
	VendorName string
	DeviceName string
	// Class is the PCI class code, e.g. 0x020700.
	Class uint32
	// Driver is the bound driver ("mlx5_core", "vfio-pci"); empty when
	// none is bound.
	Driver string
	// NUMANode is the device's NUMA node; -1 when unknown.
	NUMANode int
	// Netdevs are the network interfaces of this function that are in
	// the namespace sysfs was mounted from (the host's), sorted. An
	// interface moved into a pod's namespace is not listed.
	Netdevs []string
	// LinkUp says, per netdev, whether its link is up (operstate, or
	// carrier where the driver reports no operational state).
	LinkUp map[string]bool
	// AdminUp says, per netdev, whether it is administratively up (IFF_UP
	// in flags). An interface nobody configured, or one the host-device
	// CNI handed back down when its pod exited, is false: unused, not
	// broken. A netdev without a flags file counts as up; one whose flags
	// do not parse is false (not judged) and noted in Problems.
	AdminUp map[string]bool
	// LinkType is LinkEther, LinkInfiniBand or empty when unknown.
	LinkType string
	// IBDevices are the RDMA devices of this function ("mlx5_0").
	IBDevices []string
	// RDMADevices are its verbs character devices ("uverbs0"), which
	// live under /dev/infiniband.
	RDMADevices []string
	// RDMAPorts are the ports of IBDevices, by device then port number.
	RDMAPorts []RDMAPort
	// IOMMUGroup is the IOMMU group number; empty without an IOMMU.
	IOMMUGroup string
	// PF is the physical function's address when this is an SR-IOV VF.
	PF string
	// VFs are the addresses of this PF's enabled virtual functions, in
	// virtfn order; NumVFs is sriov_numvfs.
	VFs    []string
	NumVFs int
	// DefaultRoute is set when one of Netdevs (directly or under a bond,
	// VLAN or bridge) carries the node's default route.
	DefaultRoute bool
	// DefaultRouteUnknown says why the scan could not tell which NIC
	// carries the default route (the route table read is another network
	// namespace's, or unreadable); empty when it could. It is the same
	// for every NIC of one scan.
	DefaultRouteUnknown string
	// Failed says why the device is unusable (it fell off the bus);
	// empty when it is not.
	Failed string
	// Problems lists oddities read around (a garbage numa_node); the NIC
	// is still usable.
	Problems []string
}

// IsRDMA reports whether the NIC has verbs devices.
func (n NIC) IsRDMA() bool { return len(n.RDMADevices) > 0 }

// LinksDown lists the host-namespace netdevs that are administratively up
// and whose link is down. An admin-down netdev is not judged.
func (n NIC) LinksDown() []string {
	var down []string
	for _, nd := range n.Netdevs {
		if n.AdminUp[nd] && !n.LinkUp[nd] {
			down = append(down, nd)
		}
	}
	return down
}

// PortsDown describes the RDMA ports whose state was read and is not
// ACTIVE, or whose physical state was read and is not LinkUp, as
// "mlx5_0/1: DOWN (Polling)". A port whose state is unknown is not judged.
func (n NIC) PortsDown() []string {
	var down []string
	for _, p := range n.RDMAPorts {
		if p.State == "" || p.Active() {
			continue
		}
		d := p.Device + "/" + p.Port + ": " + p.State
		if p.PhysState != "" {
			d += " (" + p.PhysState + ")"
		}
		down = append(down, d)
	}
	return down
}

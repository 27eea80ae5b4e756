package sysfs

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jaypipes/pcidb"
)

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

// RDMAPort is one port of an RDMA device, as
// <dev>/infiniband/<ibdev>/ports/<n> shows it. This, not the IPoIB or
// Ethernet netdev, is what verbs users (NCCL, UCX) depend on.
type RDMAPort struct {
	Device string // "mlx5_0"
	Port   string // "1"
	// State is the logical state's name ("ACTIVE", "DOWN", "INIT",
	// "ARMED"); empty when it could not be read or parsed.
	State string
	// PhysState is the physical state's name ("LinkUp", "Polling",
	// "Disabled"); empty when it could not be read or parsed.
	PhysState string
	// LinkLayer is "InfiniBand" or "Ethernet" (RoCE).
	LinkLayer string
}

// Active reports whether the port can carry traffic: logical state
// ACTIVE (or ACTIVE_DEFER) and, when known, physical state LinkUp.
func (p RDMAPort) Active() bool {
	return (p.State == "ACTIVE" || p.State == "ACTIVE_DEFER") && (p.PhysState == "" || p.PhysState == "LinkUp")
}

// NICOptions configure a NICScanner. Every root is a parameter so tests
// can point them at a fake tree and a container at host mounts.
type NICOptions struct {
	// SysfsRoot is where sysfs is mounted; default "/sys". It must be
	// mounted from the host's network namespace for Netdevs and link
	// state to be the host's.
	SysfsRoot string
	// ProcRoot holds net/route and net/ipv6_route; default "/proc".
	// /proc/net follows the reading process's network namespace, so a
	// plugin without hostNetwork should use the host's /proc/1.
	ProcRoot string
	// HostRoot is searched for a pci.ids database (usr/share/hwdata,
	// usr/share/misc, plain or .gz); default "/".
	HostRoot string
	// PCIIDs names a pci.ids file and overrides the search. It is never
	// fetched from the network.
	PCIIDs string
	Log    *slog.Logger
}

// NICScanner discovers NICs. It loads pci.ids once; each Scan reads the
// tree afresh, so it sees hot-plugged and removed devices.
type NICScanner struct {
	sysfs, proc string
	db          *pcidb.PCIDB
	log         *slog.Logger
	// inventory lists PCI devices; ghwInventory unless a test swaps it.
	inventory func() (map[string]pciDevice, error)

	mu     sync.Mutex
	logged map[string]bool
}

// pciDevice is what the inventory says of one PCI device.
type pciDevice struct {
	vendor, device         string
	vendorName, deviceName string
	class                  uint32
	driver                 string
}

// NewNICScanner prepares a scanner. It does not fail: without a pci.ids
// NICs are reported by ID, without names.
func NewNICScanner(o NICOptions) *NICScanner {
	if o.SysfsRoot == "" {
		o.SysfsRoot = "/sys"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	// ghw joins its chroot with the sysfs root; keep both absolute.
	if abs, err := filepath.Abs(o.SysfsRoot); err == nil {
		o.SysfsRoot = abs
	}
	s := &NICScanner{
		sysfs:  o.SysfsRoot,
		proc:   o.ProcRoot,
		log:    o.Log,
		logged: map[string]bool{},
	}
	s.db = loadPCIIDs(o.HostRoot, o.PCIIDs, o.Log)
	s.inventory = s.ghwInventory
	return s
}

// DiscoverNICs scans once. A caller that scans repeatedly should keep a
// NICScanner, which loads pci.ids only once.
func DiscoverNICs(o NICOptions) ([]NIC, error) {
	return NewNICScanner(o).Scan()
}

// Scan lists the NICs present now, sorted by address. It fails only when
// the PCI device directory cannot be read at all; an odd device is logged
// and skipped or kept with its Problems, never blanking the list.
func (s *NICScanner) Scan() ([]NIC, error) {
	dir := filepath.Join(s.sysfs, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	inv, invErr := s.inventory()
	if invErr != nil {
		s.warnOnce("inventory", "PCI inventory (ghw) failed; reading sysfs directly", "err", invErr)
	}

	var nics []NIC
	missed := 0
	for _, e := range entries {
		addr := e.Name()
		d, ok := inv[addr]
		if !ok {
			if d, err = s.readPCIDevice(addr); err != nil {
				s.warnOnce("skip/"+addr, "skipping PCI device sysfs cannot describe", "device", addr, "err", err)
				continue
			}
			if IsNICClass(d.class) {
				missed++
				if len(inv) > 0 {
					s.warnOnce("fallback/"+addr, "PCI inventory (ghw) skipped a NIC; read it from sysfs directly", "device", addr)
				}
			}
		}
		if !IsNICClass(d.class) {
			continue
		}
		if d.driver == "" {
			// ghw drops a driver link whose target it cannot stat.
			d.driver = linkBase(filepath.Join(dir, addr, "driver"))
		}
		n := s.readNIC(addr, d)
		if _, err := os.Stat(filepath.Join(dir, addr)); err != nil {
			// Removed while being read: half-read facts would outlive it.
			continue
		}
		nics = append(nics, n)
	}
	if len(inv) == 0 && missed > 0 {
		// Loud on purpose: the inventory seeing nothing on a node with
		// NICs means ghw and this kernel's sysfs disagree.
		s.errorOnce("empty-inventory", "PCI inventory (ghw) found no devices but sysfs lists network-class devices; using a pure sysfs scan", "nics", missed, "sysfs", dir)
	}
	slices.SortFunc(nics, func(a, b NIC) int { return cmp.Compare(a.Address, b.Address) })

	ifaces, unknown := s.defaultRoute()
	carriers := map[string]bool{}
	for _, ifc := range ifaces {
		for _, nd := range lowerNetdevs(s.sysfs, ifc) {
			carriers[nd] = true
		}
	}
	for i := range nics {
		nics[i].DefaultRouteUnknown = unknown
		for _, nd := range nics[i].Netdevs {
			if carriers[nd] {
				nics[i].DefaultRoute = true
			}
		}
	}
	return nics, nil
}

// defaultRoute returns the default-route interfaces and, when they cannot
// be trusted to be the host's, why. /proc/net follows the reader's
// network namespace: in a pod without hostNetwork it names the pod's eth0,
// which the host's sysfs lacks (or, by chance, names another interface).
func (s *NICScanner) defaultRoute() (ifaces []string, unknown string) {
	ifaces, err := DefaultRouteInterfaces(s.proc)
	if err != nil {
		return nil, err.Error()
	}
	inet6 := ifindexes(filepath.Join(s.proc, "net", "if_inet6"))
	for _, ifc := range ifaces {
		dir := filepath.Join(s.sysfs, "class", "net", ifc)
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Sprintf("default-route interface %s (from %s) is not in %s: the route table read is not the host's network namespace", ifc, filepath.Join(s.proc, "net", "route"), filepath.Dir(dir))
		}
		if idx, ok := inet6[ifc]; ok {
			if own := readTrimmed(filepath.Join(dir, "ifindex")); own != "" && own != idx {
				return nil, fmt.Sprintf("default-route interface %s has ifindex %s in %s but %s in %s: the route table read is not the host's network namespace", ifc, idx, s.proc, own, filepath.Dir(dir))
			}
		}
	}
	return ifaces, ""
}

// ifindexes maps interface names to their decimal ifindex from
// /proc/net/if_inet6 ("addr ifindex(hex) plen scope flags name"); empty
// when the file is missing (IPv6 off) or says nothing.
func ifindexes(path string) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 16, 32); err == nil {
			out[f[5]] = strconv.FormatUint(v, 10)
		}
	}
	return out
}

// readPCIDevice reads vendor, device, class and driver straight from
// sysfs, for devices the inventory did not describe.
func (s *NICScanner) readPCIDevice(addr string) (pciDevice, error) {
	dev := filepath.Join(s.sysfs, "bus", "pci", "devices", addr)
	var d pciDevice
	var err error
	if d.vendor, err = readHexID(dev, "vendor"); err != nil {
		return d, err
	}
	if d.device, err = readHexID(dev, "device"); err != nil {
		return d, err
	}
	v, err := readHex(dev, "class", 6)
	if err != nil {
		return d, err
	}
	d.class = uint32(v)
	d.driver = linkBase(filepath.Join(dev, "driver"))
	if v := s.db.Vendors[d.vendor]; v != nil {
		d.vendorName = v.Name
	}
	if p := s.db.Products[d.vendor+d.device]; p != nil {
		d.deviceName = p.Name
	}
	return d, nil
}

func readHexID(dev, name string) (string, error) {
	v, err := readHex(dev, name, 4)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%04x", v), nil
}

// readHex reads a "0x…" sysfs attribute of at most digits hex digits.
func readHex(dev, name string, digits int) (uint64, error) {
	path := filepath.Join(dev, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", name, err)
	}
	s := strings.TrimSpace(string(b))
	h, ok := strings.CutPrefix(s, "0x")
	if !ok || h == "" || len(h) > digits {
		return 0, fmt.Errorf("reading %s: %q is not a %d-digit hex value: %w", path, s, digits, ErrMalformed)
	}
	v, err := strconv.ParseUint(h, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %q is not hex: %w", path, s, ErrMalformed)
	}
	return v, nil
}

// readNIC fills in everything the inventory does not know.
func (s *NICScanner) readNIC(addr string, d pciDevice) NIC {
	dev := filepath.Join(s.sysfs, "bus", "pci", "devices", addr)
	n := NIC{
		Address:    addr,
		Vendor:     d.vendor,
		Device:     d.device,
		VendorName: d.vendorName,
		DeviceName: d.deviceName,
		Class:      d.class,
		Driver:     d.driver,
		NUMANode:   -1,
		LinkUp:     map[string]bool{},
		AdminUp:    map[string]bool{},
	}
	problem := func(err error) {
		n.Problems = append(n.Problems, err.Error())
		s.warnOnce("problem/"+addr+"/"+err.Error(), "odd sysfs entry; NIC kept", "device", addr, "err", err)
	}

	switch node, err := ReadNUMANode(s.sysfs, addr); {
	case err == nil:
		n.NUMANode = node
	case errors.Is(err, fs.ErrNotExist):
		// Kernels without CONFIG_NUMA have no numa_node: unknown.
	default:
		problem(err)
	}

	netdevs := netdevDirs(dev)
	for nd := range netdevs {
		n.Netdevs = append(n.Netdevs, nd)
	}
	slices.Sort(n.Netdevs)
	for _, nd := range n.Netdevs {
		dir := s.netdevDir(netdevs[nd], nd)
		n.LinkUp[nd] = linkUp(dir)
		up, err := adminUp(dir)
		if err != nil {
			problem(fmt.Errorf("netdev %s: %w; its link is not judged", nd, err))
		}
		n.AdminUp[nd] = up
		if n.LinkType == "" {
			n.LinkType = netdevLinkType(dir)
		}
	}
	n.IBDevices = dirNames(filepath.Join(dev, "infiniband"))
	n.RDMADevices = dirNames(filepath.Join(dev, "infiniband_verbs"))
	for _, ib := range n.IBDevices {
		ports, errs := rdmaPorts(filepath.Join(dev, "infiniband", ib), ib)
		n.RDMAPorts = append(n.RDMAPorts, ports...)
		for _, err := range errs {
			problem(err)
		}
	}
	if n.LinkType == "" {
		// A NIC whose netdev is in a pod's namespace still shows its
		// RDMA port in the host's sysfs.
		for _, ib := range n.IBDevices {
			if n.LinkType = portLinkType(filepath.Join(dev, "infiniband", ib)); n.LinkType != "" {
				break
			}
		}
	}

	n.IOMMUGroup = linkBase(filepath.Join(dev, "iommu_group"))
	n.PF = linkBase(filepath.Join(dev, "physfn"))
	n.VFs = virtfns(dev)
	if b, err := os.ReadFile(filepath.Join(dev, "sriov_numvfs")); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			n.NumVFs = v
		} else {
			problem(fmt.Errorf("reading sriov_numvfs: %q is not a number: %w", strings.TrimSpace(string(b)), ErrMalformed))
		}
	}

	// Config space reads all ones once a device has fallen off the bus;
	// the vendor file, cached at enumeration, would still look fine.
	if b, err := readConfigID(filepath.Join(dev, "config")); err == nil && bytes.Equal(b, []byte{0xff, 0xff, 0xff, 0xff}) {
		n.Failed = "config space reads all ones (fell off the bus)"
	}
	return n
}

// readConfigID reads the first 4 bytes of PCI config space (vendor and
// device ID) and no more: a rescan of every NIC every few seconds should
// not pull 4 KiB of extended config space through the device each time.
func readConfigID(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 4)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return b, nil
}

// iffUp is IFF_UP from <linux/if.h>: the interface is administratively up.
const iffUp = 0x1

// adminUp reads a netdev's flags. A missing file counts as up, the rule
// before flags were read; unparsable content is an error and not up.
func adminUp(dir string) (bool, error) {
	path := filepath.Join(dir, "flags")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", path, err)
	}
	s := strings.TrimSpace(string(b))
	h, ok := strings.CutPrefix(s, "0x")
	v, perr := strconv.ParseUint(h, 16, 32)
	if !ok || perr != nil {
		return false, fmt.Errorf("reading %s: %q is not a hex flags word (example: 0x1003): %w", path, s, ErrMalformed)
	}
	return v&iffUp != 0, nil
}

// rdmaPorts reads every port of one RDMA device. state and phys_state read
// "4: ACTIVE" and "5: LinkUp"; an unreadable or garbled one leaves that
// field empty (not judged) and is returned as an error to note.
func rdmaPorts(ibdev, name string) ([]RDMAPort, []error) {
	var ports []RDMAPort
	var errs []error
	names := dirNames(filepath.Join(ibdev, "ports"))
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return cmp.Or(cmp.Compare(x, y), cmp.Compare(a, b))
	})
	for _, port := range names {
		dir := filepath.Join(ibdev, "ports", port)
		p := RDMAPort{Device: name, Port: port, LinkLayer: readTrimmed(filepath.Join(dir, "link_layer"))}
		var err error
		if p.State, err = portState(dir, "state"); err != nil {
			errs = append(errs, fmt.Errorf("RDMA port %s/%s: %w; its state is not judged", name, port, err))
		}
		if p.PhysState, err = portState(dir, "phys_state"); err != nil {
			errs = append(errs, fmt.Errorf("RDMA port %s/%s: %w; its physical state is not judged", name, port, err))
		}
		ports = append(ports, p)
	}
	return ports, errs
}

// portState reads "<number>: <NAME>" and returns NAME; empty, without an
// error, when the file is missing.
func portState(dir, file string) (string, error) {
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	s := strings.TrimSpace(string(b))
	num, name, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if _, err := strconv.Atoi(strings.TrimSpace(num)); !ok || err != nil || name == "" {
		return "", fmt.Errorf("reading %s: %q is not \"<number>: <state>\" (example: \"4: ACTIVE\"): %w", path, s, ErrMalformed)
	}
	return name, nil
}

// netdevDirs maps each netdev of a PCI function to the directory that
// holds it: <dev>/net, or <dev>/virtioN/net for virtio-net, whose netdev
// hangs off the virtio child device.
func netdevDirs(dev string) map[string]string {
	out := map[string]string{}
	parents := []string{filepath.Join(dev, "net")}
	if virtio, _ := filepath.Glob(filepath.Join(dev, "virtio*", "net")); len(virtio) > 0 {
		parents = append(parents, virtio...)
	}
	for _, p := range parents {
		for _, nd := range dirNames(p) {
			out[nd] = p
		}
	}
	return out
}

// netdevDir prefers /sys/class/net/<if>, as the kernel documents it, and
// falls back to the device's own net/<if>, the same directory.
func (s *NICScanner) netdevDir(parent, nd string) string {
	p := filepath.Join(s.sysfs, "class", "net", nd)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return filepath.Join(parent, nd)
}

// linkUp reads a netdev's operstate, falling back to carrier when the
// driver does not report an operational state.
func linkUp(dir string) bool {
	switch readTrimmed(filepath.Join(dir, "operstate")) {
	case "up":
		return true
	case "unknown", "":
		// carrier reads EINVAL while the interface is down.
		return readTrimmed(filepath.Join(dir, "carrier")) == "1"
	default:
		return false
	}
}

func netdevLinkType(dir string) string {
	switch readTrimmed(filepath.Join(dir, "type")) {
	case "1": // ARPHRD_ETHER
		return LinkEther
	case "32": // ARPHRD_INFINIBAND
		return LinkInfiniBand
	}
	return ""
}

func portLinkType(ibdev string) string {
	for _, port := range dirNames(filepath.Join(ibdev, "ports")) {
		switch strings.ToLower(readTrimmed(filepath.Join(ibdev, "ports", port, "link_layer"))) {
		case "infiniband":
			return LinkInfiniBand
		case "ethernet":
			return LinkEther
		}
	}
	return ""
}

// virtfns lists a PF's virtfnN links in N order.
func virtfns(dev string) []string {
	entries, err := os.ReadDir(dev)
	if err != nil {
		return nil
	}
	type vf struct {
		n    int
		addr string
	}
	var vfs []vf
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "virtfn")
		if !ok {
			continue
		}
		k, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		if a := linkBase(filepath.Join(dev, e.Name())); a != "" {
			vfs = append(vfs, vf{k, a})
		}
	}
	slices.SortFunc(vfs, func(a, b vf) int { return cmp.Compare(a.n, b.n) })
	out := make([]string, len(vfs))
	for i, v := range vfs {
		out[i] = v.addr
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// dirNames lists a directory's entry names, sorted; nil when it is
// missing.
func dirNames(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return nil
	}
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Name()
	}
	return out
}

// linkBase is the last element of a symlink's target; empty when the
// link is missing.
func linkBase(path string) string {
	t, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// warnOnce and errorOnce log a condition once per scanner, so a rescan
// every few seconds does not repeat the same line forever.
func (s *NICScanner) warnOnce(key, msg string, args ...any) {
	if s.first(key) {
		s.log.Warn(msg, args...)
	}
}

func (s *NICScanner) errorOnce(key, msg string, args ...any) {
	if s.first(key) {
		s.log.Error(msg, args...)
	}
}

func (s *NICScanner) first(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logged[key] {
		return false
	}
	s.logged[key] = true
	return true
}

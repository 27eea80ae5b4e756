package sysfs

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
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

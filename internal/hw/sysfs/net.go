package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

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

// ErrNoNetdev is returned by FirstNetdev for a PCI function with no network
// interface in the namespace sysfs was mounted from: bound to vfio-pci,
// its interface moved into a pod's namespace, or the function gone.
var ErrNoNetdev = errors.New("no network interface in this network namespace")

// Netdev is a network interface of a PCI function as read at one moment.
type Netdev struct {
	Name string
	// HardwareAddress is the interface's address file as the kernel prints
	// it: a MAC ("b8:3f:d2:a1:b2:c3"), 20 bytes for InfiniBand; empty when
	// unreadable.
	HardwareAddress string
}

// FirstNetdev reads the first network interface (by name) of the PCI
// function at addr and its hardware address, now rather than from a scan:
// an interface may have been renamed, moved or readdressed since. An
// interface whose address cannot be read is returned with the error.
func FirstNetdev(sysfsRoot, addr string) (Netdev, error) {
	dirs := netdevDirs(filepath.Join(sysfsRoot, "bus", "pci", "devices", addr))
	if len(dirs) == 0 {
		return Netdev{}, fmt.Errorf("PCI function %s: %w", addr, ErrNoNetdev)
	}
	names := make([]string, 0, len(dirs))
	for nd := range dirs {
		names = append(names, nd)
	}
	slices.Sort(names)
	nd := Netdev{Name: names[0]}
	path := filepath.Join(sysfsRoot, "class", "net", nd.Name, "address")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		path = filepath.Join(dirs[nd.Name], nd.Name, "address")
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nd, fmt.Errorf("PCI function %s, interface %s: reading its hardware address: %w", addr, nd.Name, err)
	}
	nd.HardwareAddress = strings.TrimSpace(string(b))
	return nd, nil
}

package sysfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ReadNUMANode returns the NUMA node of the PCI device at addr (canonical
// form, see PCIAddress), read from <root>/bus/pci/devices/<addr>/numa_node.
// It returns -1 when the kernel says -1, which it does on machines without
// NUMA or whose firmware does not describe the device's locality.
//
// A missing file is an error that matches fs.ErrNotExist; unexpected content
// is an error that matches ErrMalformed. Both name the path.
func ReadNUMANode(root, addr string) (int, error) {
	if root == "" {
		// Refuse rather than read a path relative to the working directory.
		return 0, errors.New("reading numa_node: empty sysfs root")
	}
	if addr == "" || strings.ContainsRune(addr, '/') {
		return 0, fmt.Errorf("reading numa_node: PCI address %q: %w", addr, ErrMalformed)
	}
	path := filepath.Join(root, "bus", "pci", "devices", addr, "numa_node")
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError already names the path.
		return 0, fmt.Errorf("reading numa_node: %w", err)
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 {
		return 0, fmt.Errorf("reading %s: %q is not a NUMA node (an integer >= -1): %w", path, s, ErrMalformed)
	}
	return n, nil
}

package sysfs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// pciDevice is what the inventory says of one PCI device.
type pciDevice struct {
	vendor, device         string
	vendorName, deviceName string
	class                  uint32
	driver                 string
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

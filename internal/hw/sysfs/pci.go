package sysfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrMalformed marks input that does not parse: a bus id that is not
// DOMAIN:BUS:DEVICE.FUNCTION, or a sysfs file with unexpected content.
var ErrMalformed = errors.New("malformed")

// PCIAddress turns a PCI bus id as NVML reports it ("00000000:07:00.0", any
// case, a 4- to 8-digit domain, possibly NUL-padded from a C array) into the
// form the kernel uses for /sys/bus/pci/devices entries: "0000:07:00.0".
func PCIAddress(busID string) (string, error) {
	// NVML fills fixed-size C char arrays, so a converted id can carry NULs.
	s := strings.TrimRight(busID, "\x00")
	domain, bus, dev, fn, err := splitBusID(s)
	if err != nil {
		return "", fmt.Errorf("PCI bus id %q: %w", s, err)
	}
	// The kernel prints the domain with %04x, so wide domains (VMD uses
	// 10000 and up) keep their extra digits and 8-digit NVML domains shrink.
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), nil
}

func splitBusID(s string) (domain, bus, dev, fn uint64, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return 0, 0, 0, 0, fmt.Errorf("want DOMAIN:BUS:DEVICE.FUNCTION (example: 0000:07:00.0): %w", ErrMalformed)
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return 0, 0, 0, 0, fmt.Errorf("want DEVICE.FUNCTION after the bus, got %q: %w", parts[2], ErrMalformed)
	}
	if domain, err = parseHex("domain", parts[0], 4, 8, 1<<32-1); err != nil {
		return 0, 0, 0, 0, err
	}
	if bus, err = parseHex("bus", parts[1], 2, 2, 0xff); err != nil {
		return 0, 0, 0, 0, err
	}
	if dev, err = parseHex("device", devFn[0], 2, 2, 0x1f); err != nil {
		return 0, 0, 0, 0, err
	}
	if fn, err = parseHex("function", devFn[1], 1, 1, 7); err != nil {
		return 0, 0, 0, 0, err
	}
	return domain, bus, dev, fn, nil
}

func parseHex(field, s string, minDigits, maxDigits int, max uint64) (uint64, error) {
	if len(s) < minDigits || len(s) > maxDigits {
		if minDigits == maxDigits {
			return 0, fmt.Errorf("%s %q is not %d hex digits: %w", field, s, minDigits, ErrMalformed)
		}
		return 0, fmt.Errorf("%s %q is not %d to %d hex digits: %w", field, s, minDigits, maxDigits, ErrMalformed)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not hex: %w", field, s, ErrMalformed)
	}
	if v > max {
		return 0, fmt.Errorf("%s %q is out of range (max %#x): %w", field, s, max, ErrMalformed)
	}
	return v, nil
}

// PCIeRoot is the PCIe root complex above the device at addr ("pci0000:00"),
// read from where /sys/bus/pci/devices/<addr> links to under /sys/devices.
func PCIeRoot(sysfsRoot, addr string) (string, error) {
	link := filepath.Join(sysfsRoot, "bus", "pci", "devices", addr)
	target, err := os.Readlink(link)
	if err != nil {
		return "", fmt.Errorf("PCIe root of %s: %w", addr, err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(link), target)
	}
	rel, err := filepath.Rel(filepath.Join(sysfsRoot, "devices"), filepath.Clean(target))
	root, _, _ := strings.Cut(rel, string(filepath.Separator))
	if err != nil || !strings.HasPrefix(root, "pci") || filepath.Base(target) != addr {
		return "", fmt.Errorf("PCIe root of %s: %s links to %s, not under devices/pci…: %w", addr, link, target, ErrMalformed)
	}
	return root, nil
}

// ReadPCIClass reads a PCI device's class code (0x030200 for a 3D
// controller, 0x030000 for a VGA one) under root.
func ReadPCIClass(root, addr string) (uint32, error) {
	if root == "" || addr == "" || strings.ContainsRune(addr, '/') {
		return 0, fmt.Errorf("reading PCI class: sysfs root %q, address %q: %w", root, addr, ErrMalformed)
	}
	v, err := readHex(filepath.Join(root, "bus", "pci", "devices", addr), "class", 6)
	if err != nil {
		return 0, fmt.Errorf("reading PCI class of %s: %w", addr, err)
	}
	return uint32(v), nil
}

// ReadMachineType reads the machine's product name from DMI under root,
// as the firmware gives it ("DGX H100", "PowerEdge XE9680").
func ReadMachineType(root string) (string, error) {
	if root == "" {
		return "", errors.New("reading the machine type: empty sysfs root")
	}
	b, err := os.ReadFile(filepath.Join(root, "class", "dmi", "id", "product_name"))
	if err != nil {
		return "", fmt.Errorf("reading the machine type: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

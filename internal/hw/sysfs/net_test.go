package sysfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
)

// FirstNetdev reads the interface and its address as they are now: an
// InfiniBand address of 20 bytes, the first of several interfaces, none
// once the interface left the namespace, and the name without an address
// when that cannot be read.
func TestFirstNetdev(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	sys := filepath.Join(root, "sys")

	nd, err := FirstNetdev(sys, "0000:18:00.0")
	if want := (Netdev{Name: "ibp24s0", HardwareAddress: "00:00:10:29:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1a:2b:10"}); err != nil || nd != want {
		t.Errorf("InfiniBand NIC: %+v, %v; want %+v", nd, err, want)
	}
	nd, err = FirstNetdev(sys, "0000:03:00.0")
	if want := (Netdev{Name: "enp3s0", HardwareAddress: "3c:ec:ef:12:34:56"}); err != nil || nd != want {
		t.Errorf("Ethernet NIC: %+v, %v; want %+v", nd, err, want)
	}

	// Renamed since the scan, with a second interface: the first by name,
	// its address read through the device when class/net has no link.
	sysfstest.Apply(t, root, `rm sys/class/net/ibp24s0
rm sys/devices/pci0000:00/0000:18:00.0/net/ibp24s0
file sys/devices/pci0000:00/0000:18:00.0/net/ib1/address 00:00:10:29:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1a:2b:99
file sys/devices/pci0000:00/0000:18:00.0/net/ib0/address 00:00:10:29:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1a:2b:98
`)
	nd, err = FirstNetdev(sys, "0000:18:00.0")
	if want := (Netdev{Name: "ib0", HardwareAddress: "00:00:10:29:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1a:2b:98"}); err != nil || nd != want {
		t.Errorf("renamed: %+v, %v; want %+v", nd, err, want)
	}

	sysfstest.Apply(t, root, "rm sys/devices/pci0000:00/0000:40:00.0/net/ibp64s0/address")
	nd, err = FirstNetdev(sys, "0000:40:00.0")
	if nd != (Netdev{Name: "ibp64s0"}) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no address file: %+v, %v; want the name and a not-exist error", nd, err)
	}

	// Moved into a pod's namespace, and a function that is gone.
	sysfstest.Apply(t, root, "rm sys/devices/pci0000:00/0000:4f:00.0/net\nrm sys/class/net/ibp79s0")
	for _, addr := range []string{"0000:4f:00.0", "0000:77:00.0"} {
		if nd, err := FirstNetdev(sys, addr); nd != (Netdev{}) || !errors.Is(err, ErrNoNetdev) {
			t.Errorf("%s: %+v, %v; want ErrNoNetdev", addr, nd, err)
		}
	}
}

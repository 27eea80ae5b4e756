package sysfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestPCIAddress(t *testing.T) {
	tests := []struct {
		name  string
		busID string
		want  string
	}{
		{name: "NVML 8-digit domain", busID: "00000000:07:00.0", want: "0000:07:00.0"},
		{name: "4-digit domain unchanged", busID: "0000:07:00.0", want: "0000:07:00.0"},
		{name: "upper case lowered", busID: "00000000:B7:1F.7", want: "0000:b7:1f.7"},
		{name: "NUL padding from C array dropped", busID: "00000000:87:00.0\x00\x00\x00\x00", want: "0000:87:00.0"},
		{name: "non-zero domain kept", busID: "00000001:07:00.0", want: "0001:07:00.0"},
		{name: "wide VMD domain keeps its digits", busID: "00010000:e1:00.0", want: "10000:e1:00.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PCIAddress(tt.busID)
			if err != nil {
				t.Fatalf("PCIAddress(%q): %v", tt.busID, err)
			}
			if got != tt.want {
				t.Errorf("PCIAddress(%q) = %q, want %q", tt.busID, got, tt.want)
			}
		})
	}
}

func TestPCIAddressMalformed(t *testing.T) {
	tests := []struct {
		name  string
		busID string
	}{
		{name: "empty", busID: ""},
		{name: "only NULs", busID: "\x00\x00"},
		{name: "missing domain", busID: "07:00.0"},
		{name: "missing function", busID: "0000:07:00"},
		{name: "too many colons", busID: "0000:00:07:00.0"},
		{name: "short domain", busID: "000:07:00.0"},
		{name: "long domain", busID: "000000000:07:00.0"},
		{name: "non-hex bus", busID: "0000:zz:00.0"},
		{name: "signed bus", busID: "0000:+7:00.0"},
		{name: "three-digit bus", busID: "0000:007:00.0"},
		{name: "device above 0x1f", busID: "0000:07:20.0"},
		{name: "function above 7", busID: "0000:07:00.8"},
		{name: "embedded NUL", busID: "0000:07\x00:00.0"},
		{name: "trailing space", busID: "0000:07:00.0 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PCIAddress(tt.busID)
			if err == nil {
				t.Fatalf("PCIAddress(%q) = %q, want an error", tt.busID, got)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("PCIAddress(%q) error %v does not match ErrMalformed", tt.busID, err)
			}
		})
	}
}

func TestPCIeRoot(t *testing.T) {
	root := t.TempDir()
	mk := func(addr, target string) {
		t.Helper()
		link := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	mk("0000:07:00.0", "../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0")
	mk("0000:87:00.0", filepath.Join(root, "devices/pci0000:80/0000:87:00.0"))
	mk("0000:99:00.0", "../../../devices/platform/0000:99:00.0")
	if err := os.MkdirAll(filepath.Join(root, "bus/pci/devices/0000:aa:00.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{"0000:07:00.0": "pci0000:00", "0000:87:00.0": "pci0000:80", "0000:99:00.0": "", "0000:aa:00.0": "", "0000:bb:00.0": ""} {
		got, err := PCIeRoot(root, addr)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("PCIeRoot(%s) = %q, %v; want %q", addr, got, err, want)
		}
	}
}

func TestReadPCIClassAndMachineType(t *testing.T) {
	root := t.TempDir()
	dev := filepath.Join(root, "bus/pci/devices/0000:18:00.0")
	dmi := filepath.Join(root, "class/dmi/id")
	for _, d := range []string{dev, dmi} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dev, "class"), []byte("0x030200\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dmi, "product_name"), []byte("DGX H100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := ReadPCIClass(root, "0000:18:00.0"); err != nil || c != 0x030200 {
		t.Errorf("class = %#x, %v; want 0x030200", c, err)
	}
	if _, err := ReadPCIClass(root, "0000:19:00.0"); err == nil {
		t.Error("a missing device's class was read")
	}
	if _, err := ReadPCIClass(root, "../x"); !errors.Is(err, ErrMalformed) {
		t.Errorf("a path as address: %v", err)
	}
	if m, err := ReadMachineType(root); err != nil || m != "DGX H100" {
		t.Errorf("machine = %q, %v", m, err)
	}
	if _, err := ReadMachineType(t.TempDir()); err == nil {
		t.Error("a machine without DMI was read")
	}
}

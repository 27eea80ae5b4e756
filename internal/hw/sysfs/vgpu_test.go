package sysfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// config256 is a 256-byte config header of vendor and device; with
// capability non-nil, a capability list of a power-management capability
// (ID 0x01) and then capability.
func config256(capability []byte) []byte {
	c := make([]byte, 256)
	c[0], c[1], c[2], c[3] = 0xde, 0x10, 0x30, 0x23
	if capability == nil {
		return c
	}
	c[configStatus] |= statusCapList
	c[configCapPointer] = 0x60
	c[0x60], c[0x61], c[0x62] = 0x01, 0x68, 0x08
	copy(c[0x68:], capability)
	return c
}

// vgpuCapability is a vGPU's vendor capability: "VF", an unrelated record
// 7, then the host record.
func vgpuCapability(version, branch string) []byte {
	other := []byte{7, 4, 0xaa, 0xbb}
	host := make([]byte, 22)
	host[1] = 22
	copy(host[2:], version)
	copy(host[12:], branch)
	records := append(other, host...)
	return append([]byte{capVendorSpecific, 0, byte(5 + len(records)), 'V', 'F'}, records...)
}

func writePCI(t *testing.T, root, addr, vendor string, config []byte) {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vendor"), []byte(vendor+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if config != nil {
		if err := os.WriteFile(filepath.Join(dir, "config"), config, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadVGPU(t *testing.T) {
	looped := config256(nil)
	looped[configStatus] |= statusCapList
	looped[configCapPointer] = 0x40
	looped[0x40], looped[0x41] = 0x01, 0x40 // points at itself
	notVF := vgpuCapability("550.54.16", "r550_00")
	notVF[3] = 'X'
	for _, c := range []struct {
		name    string
		devices map[string][]byte // address to config; nil config: a NIC of another vendor
		want    VGPU
		wantErr bool
	}{
		{name: "bare metal", devices: map[string][]byte{"0000:18:00.0": config256(nil), "0000:19:00.0": nil}},
		{name: "vGPU guest", devices: map[string][]byte{"0000:02:00.0": config256(vgpuCapability("550.54.16", "r550_00"))},
			want: VGPU{Present: true, HostDriverVersion: "550.54.16", HostDriverBranch: "r550_00"}},
		{name: "full-length fields", devices: map[string][]byte{"0000:02:00.0": config256(vgpuCapability("570.133.20", "r570_0000x"))},
			want: VGPU{Present: true, HostDriverVersion: "570.133.20", HostDriverBranch: "r570_0000x"}},
		{name: "vGPU without a host record", devices: map[string][]byte{"0000:02:00.0": config256([]byte{capVendorSpecific, 0, 9, 'V', 'F', 7, 4, 0, 0})},
			want: VGPU{Present: true}},
		{name: "vendor capability of another kind", devices: map[string][]byte{"0000:02:00.0": config256(notVF)}},
		{name: "a looping capability list", devices: map[string][]byte{"0000:02:00.0": looped}},
		{name: "unprivileged read", devices: map[string][]byte{"0000:02:00.0": config256(nil)[:64]}, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for addr, config := range c.devices {
				vendor := nvidiaVendor
				if config == nil {
					vendor, config = "0x15b3", config256(nil)
				}
				writePCI(t, root, addr, vendor, config)
			}
			got, err := ReadVGPU(root)
			if (err != nil) != c.wantErr || got != c.want {
				t.Errorf("ReadVGPU = %+v, %v; want %+v (error %v)", got, err, c.want, c.wantErr)
			}
			if c.wantErr && !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v is not ErrMalformed", err)
			}
		})
	}
	if _, err := ReadVGPU(t.TempDir()); err == nil {
		t.Error("no bus/pci/devices: no error")
	}
}

package sysfs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// VGPU is what the PCI functions of NVIDIA's vendor ID say of vGPU: whether
// any is a vGPU, and the host's vGPU manager as the last of them names it.
type VGPU struct {
	Present bool
	// HostDriverVersion and HostDriverBranch are the hypervisor's driver
	// ("550.54.16", "r550_00"); empty when no vGPU names one.
	HostDriverVersion, HostDriverBranch string
}

// nvidiaVendor is NVIDIA's PCI vendor ID, as sysfs prints it.
const nvidiaVendor = "0x10de"

// PCI config-space offsets and the vGPU capability's layout.
const (
	configStatus      = 0x06 // status register
	statusCapList     = 0x10 // ... has a capability list
	configCapPointer  = 0x34 // the list's first entry
	capVendorSpecific = 0x09
	// A vGPU's vendor-specific capability: ID, next, length, "VF", then
	// records of an ID, a length (both bytes counted) and data. Record 0
	// holds the host driver's version and branch, 10 NUL-padded bytes each.
	vgpuRecords      = 5
	vgpuHostRecord   = 0
	vgpuHostFieldLen = 10
)

// ReadVGPU reads, from every NVIDIA PCI function under root's
// bus/pci/devices, whether it is a vGPU: a guest's virtual GPU carries a
// vendor-specific capability signed "VF", with the host driver's version and
// branch, which NVML does not report. It reads the whole 256-byte config
// header, which needs privilege (an unprivileged read gets 64 bytes): a
// function whose header cannot be read whole is an error, as is one without
// its vendor, so that a node that cannot tell is not labelled as no vGPU.
func ReadVGPU(root string) (VGPU, error) {
	dir := filepath.Join(root, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return VGPU{}, fmt.Errorf("listing PCI devices: %w", err)
	}
	var v VGPU
	for _, e := range entries {
		dev := filepath.Join(dir, e.Name())
		vendor, err := os.ReadFile(filepath.Join(dev, "vendor"))
		if err != nil {
			return VGPU{}, fmt.Errorf("reading the vendor of PCI device %s: %w", e.Name(), err)
		}
		if strings.TrimSpace(string(vendor)) != nvidiaVendor {
			continue
		}
		config, err := os.ReadFile(filepath.Join(dev, "config"))
		if err != nil {
			return VGPU{}, fmt.Errorf("reading the config space of PCI device %s: %w", e.Name(), err)
		}
		if len(config) < 256 {
			return VGPU{}, fmt.Errorf("config space of PCI device %s: %d bytes, want 256 (reading it whole needs a privileged container): %w", e.Name(), len(config), ErrMalformed)
		}
		capability := vendorCapability(config)
		if len(capability) < vgpuRecords || !bytes.Equal(capability[3:5], []byte("VF")) {
			continue
		}
		v.Present = true
		if version, branch, ok := vgpuHost(capability); ok {
			v.HostDriverVersion, v.HostDriverBranch = version, branch
		}
	}
	return v, nil
}

// vendorCapability walks config's capability list to its vendor-specific
// capability, nil when it has none. A list that loops or leaves the header
// ends the walk.
func vendorCapability(config []byte) []byte {
	if config[configStatus]&statusCapList == 0 {
		return nil
	}
	var seen [256]bool
	for at := int(config[configCapPointer]); at != 0 && at+3 <= len(config) && !seen[at]; at = int(config[at+1]) {
		seen[at] = true
		switch config[at] {
		case 0xff:
			return nil
		case capVendorSpecific:
			end := min(at+int(config[at+2]), len(config))
			return config[at:end]
		}
	}
	return nil
}

// vgpuHost finds record 0 among a vGPU capability's records.
func vgpuHost(capability []byte) (version, branch string, ok bool) {
	for at := vgpuRecords; at+1 < len(capability); {
		id, length := capability[at], int(capability[at+1])
		if id == vgpuHostRecord {
			data := capability[at+2:]
			if len(data) < 2*vgpuHostFieldLen {
				return "", "", false
			}
			field := func(b []byte) string { return strings.TrimRight(string(b), "\x00") }
			return field(data[:vgpuHostFieldLen]), field(data[vgpuHostFieldLen : 2*vgpuHostFieldLen]), true
		}
		if length == 0 {
			return "", "", false
		}
		at += length
	}
	return "", "", false
}

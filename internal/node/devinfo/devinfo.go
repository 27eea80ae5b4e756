package devinfo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

const (
	// DefaultDir is the spec's Device Plugin Device Information directory
	// (section 4.1); Multus reads it at this fixed path.
	DefaultDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"
	// Version is the spec version the files follow (section 3.1.2).
	Version = "1.1.0"
	// TypePCI is the "type" of a PCI device (section 3.1.1).
	TypePCI = "pci"
	// fileSuffix ends every Device Plugin Device Information file name.
	fileSuffix = "-device.json"
)

// Info is one Device Information file (section 3).
type Info struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	PCI     *PCI   `json:"pci,omitempty"`
}

// PCI is the "pci" map (section 3.1.3).
type PCI struct {
	// Address is the device's PCI address, dddd:BB:DD.f.
	Address string `json:"pci-address"`
	// RDMADevice is the name of its RDMA device ("mlx5_0"), if any.
	RDMADevice string `json:"rdma-device,omitempty"`
	// PFAddress is the physical function's address when the NIC is an
	// SR-IOV virtual function.
	PFAddress string `json:"pf-pci-address,omitempty"`
}

// ForNIC describes n. A function has at most one RDMA device in practice;
// should it list several, the first (sysfs order, sorted) is named.
func ForNIC(n sysfs.NIC) Info {
	p := &PCI{Address: n.Address, PFAddress: n.PF}
	if len(n.IBDevices) > 0 {
		p.RDMADevice = n.IBDevices[0]
	}
	return Info{Type: TypePCI, Version: Version, PCI: p}
}

// Marshal encodes info as it is written to its file: indented, with a
// final newline.
func Marshal(info Info) ([]byte, error) {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding device information: %w", err)
	}
	return append(b, '\n'), nil
}

// FileName is the file name the spec gives the information on deviceID of
// resource (section 4.1): "<resourceName>-<deviceID>-device.json", with
// every "/" of either replaced by "-", e.g.
// "example.com-rdma_numa0-0000:18:00.0-device.json".
func FileName(resource, deviceID string) string {
	return escape(resource) + "-" + escape(deviceID) + fileSuffix
}

func escape(s string) string { return strings.ReplaceAll(s, "/", "-") }

// bdf is a canonical PCI address, the device ID of every NIC pool: the
// kernel prints the domain with %04x, so a NIC behind VMD (domains 10000
// and up) has five digits, and its file must be pruned too.
var bdf = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Dir is a Device Plugin Device Information directory.
type Dir struct {
	// Path is the directory; DefaultDir in production, created on the
	// first write as the spec asks (section 4.1.1).
	Path string
}

// Write writes the information on n, a device of resource, atomically (a
// temporary file renamed over the old one, so a reader sees the old file
// or the new, never part of one), mode 0644. A file already holding the
// same bytes is left alone. It returns the file's path.
func (d Dir) Write(resource string, n sysfs.NIC) (string, error) {
	final := filepath.Join(d.Path, FileName(resource, n.Address))
	data, err := Marshal(ForNIC(n))
	if err != nil {
		return "", err
	}
	// No fsync: the directory is on tmpfs (/var/run) and the files must
	// not outlive a reboot anyway. The temporary file's leading dot and
	// suffix keep readers from taking it for a device's file.
	if _, err := atomicfile.Write(final, data, atomicfile.Options{}); err != nil {
		return "", fmt.Errorf("writing device information of %s: %w", n.Address, err)
	}
	return final, nil
}

// Exists says whether the file of deviceID of resource is there.
func (d Dir) Exists(resource, deviceID string) bool {
	_, err := os.Lstat(filepath.Join(d.Path, FileName(resource, deviceID)))
	return err == nil
}

// Prune removes the files, and leftover temporary files, of the resources
// that are keys of keep whose device is not among that resource's IDs.
// Files of other resources (another device plugin's) are never touched.
// It returns the paths it removed; a missing directory is nothing to do.
func (d Dir) Prune(keep map[string][]string) ([]string, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the device information directory: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		resource, id, temp, ok := parse(name, keep)
		if !ok || (!temp && slices.Contains(keep[resource], id)) {
			continue
		}
		p := filepath.Join(d.Path, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing stale device information: %w", err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// parse tells which of the resources in keep, and which device, a file
// name is for; temp is set for one of Write's temporary files. The device
// part must be a PCI address: resource names may hold "-" themselves, and
// "a.com/x" must not claim "a.com/x-y"'s files.
func parse(name string, keep map[string][]string) (resource, id string, temp, ok bool) {
	base := name
	if rest, isTemp := strings.CutPrefix(name, "."); isTemp {
		i := strings.LastIndex(rest, fileSuffix+".tmp")
		if i < 0 {
			return "", "", false, false
		}
		base, temp = rest[:i+len(fileSuffix)], true
	}
	stem, isOurs := strings.CutSuffix(base, fileSuffix)
	if !isOurs {
		return "", "", false, false
	}
	for r := range keep {
		if dev, found := strings.CutPrefix(stem, escape(r)+"-"); found && bdf.MatchString(dev) {
			return r, dev, temp, true
		}
	}
	return "", "", false, false
}

// Locked is a Dir written from two goroutines, Allocate's and the NIC
// rescan's: holding it makes the last file written the latest scan's.
type Locked struct {
	mu  sync.Mutex
	dir Dir
}

// NewLocked is the directory at path, held while written.
func NewLocked(path string) *Locked { return &Locked{dir: Dir{Path: path}} }

// With runs fn while the directory is held.
func (l *Locked) With(fn func(Dir) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fn(l.dir)
}

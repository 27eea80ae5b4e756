package sysfs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/jaypipes/ghw/pkg/option"
	"github.com/jaypipes/ghw/pkg/pci"
	"github.com/jaypipes/pcidb"
)

// pciIDsLocations are where distributions install pci.ids, relative to
// the host root; the same list pcidb searches.
var pciIDsLocations = []string{
	"usr/share/hwdata/pci.ids",
	"usr/share/misc/pci.ids",
	"usr/share/hwdata/pci.ids.gz",
	"usr/share/misc/pci.ids.gz",
}

// loadPCIIDs loads the pci.ids database for names. It never goes to the
// network: the path is always explicit and network fetch is off, so
// neither pcidb's search of $HOME/.cache nor PCIDB_ENABLE_NETWORK_FETCH
// in the environment can make an offline node wait on a download. With no
// file, or one that does not parse, the database is empty and NICs carry
// IDs without names.
func loadPCIIDs(hostRoot, path string, log *slog.Logger) *pcidb.PCIDB {
	empty := &pcidb.PCIDB{Classes: map[string]*pcidb.Class{}, Vendors: map[string]*pcidb.Vendor{}, Products: map[string]*pcidb.Product{}}
	if path == "" {
		for _, loc := range pciIDsLocations {
			p := filepath.Join(hostRoot, loc)
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		log.Info("no pci.ids found; NICs are listed by vendor and device ID without names", "searched", hostRoot)
		return empty
	}
	db, err := parsePCIIDs(path)
	if err != nil {
		log.Warn("cannot load pci.ids; NICs are listed by vendor and device ID without names", "path", path, "err", err)
		return empty
	}
	return db
}

func parsePCIIDs(path string) (db *pcidb.PCIDB, err error) {
	// pcidb's parser indexes lines without checking their length, so a
	// truncated file would panic the plugin.
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("parsing %s: %v", path, r)
		}
	}()
	off := false
	return pcidb.New(&pcidb.WithOption{Path: &path, EnableNetworkFetch: &off})
}

// ghwInventory lists every PCI device through ghw, keyed by address.
// ghw gets the loaded database (so it never looks for or fetches one
// itself), no external tools, no snapshot from the environment, and the
// sysfs root as an override of its /sys.
func (s *NICScanner) ghwInventory() (map[string]pciDevice, error) {
	info, err := pci.New(
		option.WithChroot("/"),
		option.WithPathOverrides(option.PathOverrides{"/sys": s.sysfs}),
		option.WithDisableTools(),
		option.WithSnapshot(option.SnapshotOptions{}),
		option.WithAlerter(ghwAlerter{s.log}),
		option.WithPCIDB(s.db),
	)
	if err != nil {
		return nil, fmt.Errorf("ghw PCI inventory under %s: %w", s.sysfs, err)
	}
	out := make(map[string]pciDevice, len(info.Devices))
	for _, d := range info.Devices {
		if d == nil || d.Vendor == nil || d.Product == nil || d.Class == nil || d.Subclass == nil || d.ProgrammingInterface == nil {
			continue
		}
		// ghw copies IDs out of modalias unchecked: keep only well-formed
		// ones and let the sysfs fallback judge the rest.
		class, err := strconv.ParseUint(d.Class.ID+d.Subclass.ID+d.ProgrammingInterface.ID, 16, 32)
		if err != nil || len(d.Class.ID+d.Subclass.ID+d.ProgrammingInterface.ID) != 6 || !isHexID(d.Vendor.ID) || !isHexID(d.Product.ID) {
			continue
		}
		out[d.Address] = pciDevice{
			vendor:     d.Vendor.ID,
			device:     d.Product.ID,
			vendorName: known(d.Vendor.Name),
			deviceName: known(d.Product.Name),
			class:      uint32(class),
			driver:     d.Driver,
		}
	}
	return out, nil
}

func isHexID(s string) bool {
	if len(s) != 4 {
		return false
	}
	_, err := strconv.ParseUint(s, 16, 16)
	return err == nil
}

// known maps ghw's placeholder for a name missing from pci.ids to empty.
func known(name string) string {
	if name == "unknown" {
		return ""
	}
	return name
}

// ghwAlerter sends ghw's warnings to the debug log: they are per-file
// noise (no NUMA topology in a container, a device without modalias) that
// Scan reports itself where it matters.
type ghwAlerter struct{ log *slog.Logger }

func (a ghwAlerter) Printf(format string, v ...any) {
	a.log.Debug("ghw", "msg", fmt.Sprintf(format, v...))
}

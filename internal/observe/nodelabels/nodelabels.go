package nodelabels

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
)

// Expiry is how long NFD keeps our labels after the plugin stops
// rewriting them: an uninstalled plugin's labels are gone within it, and a
// running one rewrites its file about twice in that time.
const Expiry = time.Hour

// Of computes the node's labels from the discovered GPUs, the settings
// and what sysfs says of the machine (its DMI name, the GPUs' PCI class).
func Of(cfg config.Config, inv *nvml.Inventory) labels.Labels {
	f := labels.Facts{
		Inventory:   inv,
		MIGStrategy: cfg.MIGStrategy,
		TimeSlicing: cfg.Sharing.TimeSlicing,
		PCIClass:    map[string]uint32{},
	}
	f.Machine, _ = sysfs.ReadMachineType(cfg.SysfsRoot) // unknown is a value
	for _, g := range inv.GPUs {
		if c, err := sysfs.ReadPCIClass(cfg.SysfsRoot, g.PCIBusID); err == nil {
			f.PCIClass[g.PCIBusID] = c
		}
	}
	return labels.Compute(f)
}

// Keep writes the labels as cfg.NodeLabels says and keeps them from
// expiring until ctx ends. Labels are left in place when it ends: a
// restarting plugin must not make pods that select them unschedulable.
func Keep(ctx context.Context, cfg config.Config, l labels.Labels, log *slog.Logger) {
	if cfg.NodeLabels != config.NodeLabelsNFD || len(l) == 0 {
		return
	}
	if fi, err := os.Stat(cfg.NFDFeaturesDir); err != nil || !fi.IsDir() {
		why := "not a folder"
		if errors.Is(err, fs.ErrNotExist) {
			why = "missing (is Node Feature Discovery installed, and the folder mounted?)"
		} else if err != nil {
			why = err.Error()
		}
		log.Info("node labels not written: NFD's features folder is "+why, "nfdFeaturesDir", cfg.NFDFeaturesDir, "labels", len(l))
		return
	}
	f := FeatureFile{Path: filepath.Join(cfg.NFDFeaturesDir, FileName), Expiry: Expiry}
	sync := func() {
		wrote, err := f.Sync(l, time.Now())
		switch {
		case err != nil:
			log.Warn("writing the node labels", "err", err)
		case wrote:
			log.Debug("node labels written", "file", f.Path, "labels", len(l))
		}
	}
	sync()
	log.Info("node labels in NFD's feature file", "file", f.Path, "labels", len(l), "product", l[labels.Prefix+"gpu.product"])
	tick := time.NewTicker(Expiry / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			sync()
		}
	}
}

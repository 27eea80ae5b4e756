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

// RepairInterval is how often nodeLabels: node reads the Node back: a
// label someone removed returns within it, and at rest that read is all
// the plugin sends.
const RepairInterval = 10 * time.Minute

// retryAfter is the first wait after a failed read or patch of the Node,
// doubled at each failure up to RepairInterval: RBAC or the policy may not
// be in place yet when the plugin starts.
const retryAfter = 15 * time.Second

// Keep writes the labels as cfg.NodeLabels says, NFD's feature file or the
// Node (through api, which that mode needs), and keeps them there until ctx
// ends. Labels are left in place when it ends: a restarting plugin must not
// make pods that select them unschedulable.
func Keep(ctx context.Context, cfg config.Config, api API, l labels.Labels, log *slog.Logger) {
	switch cfg.NodeLabels {
	case config.NodeLabelsNFD:
		keepFile(ctx, cfg, l, log)
	case config.NodeLabelsNode:
		node, err := cfg.Node()
		if err == nil && api == nil {
			err = errors.New("no API client")
		}
		if err != nil {
			log.Warn("node labels not written", "nodeLabels", cfg.NodeLabels, "err", err)
			return
		}
		keepNode(ctx, NodeWriter{API: api, Node: node}, l, RepairInterval, retryAfter, log)
	}
}

// keepNode keeps l on the Node: at once, then every interval, and sooner
// after a failure. With no labels (every GPU left out) it deletes those it
// set before, once, and then keeps them deleted.
func keepNode(ctx context.Context, w NodeWriter, l labels.Labels, interval, retry time.Duration, log *slog.Logger) {
	first := true
	wait := retry
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wrote, err := w.Sync(ctx, l)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("node labels not written; retrying", "node", w.Node, "in", wait, "err", err)
			timer.Reset(wait)
			wait = min(2*wait, interval)
			continue
		case first:
			log.Info("node labels on the Node", "node", w.Node, "labels", len(l), "changed", wrote, "product", l[labels.Prefix+"gpu.product"])
		case wrote:
			// Someone removed or changed one of them.
			log.Info("node labels restored on the Node", "node", w.Node, "labels", len(l))
		}
		first, wait = false, retry
		timer.Reset(interval)
	}
}

// keepFile keeps l in NFD's feature file, rewriting it before it expires.
func keepFile(ctx context.Context, cfg config.Config, l labels.Labels, log *slog.Logger) {
	if len(l) == 0 {
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

package nodelabels

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
)

// Expiry is how long NFD keeps our labels after the plugin stops
// rewriting them: an uninstalled plugin's labels are gone within it, and a
// running one rewrites its file about twice in that time.
const Expiry = time.Hour

// Facts are the settings the labels depend on.
type Facts struct {
	MIGStrategy string
	TimeSlicing sharing.TimeSlicing
	MPS         sharing.MPS
	// SysfsRoot is where the machine's DMI name and the GPUs' PCI class
	// are read.
	SysfsRoot string
}

// Of computes the node's labels from the discovered GPUs, the settings
// and what sysfs says of the machine (its DMI name, the GPUs' PCI class,
// whether they are vGPUs).
func Of(o Facts, inv *nvml.Inventory) labels.Labels {
	f := labels.Facts{
		Inventory:   inv,
		MIGStrategy: o.MIGStrategy,
		TimeSlicing: o.TimeSlicing,
		MPS:         o.MPS,
		PCIClass:    map[string]uint32{},
	}
	f.Machine, _ = sysfs.ReadMachineType(o.SysfsRoot) // unknown is a value
	if v, err := sysfs.ReadVGPU(o.SysfsRoot); err == nil {
		f.VGPU = &v // else unknown: no vgpu.* labels, as GFD sets none then
	}
	for _, g := range inv.GPUs {
		if c, err := sysfs.ReadPCIClass(o.SysfsRoot, g.PCIBusID); err == nil {
			f.PCIClass[g.PCIBusID] = c
		}
	}
	return labels.Compute(f)
}

// RepairInterval is how often nodeLabels: node reads the Node back: a
// label someone removed returns within it, and at rest that read is all
// the plugin sends.
const RepairInterval = 10 * time.Minute

// Modes of delivery, the values of the nodeLabels setting.
const (
	// ModeNFD writes NFD's local feature file.
	ModeNFD = "nfd"
	// ModeNode patches the Node's labels through the API.
	ModeNode = "node"
	// ModeNodeFeature writes an NFD NodeFeature object through the API.
	ModeNodeFeature = "nodefeature"
	// ModeNone writes the labels nowhere.
	ModeNone = "none"
)

// Delivery is where the labels go: the nodeLabels and nfdFeaturesDir
// settings, and the Node's name.
type Delivery struct {
	// Mode is ModeNFD, ModeNode or ModeNone.
	Mode string
	// NFDFeaturesDir is NFD's features.d, for ModeNFD.
	NFDFeaturesDir string
	// Node is the Node's name, for ModeNode and ModeNodeFeature.
	Node string
	// Namespace and Pod are the plugin's, for ModeNodeFeature: where the
	// object goes, and whose DaemonSet owns it (none without Pod).
	Namespace, Pod string
}

// Keep writes the labels as d.Mode says, NFD's feature file, the Node or
// a NodeFeature, through api for those two (an API for the Node, a
// FeatureAPI for a NodeFeature; *kubeapi.Client is both), and keeps them
// there until ctx ends. Labels are left in place when it ends: a restarting plugin must not
// make pods that select them unschedulable.
func Keep(ctx context.Context, d Delivery, api any, l labels.Labels, log *slog.Logger) {
	switch d.Mode {
	case ModeNFD:
		keepFile(ctx, d.NFDFeaturesDir, l, log)
	case ModeNode:
		node := d.Node
		na, _ := api.(API)
		var err error
		switch {
		case node == "":
			err = errors.New("no node name")
		case na == nil:
			err = errors.New("no API client")
		}
		if err != nil {
			log.Warn("node labels not written", "nodeLabels", d.Mode, "err", err)
			return
		}
		k := nodeKeeper{w: NodeWriter{API: na, Node: node}, interval: RepairInterval, after: time.After, log: log}
		k.keep(ctx, l)
	case ModeNodeFeature:
		fa, _ := api.(FeatureAPI)
		var err error
		switch {
		case d.Node == "":
			err = errors.New("no node name")
		case d.Namespace == "":
			err = errors.New("no namespace")
		case fa == nil:
			err = errors.New("no API client")
		}
		if err != nil {
			log.Warn("node labels not written", "nodeLabels", d.Mode, "err", err)
			return
		}
		w := &FeatureWriter{API: fa, Namespace: d.Namespace, Node: d.Node, Pod: d.Pod}
		k := nodeKeeper{w: w, interval: RepairInterval, after: time.After, log: log}
		k.keep(ctx, l)
	}
}

// syncer is a writer the keeper keeps the labels with: NodeWriter or
// FeatureWriter.
type syncer interface {
	Sync(ctx context.Context, l labels.Labels) (bool, error)
	// target names where the labels go, for the logs.
	target() string
}

func (w NodeWriter) target() string     { return "node " + w.Node }
func (w *FeatureWriter) target() string { return "NodeFeature " + w.Namespace + "/" + w.Name() }

// nodeKeeper keeps labels on the Node, or in its NodeFeature.
type nodeKeeper struct {
	w        syncer
	interval time.Duration
	// policy spaces the retries after a failed read or patch (RBAC or the
	// admission policy may not be in place yet when the plugin starts);
	// zero is backoff.Default.
	policy backoff.Policy
	// after is time.After; tests pass their own.
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger
}

// keep keeps l on the Node: at once, then a read every interval that
// patches only what someone changed, and after a failure a retry by the
// backoff policy (never sooner than the server's Retry-After). With no
// labels (every GPU left out) it deletes those it set before, once, and
// then keeps them deleted.
func (k nodeKeeper) keep(ctx context.Context, l labels.Labels) {
	first := true
	b := backoff.New(k.policy)
	for {
		wrote, err := k.w.Sync(ctx, l)
		wait := k.interval
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			var class kubeapi.ErrorClass
			wait, class = b.Fail(err)
			k.log.Warn("node labels not written; retrying", "to", k.w.target(), "class", class.String(), "in", wait.String(), "err", err)
		case first:
			k.log.Info("node labels written", "to", k.w.target(), "labels", len(l), "changed", wrote, "product", l[labels.Prefix+"gpu.product"])
		case wrote:
			// Someone removed or changed one of them, or the object.
			k.log.Info("node labels restored", "to", k.w.target(), "labels", len(l))
		}
		if err == nil {
			first = false
			b.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-k.after(wait):
		}
	}
}

// keepFile keeps l in NFD's feature file in dir, rewriting it before it
// expires.
func keepFile(ctx context.Context, dir string, l labels.Labels, log *slog.Logger) {
	if len(l) == 0 {
		return
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		why := "not a folder"
		if errors.Is(err, fs.ErrNotExist) {
			why = "missing (is Node Feature Discovery installed, and the folder mounted?)"
		} else if err != nil {
			why = err.Error()
		}
		log.Info("node labels not written: NFD's features folder is "+why, "nfdFeaturesDir", dir, "labels", len(l))
		return
	}
	f := FeatureFile{Path: filepath.Join(dir, FileName), Expiry: Expiry}
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

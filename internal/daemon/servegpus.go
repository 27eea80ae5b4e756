package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dpnode"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/state"
)

// serveGPUs discovers the GPUs once NVML loads, hands them to fe, and
// watches their health until ctx ends. rep is nil without reporting;
// labelsTo is where the node labels go; labelsAPI is the API client for
// nodeLabels: node, nil in other modes; cord cordons the Node for the
// remediation, nil without remediation.cordon. remEndpoint answers for the
// remediation once it runs.
//
// A front-end that can serve a new layout on its running servers (the
// device-plugin API's) has the MIG layout polled: when it changes, what
// was built for the old inventory stops, health hands its conditions on,
// and everything is built again for a fresh discovery, while fe keeps
// serving.
func serveGPUs(ctx context.Context, cfg config.Config, open OpenFunc, mets *metrics.Metrics, specs *ondisk.Store, onHook func(bool, error), fe FrontEnd, rep *reporting, labelsTo nodelabels.Delivery, labelsAPI any, cord remediate.Cordoner, status *probe.Status, remEndpoint *remediate.Endpoint, log *slog.Logger) error {
	absent := func(err error) {
		status.Gate(gateGPUs, fmt.Sprintf("NVML did not load (%v); retrying every %s", err, cfg.NVMLRetryInterval))
		if rep != nil {
			// No GPUs for now, which the condition may say.
			rep.rep.Synced(report.GPU)
		}
		fe.NoGPUs(ctx)
	}
	lib, err := waitForNVML(ctx, cfg, open, absent, log)
	if err != nil || lib == nil {
		return err
	}
	defer lib.Shutdown()
	inv, err := discoverGPUs(cfg, lib, log)
	if err != nil {
		return err
	}
	l := layoutRun{
		cfg: cfg, lib: lib, mets: mets, specs: specs, onHook: onHook, fe: fe, rep: rep, labelsTo: labelsTo, labelsAPI: labelsAPI,
		cord: cord, status: status, remEndpoint: remEndpoint, log: log, served: make(chan error, 1),
	}
	if r, ok := fe.(relaidOut); ok && cfg.MIGLayoutPollInterval.Duration > 0 {
		l.relayout = r
	}
	// fe serves across layouts; it is started once the first is polled.
	serving := sync.WaitGroup{}
	defer serving.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.serve = func() { serving.Go(func() { l.served <- fe.ServeGPUs(ctx) }) }
	// The layout read now is what this discovery saw, give or take a
	// change in between, which the next read then sees.
	state := nvml.ReadMIGState(lib, inv.Symbols(), gpuUUIDs(inv.GPUs))
	l.restore, l.save = keptHealth(cfg, log)
	for {
		next, err := l.run(ctx, inv, state)
		if err != nil || next == nil {
			return err
		}
		changed := time.Now()
		if inv, err = discoverGPUs(cfg, lib, log); err != nil {
			return err
		}
		state = next
		l.changedAt = changed
	}
}

// discoverGPUs discovers the GPUs and leaves out those not selected.
func discoverGPUs(cfg config.Config, lib nvml.Library, log *slog.Logger) (*nvml.Inventory, error) {
	inv, err := nvml.Discover(lib, cfg.SysfsRoot, log)
	if err != nil {
		return nil, fmt.Errorf("discovering GPUs: %w", err)
	}
	log.Info("discovered GPUs", "count", len(inv.GPUs), "driverVersion", inv.DriverVersion)
	_, _ = selectGPUs(cfg, inv, log)
	for _, g := range inv.GPUs {
		log.Info("GPU", "index", g.Index, "uuid", g.UUID, "name", g.Name, "device", g.PCIBusID, "numaNode", g.NUMANode, "migDevices", len(g.MIG))
	}
	return inv, nil
}

// relaidOut is a front-end that serves a new layout of the GPUs on its
// running servers (dpnode.FrontEnd).
type relaidOut interface {
	Relayout(inv *nvml.Inventory, specs gpu.CDISpecs, held dpnode.Held) (health.Notifier, error)
	Prune(held dpnode.Held) int
}

var _ relaidOut = (*dpnode.FrontEnd)(nil)

// layoutRun is what serveGPUs builds for each layout, and what it keeps
// from one to the next.
type layoutRun struct {
	cfg         config.Config
	lib         nvml.Library
	mets        *metrics.Metrics
	specs       *ondisk.Store
	onHook      func(bool, error)
	fe          FrontEnd
	rep         *reporting
	labelsTo    nodelabels.Delivery
	labelsAPI   any
	cord        remediate.Cordoner
	status      *probe.Status
	remEndpoint *remediate.Endpoint
	log         *slog.Logger

	// relayout is fe when the MIG layout is polled, else nil.
	relayout relaidOut
	// serve starts fe's serving, whose end served yields.
	serve  func()
	served chan error
	// restore and save are health kept on disk: restored at the first
	// layout, saved at every change.
	restore, save []health.Option
	// carried is the last layout's health; prev its inventory; changedAt
	// when its change was seen.
	carried   *health.Carried
	prev      *nvml.Inventory
	changedAt time.Time
	// gone says that the front-end lists removed MIG devices pods hold;
	// noHolders that PodResources could not tell, said once.
	gone      bool
	noHolders bool
}

// run serves inv until ctx ends (nil) or the MIG layout differs from
// state: then it returns the layout it read, every goroutine it started
// ended and health carried in l.
func (l *layoutRun) run(ctx context.Context, inv *nvml.Inventory, state nvml.MIGState) (nvml.MIGState, error) {
	cfg, lib, fe, rep, log := l.cfg, l.lib, l.fe, l.rep, l.log
	first := l.prev == nil
	var held dpnode.Held
	if !first {
		held = l.holders(ctx)
	}
	// The spec first: the kubelet may hand out a CDI name as soon as the
	// resource registers.
	var gspecs *ondisk.GPU
	var err error
	if l.specs != nil {
		specGPUs := inv.GPUs
		if !first && held != nil {
			// A removed MIG device a pod holds keeps its CDI device, for a
			// container the kubelet restarts, until a layout without it.
			specGPUs = withGoneMIG(inv.GPUs, l.prev.GPUs)
		}
		if gspecs, err = ondisk.NewGPU(CDIOptions(cfg), l.specs, specGPUs, l.onHook, log); err != nil {
			return nil, err
		}
	}
	var cs gpu.CDISpecs
	if gspecs != nil {
		cs = gspecs
	}
	var notify health.Notifier
	if first {
		notify, err = fe.TakeGPUs(inv, cs)
	} else {
		notify, err = l.relayout.Relayout(inv, cs, held)
		l.gone = l.relayout.Prune(held) > 0
	}
	if err != nil {
		return nil, err
	}
	l.prev = inv
	nodeLabels := nodelabels.Of(LabelFacts(cfg), inv)
	units := servedUnits(fe, inv.GPUs)
	if rep != nil {
		notify = rep.takeGPUs(units, notify)
	}
	partitioned := migPartitions(cfg, lib, fe, inv.GPUs, log)
	parts := withPartitioned(healthParts(units, len(inv.GPUs)), partitioned, inv.GPUs)
	// The remediation withholds a GPU behind the MPS gate, which stops its
	// daemon while health says it faulted.
	rem, remMPS, remGPUs, err := remediation(cfg, lib, inv, units, parts, fe, rep, l.cord, l.mets, notify, log)
	if err != nil {
		return nil, err
	}
	if rem != nil {
		notify = rem
	}
	notify, runMPS, mpsMgr, err := mpsDaemons(ctx, cfg, lib, fe, units, notify, l.mets, log)
	if err != nil {
		return nil, err
	}
	if remMPS != nil {
		remMPS.m = mpsMgr
	}

	// Health reaches the front-end, which tells the kubelet at once.
	ids := gpuUUIDs(inv.GPUs)
	var rec health.Recorder
	if l.mets != nil {
		rec = recorder(units, l.mets)
	}
	mon := nvml.NewMonitor(lib, inv, log)
	if remGPUs != nil {
		// A reset gives the GPU a new NVML handle: health reads it anew.
		remGPUs.Rebound = func(uuid string) {
			if i := slices.Index(ids, uuid); i >= 0 {
				if err := mon.Rebind(i); err != nil {
					log.Warn("health cannot read a GPU its reset brought back; it reads as lost", "device", uuid, "err", err)
				}
			}
		}
	}
	opts := append(slices.Clone(l.save), health.WithParts(parts),
		health.OnTurn(func() { l.status.Turned(loopGPUHealth, cfg.HealthPollInterval.Duration) }))
	if l.carried != nil {
		opts = append(opts, health.WithCarried(*l.carried))
	} else {
		opts = append(opts, l.restore...)
	}
	if rem != nil {
		opts = append(opts, health.OnFacts(rem.Facts))
	}
	watcher, err := health.NewWatcher(HealthPolicy(cfg), ids, mon, notify, rec, log, opts...)
	if err != nil {
		return nil, err
	}
	if rem != nil {
		rem.UseHealth(watcher)
	}
	// One poll before the kubelet can see the GPUs, so one that must not
	// be handed out (MIG enabled, a pending reset) is never offered healthy.
	watcher.Poll()
	if !first {
		log.Info("MIG layout served", "took", time.Since(l.changedAt).String(), "units", len(units), "removedDevicesHeld", l.gone)
	}
	// Deferred in this order so the goroutines are told to stop before
	// they are waited for, however run returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan nvml.Event, 64)
	wg.Go(func() {
		if err := mon.WatchEvents(ctx, events); err != nil {
			log.Warn("NVML events unavailable; XIDs will not be seen, polling continues", "err", err)
		}
	})
	wg.Go(func() { watcher.Run(ctx, events) })
	if rem != nil {
		wg.Go(func() { rem.Run(ctx) })
		l.remEndpoint.Serve(rem)
	}
	if runMPS != nil {
		wg.Go(func() { runMPS(ctx) })
	}
	wg.Go(func() { nodelabels.Keep(ctx, l.labelsTo, l.labelsAPI, nodeLabels, log) })
	if gspecs != nil {
		wg.Go(func() { gspecs.Watch(ctx, log) })
	}
	if first {
		if rep != nil {
			// The GPUs' health was first polled: the condition may be sent.
			rep.rep.Synced(report.GPU)
		}
		l.status.Gate(gateGPUs, "")
		l.serve()
	}
	var tick <-chan time.Time
	if l.relayout != nil {
		t := time.NewTicker(cfg.MIGLayoutPollInterval.Duration)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case err := <-l.served:
			return nil, err
		case <-tick:
		}
		if l.gone {
			l.gone = l.relayout.Prune(l.holders(ctx)) > 0
		}
		now := nvml.ReadMIGState(lib, inv.Symbols(), ids)
		changes := state.Changes(now)
		if len(changes) == 0 {
			continue
		}
		log.Info("MIG layout changed; serving the new one", "changes", changes)
		// Health stops before it is carried; the deferred wait would be
		// too late.
		cancel()
		wg.Wait()
		c := watcher.Carry()
		l.carried = &c
		return now, nil
	}
}

// holders says which devices pods hold, by the kubelet's PodResources
// API; nil when it cannot tell (said once): removed MIG devices are then
// dropped at once.
func (l *layoutRun) holders(ctx context.Context) dpnode.Held {
	h, err := podresources.Client{Socket: l.cfg.PodResourcesSocket}.Holders(ctx)
	if err != nil {
		if !l.noHolders {
			l.log.Warn("cannot tell which pods hold MIG devices a new layout removed; they are dropped at once", "podResourcesSocket", l.cfg.PodResourcesSocket, "err", err)
		}
		l.noHolders = true
		return nil
	}
	l.noHolders = false
	return func(resource, id string) bool { return len(h.Device(resource, id)) > 0 }
}

// withGoneMIG is gpus with the MIG devices was had that they lack added
// to their GPU, for the CDI spec.
func withGoneMIG(gpus, was []nvml.GPU) []nvml.GPU {
	out := slices.Clone(gpus)
	for i := range out {
		for _, w := range was {
			if w.UUID != out[i].UUID {
				continue
			}
			for _, m := range w.MIG {
				if !slices.ContainsFunc(out[i].MIG, func(n nvml.MIGDevice) bool { return n.UUID == m.UUID }) {
					out[i].MIG = append(slices.Clip(out[i].MIG), m)
				}
			}
		}
	}
	return out
}

// gpuUUIDs are the GPUs' UUIDs, the IDs health is watched by.
func gpuUUIDs(gpus []nvml.GPU) []string {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = g.UUID
	}
	return ids
}

// waitForNVML opens NVML, retrying while the driver is missing. It logs
// the first failure clearly and later ones quietly. It returns a nil
// library and no error when ctx ends first.
// absent is called once, after the first failure.
func waitForNVML(ctx context.Context, cfg config.Config, open OpenFunc, absent func(error), log *slog.Logger) (nvml.Library, error) {
	for attempt := 1; ; attempt++ {
		lib, path, err := nvml.Load(open, cfg.DriverRoot, cfg.NVMLLibrary)
		if err == nil {
			if attempt > 1 {
				log.Info("NVML loaded; serving GPUs", "library", path, "attempts", attempt)
			}
			return lib, nil
		}
		if attempt == 1 {
			level := slog.LevelError
			if errors.Is(err, nvml.ErrNoDriver) {
				level = slog.LevelWarn
			}
			log.Log(ctx, level, "NVML unavailable; serving no GPUs until it loads", "err", err, "retryEvery", cfg.NVMLRetryInterval.String())
			absent(err)
		} else {
			log.Debug("NVML still unavailable", "err", err, "attempt", attempt)
		}
		t := time.NewTimer(cfg.NVMLRetryInterval.Duration)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
	}
}

// keptHealth restores the sticky health conditions (a fatal XID, a GPU
// waiting for a reset) saved by an earlier run on this boot (restore), and
// saves them at every change (save), so a restarted plugin does not re-admit a GPU that
// is still broken. A reboot resets the GPUs, and the boot ID tells.
func keptHealth(cfg config.Config, log *slog.Logger) (restore, save []health.Option) {
	if cfg.StateDir == "" {
		return nil, nil
	}
	store := state.Store{
		Path:       filepath.Join(cfg.StateDir, healthStateFile),
		BootIDPath: filepath.Join(cfg.ProcRoot, "sys", "kernel", "random", "boot_id"),
	}
	var saved []health.StickyCondition
	switch found, err := store.Load(&saved); {
	case err != nil:
		log.Warn("reading health kept from an earlier run; starting without it", "err", err)
	case found && len(saved) > 0:
		log.Info("restoring health conditions kept from an earlier run on this boot", "count", len(saved), "path", store.Path)
		restore = append(restore, health.WithSticky(saved))
	}
	failing := false
	if err := store.Writable(); err != nil {
		log.Warn("health conditions that must outlive a restart (a fatal XID, a GPU waiting for a reset) cannot be kept: fix the directory, or set stateDir (--state-dir)", "err", err)
		failing = true // said once; a later save that works says so
	}
	save = append(save, health.OnStickyChange(func(c []health.StickyCondition) {
		if c == nil {
			c = []health.StickyCondition{}
		}
		err := store.Save(c)
		switch {
		case err != nil && !failing:
			log.Warn("saving health conditions; a restarted plugin would not know them", "err", err)
		case err == nil && failing:
			log.Info("saving health conditions works again", "path", store.Path)
		}
		failing = err != nil
	}))
	return restore, save
}

// healthStateFile is the file in cfg.StateDir that keeps sticky health.
const healthStateFile = "health.json"

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
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/state"
)

// serveGPUs discovers the GPUs once NVML loads, hands them to fe, and
// watches their health until ctx ends. rep is nil without reporting;
// labelsTo is where the node labels go; labelsAPI is the API client for
// nodeLabels: node, nil in other modes; cord cordons the Node for the
// remediation, nil without remediation.cordon. remEndpoint answers for the
// remediation once it runs.
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
	inv, err := nvml.Discover(lib, cfg.SysfsRoot, log)
	if err != nil {
		return fmt.Errorf("discovering GPUs: %w", err)
	}
	log.Info("discovered GPUs", "count", len(inv.GPUs), "driverVersion", inv.DriverVersion)
	_, _ = selectGPUs(cfg, inv, log)
	for _, g := range inv.GPUs {
		log.Info("GPU", "index", g.Index, "uuid", g.UUID, "name", g.Name, "device", g.PCIBusID, "numaNode", g.NUMANode, "migDevices", len(g.MIG))
	}
	// The spec first: the kubelet may hand out a CDI name as soon as the
	// resource registers.
	var gspecs *ondisk.GPU
	if specs != nil {
		if gspecs, err = ondisk.NewGPU(CDIOptions(cfg), specs, inv.GPUs, onHook, log); err != nil {
			return err
		}
	}
	var cs gpu.CDISpecs
	if gspecs != nil {
		cs = gspecs
	}
	notify, err := fe.TakeGPUs(inv, cs)
	if err != nil {
		return err
	}
	nodeLabels := nodelabels.Of(LabelFacts(cfg), inv)
	units := servedUnits(fe, inv.GPUs)
	if rep != nil {
		notify = rep.takeGPUs(units, notify)
	}
	partitioned := migPartitions(cfg, lib, fe, inv.GPUs, log)
	parts := withPartitioned(healthParts(units, len(inv.GPUs)), partitioned, inv.GPUs)
	// The remediation withholds a GPU behind the MPS gate, which stops its
	// daemon while health says it faulted.
	rem, remMPS, remGPUs, err := remediation(cfg, lib, inv, units, parts, fe, rep, cord, mets, notify, log)
	if err != nil {
		return err
	}
	if rem != nil {
		notify = rem
	}
	notify, runMPS, mpsMgr, err := mpsDaemons(ctx, cfg, lib, fe, units, notify, mets, log)
	if err != nil {
		return err
	}
	if remMPS != nil {
		remMPS.m = mpsMgr
	}

	// Health reaches the front-end, which tells the kubelet at once.
	ids := gpuUUIDs(inv.GPUs)
	var rec health.Recorder
	if mets != nil {
		rec = recorder(units, mets)
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
	opts := append(keptHealth(cfg, log), health.WithParts(parts),
		health.OnTurn(func() { status.Turned(loopGPUHealth, cfg.HealthPollInterval.Duration) }))
	if rem != nil {
		opts = append(opts, health.OnFacts(rem.Facts))
	}
	watcher, err := health.NewWatcher(HealthPolicy(cfg), ids, mon, notify, rec, log, opts...)
	if err != nil {
		return err
	}
	if rem != nil {
		rem.UseHealth(watcher)
	}
	// One poll before the kubelet can see the GPUs, so one that must not
	// be handed out (MIG enabled, a pending reset) is never offered healthy.
	watcher.Poll()
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
		remEndpoint.Serve(rem)
	}
	if runMPS != nil {
		wg.Go(func() { runMPS(ctx) })
	}
	wg.Go(func() { nodelabels.Keep(ctx, labelsTo, labelsAPI, nodeLabels, log) })
	if gspecs != nil {
		wg.Go(func() { gspecs.Watch(ctx, log) })
	}
	if rep != nil {
		// The GPUs' health was first polled: the condition may be sent.
		rep.rep.Synced(report.GPU)
	}
	status.Gate(gateGPUs, "")
	return fe.ServeGPUs(ctx)
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
// waiting for a reset) saved by an earlier run on this boot, and saves
// them at every change, so a restarted plugin does not re-admit a GPU that
// is still broken. A reboot resets the GPUs, and the boot ID tells.
func keptHealth(cfg config.Config, log *slog.Logger) []health.Option {
	if cfg.StateDir == "" {
		return nil
	}
	store := state.Store{
		Path:       filepath.Join(cfg.StateDir, healthStateFile),
		BootIDPath: filepath.Join(cfg.ProcRoot, "sys", "kernel", "random", "boot_id"),
	}
	var opts []health.Option
	var saved []health.StickyCondition
	switch found, err := store.Load(&saved); {
	case err != nil:
		log.Warn("reading health kept from an earlier run; starting without it", "err", err)
	case found && len(saved) > 0:
		log.Info("restoring health conditions kept from an earlier run on this boot", "count", len(saved), "path", store.Path)
		opts = append(opts, health.WithSticky(saved))
	}
	failing := false
	if err := store.Writable(); err != nil {
		log.Warn("health conditions that must outlive a restart (a fatal XID, a GPU waiting for a reset) cannot be kept: fix the directory, or set stateDir (--state-dir)", "err", err)
		failing = true // said once; a later save that works says so
	}
	opts = append(opts, health.OnStickyChange(func(c []health.StickyCondition) {
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
	return opts
}

// healthStateFile is the file in cfg.StateDir that keeps sticky health.
const healthStateFile = "health.json"

package ondisk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// controlNodeCheck is how often the GPU spec is checked against the
// control nodes in /dev, for containers the kubelet restarts without a new
// Allocate; Allocate checks them itself every time.
const controlNodeCheck = 5 * time.Second

// GPU keeps the GPU spec in step with the control nodes in /dev and
// with the hook (installed after the plugin started, or removed), and
// answers the GPU resource's question before each CDI Allocate.
type GPU struct {
	store  *Store
	gpus   []nvml.GPU
	driver driverroot.Files
	opts   cdi.GPUSpecOptions // HookPath: the configured one
	onHook func(installed bool, problem error)
	log    *slog.Logger

	mu       sync.Mutex
	controls []string
	hookOK   *bool // nil until the first check
}

// NewGPU writes the GPU spec. onHook, when not nil, hears whether the
// spec runs the hook, at first and at each change.
func NewGPU(o Options, store *Store, gpus []nvml.GPU, onHook func(bool, error), log *slog.Logger) (*GPU, error) {
	driver, opts, err := gpuSpecInputs(o, log)
	if err != nil {
		return nil, err
	}
	g := &GPU{store: store, gpus: gpus, driver: driver, opts: opts, onHook: onHook, log: log}
	if err := g.refresh(true, true); err != nil {
		return nil, err
	}
	return g, nil
}

// refresh rewrites the spec when the control nodes present or the hook's
// presence differ from the spec's, or when force is set. The hook is looked
// at only when checkHook is set (at start and on Watch's ticks), so Allocate
// pays for the control nodes alone.
func (g *GPU) refresh(force, checkHook bool) error {
	present := cdi.PresentControlNodes(g.opts.DevRoot)
	var hookErr error
	if checkHook && g.opts.HookPath != "" {
		hookErr = cdi.CheckHook(g.opts.HookPath)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	hookOK := g.opts.HookPath != "" && hookErr == nil
	if !checkHook && g.hookOK != nil {
		hookOK = *g.hookOK
	}
	hookChanged := g.hookOK == nil || *g.hookOK != hookOK
	if !force && !hookChanged && slices.Equal(present, g.controls) {
		return nil
	}
	o := g.opts
	o.ControlNodes = present
	if o.ControlNodes == nil {
		o.ControlNodes = []string{}
	}
	if !hookOK {
		o.HookPath = "" // a hook the runtime cannot find fails every container it is in
	}
	spec, err := cdi.GPUSpec(g.gpus, g.driver, o)
	if err != nil {
		return fmt.Errorf("building the %s CDI spec: %w", resname.GPU, err)
	}
	g.controls = present
	g.store.Publish(resname.GPU, spec)
	if hookChanged {
		switch {
		case g.opts.HookPath == "":
			// Left out on purpose (cdiHookPath empty): said in the docs, not logged.
		case !hookOK:
			g.log.Warn(cdi.HookMissingMessage(g.opts.HookPath), "cdiHookPath", g.opts.HookPath, "err", hookErr)
		case g.hookOK != nil:
			g.log.Info("CDI hook installed; the GPU CDI spec now runs it", "cdiHookPath", g.opts.HookPath)
		}
		g.hookOK = &hookOK
		if g.onHook != nil {
			g.onHook(hookOK, hookErr)
		}
	}
	return nil
}

// Ensure is gpu.CDISpecs: a control node that appeared since the last
// write (nvidia-uvm, created by the first CUDA call after boot) is added
// before the name is handed out, and a spec not on disk fails Allocate.
func (g *GPU) Ensure() error {
	if err := g.refresh(false, false); err != nil {
		return err
	}
	return g.store.Ready(resname.GPU)
}

// Watch rechecks the control nodes every controlNodeCheck until ctx ends.
func (g *GPU) Watch(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(controlNodeCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := g.refresh(false, true); err != nil {
				log.Error("refreshing the GPU CDI spec", "err", err)
			}
		}
	}
}

// GPUSpec builds the GPU spec for the configured driver root, /dev and
// hook, as cdi generate writes it. A driver root without NVML's library
// still yields device nodes; a hook that is not installed is left out.
func GPUSpec(o Options, gpus []nvml.GPU, log *slog.Logger) (*specs.Spec, error) {
	driver, opts, err := gpuSpecInputs(o, log)
	if err != nil {
		return nil, err
	}
	if opts.HookPath != "" {
		if err := cdi.CheckHook(opts.HookPath); err != nil {
			log.Warn(cdi.HookMissingMessage(opts.HookPath), "cdiHookPath", opts.HookPath, "err", err)
			opts.HookPath = ""
		}
	}
	return cdi.GPUSpec(gpus, driver, opts)
}

func gpuSpecInputs(o Options, log *slog.Logger) (driverroot.Files, cdi.GPUSpecOptions, error) {
	opts := cdi.GPUSpecOptions{DevRoot: o.DevRoot, HookPath: o.HookPath, IMEXChannels: o.IMEXChannels}
	driver, err := driverroot.Find(o.DriverRoot)
	if err != nil {
		if !errors.Is(err, driverroot.ErrNoDriver) {
			return driver, opts, fmt.Errorf("finding driver files under %s: %w", o.DriverRoot, err)
		}
		log.Warn("no driver libraries found for the CDI spec; it will carry device nodes only", "driverRoot", o.DriverRoot, "err", err)
	}
	if o.HostDriverRoot != "" {
		driver = driver.Rebase(o.HostDriverRoot)
	}
	return driver, opts, nil
}

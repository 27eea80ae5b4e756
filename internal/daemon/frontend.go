package daemon

import (
	"context"
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
)

// FrontEnd serves the model to the kubelet through an API built outside
// this package: DRA (package dra). The device-plugin front-end is built in.
type FrontEnd interface {
	// TakeGPUs takes the discovered GPUs (specs is nil without CDI) and
	// returns where their health goes.
	TakeGPUs(inv *nvml.Inventory, specs gpu.CDISpecs) (health.Notifier, error)
	// ServeGPUs serves them until ctx ends. It is called once their
	// health was polled, so the first the kubelet hears is true.
	ServeGPUs(ctx context.Context) error
	// NoGPUs is told once that NVML did not load at the first try.
	NoGPUs(ctx context.Context)
	// TakeNICPools gets the NIC pools before their first scan.
	TakeNICPools(pools []*nic.Pool)
	// SetNICDevices passes on a pool's devices; first is the scan at start.
	SetNICDevices(p *nic.Pool, devs []device.Device, first bool)
	// Run lasts until ctx ends.
	Run(ctx context.Context) error
}

// NewFrontEnd builds a FrontEnd for cfg; specs are the plugin's CDI specs
// on disk, asked before a NIC pool's CDI name is handed out.
type NewFrontEnd func(ctx context.Context, cfg config.Config, specs *ondisk.Store, log *slog.Logger) (FrontEnd, error)

// externalGPUs and externalNICs put a FrontEnd where the device-plugin
// front-end's GPU and NIC parts go.
type externalGPUs struct{ fe FrontEnd }

func (g externalGPUs) take(inv *nvml.Inventory, specs *ondisk.GPU) (*gpuServed, error) {
	var gs gpu.CDISpecs
	if specs != nil {
		gs = specs
	}
	n, err := g.fe.TakeGPUs(inv, gs)
	if err != nil {
		return nil, err
	}
	return &gpuServed{notify: n, units: draUnits(inv.GPUs)}, nil
}

func (g externalGPUs) run(ctx context.Context) error { return g.fe.ServeGPUs(ctx) }
func (g externalGPUs) absent(ctx context.Context)    { g.fe.NoGPUs(ctx) }

type externalNICs struct{ fe FrontEnd }

func (n externalNICs) setDevices(p *nic.Pool, devs []device.Device, first bool) {
	n.fe.SetNICDevices(p, devs, first)
}

func (n externalNICs) run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

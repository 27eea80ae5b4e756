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
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dpnode"
)

// FrontEnd serves the model to the kubelet through one API: the
// device-plugin API (package dpnode) or DRA (package dra, passed in with
// WithDRA).
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
	TakeNICPools(pools []*nic.Pool) error
	// SetNICDevices passes on a pool's devices; first is the scan at start.
	SetNICDevices(p *nic.Pool, devs []device.Device, first bool)
	// ServeNICs serves the pools until ctx ends; it is called after their
	// first scan.
	ServeNICs(ctx context.Context) error
	// Run lasts until ctx ends.
	Run(ctx context.Context) error
}

var _ FrontEnd = (*dpnode.FrontEnd)(nil)

// NewFrontEnd builds a FrontEnd for cfg; specs are the plugin's CDI specs
// on disk, asked before a NIC pool's CDI name is handed out.
type NewFrontEnd func(ctx context.Context, cfg config.Config, specs *ondisk.Store, log *slog.Logger) (FrontEnd, error)

// podUIDs is a front-end that knows the UIDs of the pods it prepared
// devices for (DRA: a claim's reservedFor), for their Events.
type podUIDs interface {
	PodUID(namespace, name string) string
}

// laidOut is a front-end that serves the GPUs as layout.GPUs lays them
// out (the device-plugin API). The others serve layout.DRAUnits.
type laidOut interface {
	Served() []layout.Served
}

package dpnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

// FrontEnd serves the model through the device-plugin API; daemon drives
// it. The GPU methods run on one goroutine and the NIC methods on another;
// they share nothing mutable.
type FrontEnd struct {
	o     Options
	specs *ondisk.Store
	info  *devinfo.Locked
	log   *slog.Logger

	gpus   []*deviceplugin.Server
	served []layout.Served
	nics   map[*nic.Pool]*deviceplugin.Server
	ready  func(name, why string)
}

// Options are the settings the device-plugin front-end takes.
type Options struct {
	// Layout lays the GPUs out into resources.
	Layout layout.Options
	// DevicePluginDir is the kubelet's device-plugin directory (sockets).
	DevicePluginDir string
}

// New is the device-plugin front-end. specs are the plugin's CDI specs on
// disk (nil without CDI), asked before a NIC pool's CDI name is handed
// out; info is where a NIC's Allocate writes its device information.
func New(o Options, specs *ondisk.Store, info *devinfo.Locked, log *slog.Logger) *FrontEnd {
	return &FrontEnd{o: o, specs: specs, info: info, log: log, nics: map[*nic.Pool]*deviceplugin.Server{}, ready: func(string, string) {}}
}

// UseReadiness has each resource say whether the kubelet holds its
// registration (the plugin's readiness): ready(resource, "") once it does,
// else ready(resource, why not). Call it before TakeGPUs and TakeNICPools.
func (f *FrontEnd) UseReadiness(ready func(name, why string)) { f.ready = ready }

func (f *FrontEnd) readiness(resource string) func(string) {
	return func(why string) { f.ready(resource, why) }
}

// TakeGPUs builds one server per resource the MIG strategy and
// time-slicing lay out (nvidia.com/gpu, nvidia.com/mig-<profile>, renamed
// shared resources). specs is nil without CDI.
func (f *FrontEnd) TakeGPUs(inv *nvml.Inventory, specs gpu.CDISpecs) (health.Notifier, error) {
	node, err := layout.GPUs(f.o.Layout, inv, specs, f.log)
	if err != nil {
		return nil, err
	}
	router := unitRouter{}
	srvOf := map[string]*deviceplugin.Server{}
	for _, r := range node.Resources {
		srv, err := deviceplugin.New(deviceplugin.Options{
			ResourceName: r.Name,
			SocketDir:    f.o.DevicePluginDir,
			Backend:      r.Res,
			Log:          f.log,
			Ready:        f.readiness(r.Name),
		})
		if err != nil {
			return nil, err
		}
		srv.SetDevices(r.Res.Devices())
		f.gpus = append(f.gpus, srv)
		srvOf[r.Name] = srv
		f.log.Info("serving GPU resource", "resource", r.Name, "units", len(r.Res.Units()), "devices", len(r.Res.Devices()))
	}
	for _, sv := range node.Units() {
		router[sv.Unit.UUID()] = append(router[sv.Unit.UUID()], route{srvOf[sv.Resource], sv.IDs})
	}
	f.served = node.Units()
	return router, nil
}

// Served is how each unit taken is served: the resource and device IDs
// the kubelet knows it by.
func (f *FrontEnd) Served() []layout.Served { return f.served }

// ServeGPUs serves every GPU resource until ctx ends; the first to fail
// ends all.
func (f *FrontEnd) ServeGPUs(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(f.gpus))
	for _, s := range f.gpus {
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				errc <- socketAdvice(err)
				cancel()
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// NoGPUs: the resources register once NVML loads.
func (f *FrontEnd) NoGPUs(context.Context) {}

// TakeNICPools builds a server for each pool, on its own socket.
func (f *FrontEnd) TakeNICPools(pools []*nic.Pool) error {
	for _, p := range pools {
		srv, err := deviceplugin.New(deviceplugin.Options{ResourceName: p.Resource(), SocketDir: f.o.DevicePluginDir, Backend: nicBackend{pool: p, specs: f.specs, info: f.info}, Log: f.log, Ready: f.readiness(p.Resource())})
		if err != nil {
			return err
		}
		f.nics[p] = srv
	}
	return nil
}

// SetNICDevices passes a pool's devices to its server.
func (f *FrontEnd) SetNICDevices(p *nic.Pool, devs []device.Device, _ bool) {
	f.nics[p].SetDevices(devs)
}

// ServeNICs serves every pool until ctx ends; the first to fail ends all.
func (f *FrontEnd) ServeNICs(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(f.nics))
	for _, srv := range f.nics {
		wg.Go(func() {
			if err := srv.Run(ctx); err != nil {
				errc <- socketAdvice(fmt.Errorf("serving %s: %w", srv.Resource(), err))
				cancel()
			}
		})
	}
	<-ctx.Done()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// Run lasts until ctx ends: the servers run in ServeGPUs and ServeNICs.
func (f *FrontEnd) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// socketAdvice says what to do when the device-plugin directory cannot be
// written: the kubelet's is root's.
func socketAdvice(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: run as root, or set devicePluginDir (--device-plugin-dir) to a directory this user may write", err)
	}
	return err
}

// unitRouter passes a unit's health to every device it is served as.
type unitRouter map[string][]route

type route struct {
	srv *deviceplugin.Server
	ids []string
}

func (r unitRouter) SetHealth(id string, healthy bool, reason string) bool {
	changed := false
	for _, rt := range r[id] {
		if rt.srv.SetHealthOf(rt.ids, healthy, reason) {
			changed = true
		}
	}
	return changed
}

package dpnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/imexchan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

// FrontEnd serves the model through the device-plugin API; daemon drives
// it. The NIC methods run on one goroutine and share nothing mutable with
// the GPU methods. ServeGPUs runs on its own goroutine, and TakeGPUs,
// Relayout and Prune on the daemon's, so the GPU servers are kept under mu.
type FrontEnd struct {
	o     Options
	specs *ondisk.Store
	info  *devinfo.Locked
	log   *slog.Logger

	mu sync.Mutex
	// gpus are the GPU resources' servers by resource name: one per name
	// any layout has served, kept for the life of the plugin (a name a new
	// layout drops is served with no devices).
	gpus map[string]*gpuServer
	// start are servers not yet running; wake tells ServeGPUs of them.
	start  []*deviceplugin.Server
	wake   chan struct{}
	served []layout.Served

	nics  map[*nic.Pool]*deviceplugin.Server
	ready func(name, why string)
}

// gpuServer is one GPU resource's server and the layout's resource
// answering its Allocate, replaced when the MIG layout changes.
type gpuServer struct {
	srv *deviceplugin.Server
	res atomic.Pointer[gpu.Resource]
	// gone are device IDs a new layout dropped that a pod still held,
	// listed Unhealthy until it ends (Prune).
	gone map[string]bool
}

func (g *gpuServer) Allocate(ids []string) (*device.Answer, error) {
	return g.res.Load().Allocate(ids)
}

func (g *gpuServer) Preferred(available, mustInclude []string, size int) ([]string, error) {
	return g.res.Load().Preferred(available, mustInclude, size)
}

// Options are the settings the device-plugin front-end takes.
type Options struct {
	// Layout lays the GPUs out into resources.
	Layout layout.Options
	// DevicePluginDir is the kubelet's device-plugin directory (sockets).
	DevicePluginDir string
	// IMEX are the IMEX channels every GPU container gets: readied at
	// each TakeGPUs, once the driver is there (its /proc/devices line
	// comes with it).
	IMEX imexchan.Options
}

// New is the device-plugin front-end. specs are the plugin's CDI specs on
// disk (nil without CDI), asked before a NIC pool's CDI name is handed
// out; info is where a NIC's Allocate writes its device information.
func New(o Options, specs *ondisk.Store, info *devinfo.Locked, log *slog.Logger) *FrontEnd {
	return &FrontEnd{
		o: o, specs: specs, info: info, log: log, gpus: map[string]*gpuServer{}, wake: make(chan struct{}, 1),
		nics: map[*nic.Pool]*deviceplugin.Server{}, ready: func(string, string) {},
	}
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
	channels, err := imexchan.Provide(f.o.IMEX, f.log)
	if err != nil {
		return nil, err
	}
	f.o.Layout.IMEXChannels = channels
	return f.lay(inv, specs, nil, false)
}

// Held says whether a pod holds device id of resource (the kubelet's
// PodResources API).
type Held func(resource, id string) bool

// ReasonGone is the health reason of a device a new MIG layout no longer
// has, listed because a pod still holds it; it is dropped once the pod
// ends (Prune).
const ReasonGone = "mig-device-removed"

// Relayout serves a new layout of the same GPUs (their MIG layout
// changed) on the servers TakeGPUs built, adding a server for each
// resource name new to it, and returns where its health goes. A device
// both layouts serve keeps the health the kubelet was told; a new one is
// Unhealthy with health.ReasonRelaidOut until health reports it. A device
// the new layout lacks is dropped, unless held says a pod holds it: then
// it stays, Unhealthy with ReasonGone, until Prune finds it free. held nil
// means nothing is known held.
func (f *FrontEnd) Relayout(inv *nvml.Inventory, specs gpu.CDISpecs, held Held) (health.Notifier, error) {
	return f.lay(inv, specs, held, true)
}

func (f *FrontEnd) lay(inv *nvml.Inventory, specs gpu.CDISpecs, held Held, again bool) (health.Notifier, error) {
	node, err := layout.GPUs(f.o.Layout, inv, specs, f.log)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	router := unitRouter{}
	laid := map[string]bool{}
	for _, r := range node.Resources {
		laid[r.Name] = true
		g, known := f.gpus[r.Name]
		if !known {
			g = &gpuServer{gone: map[string]bool{}}
			srv, err := deviceplugin.New(deviceplugin.Options{
				ResourceName: r.Name,
				SocketDir:    f.o.DevicePluginDir,
				Backend:      g,
				Log:          f.log,
				Ready:        f.readiness(r.Name),
			})
			if err != nil {
				return nil, err
			}
			g.srv = srv
			f.gpus[r.Name] = g
			f.start = append(f.start, srv)
		}
		g.res.Store(r.Res)
		devs := r.Res.Devices()
		if again {
			devs = f.keep(g, devs, held)
		}
		g.srv.SetDevices(devs)
		f.log.Info("serving GPU resource", "resource", r.Name, "units", len(r.Res.Units()), "devices", len(r.Res.Devices()))
	}
	for name, g := range f.gpus {
		if laid[name] {
			continue
		}
		// No unit of the new layout is served as name: the kubelet hears
		// of no device but those pods still hold.
		devs := f.keep(g, nil, held)
		g.srv.SetDevices(devs)
		f.log.Info("GPU resource withdrawn: the MIG layout serves none of it", "resource", name, "stillHeld", len(devs))
	}
	for _, sv := range node.Units() {
		router[sv.Unit.UUID()] = append(router[sv.Unit.UUID()], route{f.gpus[sv.Resource].srv, sv.IDs})
	}
	f.served = node.Units()
	if len(f.start) > 0 {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
	return router, nil
}

// keep is devs, the devices a new layout serves as g's resource, with the
// health the kubelet was told of those it knew and health.ReasonRelaidOut
// for the others, followed by the devices it knew that devs lack and a pod
// holds, marked ReasonGone.
func (f *FrontEnd) keep(g *gpuServer, devs []device.Device, held Held) []device.Device {
	old := g.srv.Devices()
	was := make(map[string]device.Device, len(old))
	for _, d := range old {
		was[d.ID] = d
	}
	now := make(map[string]bool, len(devs))
	for i := range devs {
		now[devs[i].ID] = true
		wasGone := g.gone[devs[i].ID]
		delete(g.gone, devs[i].ID)
		if d, ok := was[devs[i].ID]; ok && !wasGone {
			devs[i].Healthy, devs[i].Reason = d.Healthy, d.Reason
			continue
		}
		devs[i].Healthy, devs[i].Reason = false, health.ReasonRelaidOut
	}
	for _, d := range old {
		if now[d.ID] {
			continue
		}
		if held == nil || !held(g.srv.Resource(), d.ID) {
			delete(g.gone, d.ID)
			continue
		}
		if !g.gone[d.ID] {
			f.log.Warn("MIG device removed from the layout while a pod holds it; listed Unhealthy until the pod ends", "resource", g.srv.Resource(), "device", d.ID)
		}
		g.gone[d.ID] = true
		d.Healthy, d.Reason = false, ReasonGone
		devs = append(devs, d)
	}
	return devs
}

// Prune drops the devices Relayout kept for the pods holding them once
// held says none does, and returns how many are still kept.
func (f *FrontEnd) Prune(held Held) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	left := 0
	for _, g := range f.gpus {
		if len(g.gone) == 0 {
			continue
		}
		// Drop changes the list in one step with health, which the
		// watcher may be changing meanwhile.
		g.srv.Drop(func(id string) bool {
			if !g.gone[id] || held != nil && held(g.srv.Resource(), id) {
				return false
			}
			delete(g.gone, id)
			f.log.Info("MIG device removed from the layout is free; no longer listed", "resource", g.srv.Resource(), "device", id)
			return true
		})
		left += len(g.gone)
	}
	return left
}

// Served is how each unit taken is served: the resource and device IDs
// the kubelet knows it by.
func (f *FrontEnd) Served() []layout.Served {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.served
}

// ServeGPUs serves every GPU resource until ctx ends, and those a later
// layout adds as it adds them; the first to fail ends all.
func (f *FrontEnd) ServeGPUs(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	for {
		f.mu.Lock()
		start := f.start
		f.start = nil
		f.mu.Unlock()
		for _, s := range start {
			wg.Go(func() {
				if err := s.Run(ctx); err != nil {
					select {
					case errc <- socketAdvice(err):
					default:
					}
					cancel()
				}
			})
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			select {
			case err := <-errc:
				return err
			default:
				return nil
			}
		case <-f.wake:
		}
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

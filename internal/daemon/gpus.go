package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/draslice"
)

// gpuServed is what a GPU front-end serves: the units health is watched
// for (whole GPUs and MIG devices) and where their health goes.
type gpuServed struct {
	notify health.Notifier
	units  []servedUnit
}

// servedUnit is one whole GPU or MIG device as served: the resource and
// device IDs (one per time-slicing replica) the kubelet knows it by, and
// its name in this node's DRA pool.
type servedUnit struct {
	unit     gpu.Unit
	resource string
	ids      []string
	draName  string
}

// parts are the MIG devices health is reported for, by GPU position.
func (s *gpuServed) parts(n int) [][]health.Part {
	out := make([][]health.Part, n)
	for _, u := range s.units {
		if m := u.unit.MIG; m != nil && u.unit.Pos < n {
			out[u.unit.Pos] = append(out[u.unit.Pos], health.Part{ID: m.UUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance})
		}
	}
	return out
}

// recorder describes every unit to m and returns the recorder the health
// watcher reports through: each unit under the resource it is served as.
func (s *gpuServed) recorder(m *metrics.Metrics) health.Recorder {
	rec := recorderMux{}
	for _, u := range s.units {
		g := u.unit.GPU
		info := metrics.DeviceInfo{
			UUID: u.unit.UUID(), Index: strconv.Itoa(g.Index), Model: g.Name, PCIBusID: g.PCIBusID, NUMANode: g.NUMANode,
			DRAName: u.draName,
		}
		if mig := u.unit.MIG; mig != nil {
			info.Index += ":" + strconv.Itoa(mig.Index)
			info.Model += " MIG " + mig.Profile
		}
		m.SetInfo(u.resource, info.UUID, info)
		rec[info.UUID] = m.For(u.resource)
	}
	return rec
}

// recorderMux passes each device's health to its resource's recorder.
type recorderMux map[string]health.Recorder

func (r recorderMux) Health(id string, healthy bool, reason string) {
	if rec, ok := r[id]; ok {
		rec.Health(id, healthy, reason)
	}
}

func (r recorderMux) Transition(id string, healthy bool, reason string) {
	if rec, ok := r[id]; ok {
		rec.Transition(id, healthy, reason)
	}
}

// draUnits are the units the DRA front-end publishes (layout.DRAUnits),
// each under its DRA device name.
func draUnits(gpus []nvml.GPU) []servedUnit {
	var out []servedUnit
	for _, u := range layout.DRAUnits(gpus) {
		out = append(out, servedUnit{unit: u, resource: gpu.ResourceName, draName: draName(u)})
	}
	return out
}

// draName is the unit's device name in this node's DRA pool.
func draName(u gpu.Unit) string {
	if u.MIG != nil {
		return draslice.MIGDeviceName(u.GPU, *u.MIG)
	}
	return draslice.GPUDeviceName(u.GPU)
}

// gpuPlugin serves the GPUs through the device-plugin API: one server per
// resource the MIG strategy and time-slicing lay out (nvidia.com/gpu,
// nvidia.com/mig-<profile>, renamed shared resources).
type gpuPlugin struct {
	cfg  config.Config
	log  *slog.Logger
	srvs []*deviceplugin.Server
}

func (p *gpuPlugin) take(inv *nvml.Inventory, specs *ondisk.GPU) (*gpuServed, error) {
	var cs gpu.CDISpecs
	if specs != nil {
		cs = specs
	}
	node, err := layout.GPUs(p.cfg, inv, cs, p.log)
	if err != nil {
		return nil, err
	}
	router := unitRouter{}
	served := &gpuServed{notify: router}
	srvOf := map[string]*deviceplugin.Server{}
	for _, r := range node.Resources {
		srv, err := deviceplugin.New(deviceplugin.Options{
			ResourceName: r.Name,
			SocketDir:    p.cfg.DevicePluginDir,
			Backend:      r.Res,
			Log:          p.log,
		})
		if err != nil {
			return nil, err
		}
		srv.SetDevices(r.Res.Devices())
		p.srvs = append(p.srvs, srv)
		srvOf[r.Name] = srv
		p.log.Info("serving GPU resource", "resource", r.Name, "units", len(r.Res.Units()), "devices", len(r.Res.Devices()))
	}
	for _, sv := range node.Units() {
		router[sv.Unit.UUID()] = append(router[sv.Unit.UUID()], route{srvOf[sv.Resource], sv.IDs})
		served.units = append(served.units, servedUnit{unit: sv.Unit, resource: sv.Resource, ids: sv.IDs, draName: draName(sv.Unit)})
	}
	return served, nil
}

// run serves every resource until ctx ends; the first to fail ends all.
func (p *gpuPlugin) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(p.srvs))
	for _, s := range p.srvs {
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

// socketAdvice says what to do when the device-plugin directory cannot be
// written: the kubelet's is root's.
func socketAdvice(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: run as root, or set devicePluginDir (--device-plugin-dir) to a directory this user may write", err)
	}
	return err
}

// absent: the resources register once NVML loads.
func (p *gpuPlugin) absent(context.Context) {}

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

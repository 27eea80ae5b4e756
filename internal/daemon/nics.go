package daemon

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/draslice"
)

// nicFront is what serves the NIC pools to the kubelet: a device-plugin
// server per pool, or the DRA driver.
type nicFront interface {
	// setDevices passes on a pool's devices; first is the scan at start.
	setDevices(p *nic.Pool, devs []device.Device, first bool)
	run(ctx context.Context) error
}

// nicServer serves every configured NIC pool and rescans sysfs at
// cfg.NICRescanInterval: hot-plugged NICs join their pool, removed or
// failed ones turn unhealthy. A pool that starts empty is served anyway,
// so NICs that arrive later can join it. rescan runs on one goroutine only
// (start, then run's loop); Allocate runs on the servers'.
type nicServer struct {
	cfg     config.Config
	scanner *sysfs.NICScanner
	pools   *nic.Pools
	front   nicFront
	specs   *ondisk.Store
	recs    map[*nic.Pool]health.Recorder // nil without metrics
	mets    *metrics.Metrics              // nil without metrics
	log     *slog.Logger

	// info holds the CNI device-information files; infoMu serialises
	// Allocate's writes with rescan's refreshes, so the last file written
	// is from the latest scan.
	info   devinfo.Dir
	infoMu sync.Mutex

	failing bool
	// scanned, when set, is given every successful scan's updates
	// (health reporting to the API server).
	scanned func([]nic.Update)
	// healthy is each pool's device health as last recorded in metrics.
	healthy map[*nic.Pool]map[string]nicHealth
}

// nicHealth is a NIC's health as last recorded in metrics.
type nicHealth struct {
	healthy bool
	reason  string
}

// newNICServer builds the pools; front makes their front-end.
func newNICServer(cfg config.Config, specs *ondisk.Store, mets *metrics.Metrics, front func(*nicServer) (nicFront, error), log *slog.Logger) (*nicServer, error) {
	pools, err := nic.NewPools(cfg.NICResources, nic.Options{DevRoot: cfg.DevRoot, Strategies: cfg.DeviceListStrategy, Log: log})
	if err != nil {
		return nil, fmt.Errorf("NIC pools: %w", err)
	}
	s := &nicServer{
		cfg:     cfg,
		scanner: sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: cfg.SysfsRoot, ProcRoot: cfg.ProcRoot, Log: log}),
		pools:   pools,
		specs:   specs,
		recs:    map[*nic.Pool]health.Recorder{},
		mets:    mets,
		log:     log,
		info:    devinfo.Dir{Path: cfg.DeviceInfoDir},
		healthy: map[*nic.Pool]map[string]nicHealth{},
	}
	for _, p := range pools.All() {
		if mets != nil {
			s.recs[p] = mets.For(p.Resource())
		}
		s.healthy[p] = map[string]nicHealth{}
	}
	if s.front, err = front(s); err != nil {
		return nil, err
	}
	return s, nil
}

// serveNICs serves the NIC pools until ctx ends.
func serveNICs(ctx context.Context, cfg config.Config, specs *ondisk.Store, mets *metrics.Metrics, front func(*nicServer) (nicFront, error), log *slog.Logger) error {
	s, err := newNICServer(cfg, specs, mets, front, log)
	if err != nil {
		return err
	}
	s.rescan(true)
	return s.run(ctx)
}

// rescan folds a fresh scan into the pools and passes the result on: CDI
// specs, device lists, metrics and device-information files. first is the
// scan at start.
func (s *nicServer) rescan(first bool) {
	scan, err := s.scanner.Scan()
	if err != nil {
		// Keep what is served: a failed scan says nothing about the
		// NICs. Said once per run of failures, not every interval.
		if !s.failing {
			s.log.Warn("scanning NICs failed; keeping the last state and retrying", "err", err, "every", s.cfg.NICRescanInterval.String())
		}
		s.failing = true
		return
	}
	if s.failing {
		s.log.Info("scanning NICs works again")
		s.failing = false
	}
	updates := s.pools.Rescan(scan)
	for _, u := range updates {
		// The spec first, on every scan: the kubelet may hand out a CDI
		// name as soon as it sees the device, and what a NIC's name
		// stands for (its uverbsN after a driver rebind) changes without
		// any change to the device list. The writer skips identical bytes.
		if s.specs != nil {
			if spec, err := u.Pool.CDISpec(); err != nil {
				s.log.Error("building CDI spec", "resource", u.Pool.Resource(), "err", err)
			} else {
				s.specs.Publish(u.Pool.Resource(), spec)
			}
		}
		s.record(u.Pool, u.Devices, first)
		if u.Changed || first {
			s.front.setDevices(u.Pool, u.Devices, first)
		}
		if first {
			s.log.Info("NIC pool", "resource", u.Pool.Resource(), "devices", len(u.Devices))
		}
	}
	if s.scanned != nil {
		s.scanned(updates)
	}
	s.syncDeviceInfo(scan, first)
}

// record passes health to the pool's metrics: every device's at first
// sight and at each change of state or reason, and a transition at each
// change of state. The facts of every member go too, at every scan: a
// driver rebind can change them.
func (s *nicServer) record(p *nic.Pool, devs []device.Device, first bool) {
	rec := s.recs[p]
	if rec == nil {
		return
	}
	for _, n := range p.NICs() {
		s.mets.SetInfo(p.Resource(), n.Address, nicInfo(n))
	}
	seen := s.healthy[p]
	for _, d := range devs {
		now := nicHealth{healthy: d.Healthy, reason: d.Reason}
		was, known := seen[d.ID]
		if known && was == now {
			continue
		}
		rec.Health(d.ID, d.Healthy, d.Reason)
		if known && !first && was.healthy != d.Healthy {
			rec.Transition(d.ID, d.Healthy, d.Reason)
		}
		seen[d.ID] = now
	}
}

// nicInfo is a NIC's gpu_device_plugin_device_info: no UUID or index,
// and its PCI IDs as the model.
func nicInfo(n sysfs.NIC) metrics.DeviceInfo {
	return metrics.DeviceInfo{
		Model: n.Vendor + ":" + n.Device, PCIBusID: n.Address, NUMANode: n.NUMANode,
		DRAName: draslice.NICDeviceName(n.Address),
	}
}

// syncDeviceInfo removes stale device-information files of our resources
// (at start, those of NICs the scan does not list; later, those of NICs
// in no pool) and rewrites the existing files of present NICs whose facts
// changed (an RDMA device renamed by a driver rebind).
func (s *nicServer) syncDeviceInfo(scan []sysfs.NIC, first bool) {
	present := map[string]bool{}
	for _, n := range scan {
		present[n.Address] = true
	}
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	keep := map[string][]string{}
	for _, p := range s.pools.All() {
		ids := []string{}
		for _, n := range p.NICs() {
			if !present[n.Address] {
				if !first {
					ids = append(ids, n.Address) // still allocated, maybe
				}
				continue
			}
			ids = append(ids, n.Address)
			if s.info.Exists(p.Resource(), n.Address) {
				if _, err := s.info.Write(p.Resource(), n); err != nil {
					s.log.Warn("refreshing device information for CNI plugins", "resource", p.Resource(), "device", n.Address, "err", err)
				}
			}
		}
		keep[p.Resource()] = ids
	}
	removed, err := s.info.Prune(keep)
	for _, f := range removed {
		s.log.Info("removed stale device information file", "path", f)
	}
	if err != nil {
		s.log.Warn("removing stale device information files", "dir", s.info.Path, "err", err)
	}
}

func (s *nicServer) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Go(func() {
		if err := s.front.run(ctx); err != nil {
			errc <- err
			cancel()
		}
	})
	tick := time.NewTicker(s.cfg.NICRescanInterval.Duration)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			select {
			case err := <-errc:
				return err
			default:
				return nil
			}
		case <-tick.C:
			s.rescan(false)
		}
	}
}

// nicPlugins serves each pool on its own device-plugin socket.
type nicPlugins map[*nic.Pool]*deviceplugin.Server

func newNICPlugins(s *nicServer) (nicFront, error) {
	out := nicPlugins{}
	for _, p := range s.pools.All() {
		srv, err := deviceplugin.New(deviceplugin.Options{ResourceName: p.Resource(), SocketDir: s.cfg.DevicePluginDir, Backend: nicBackend{pool: p, s: s}, Log: s.log})
		if err != nil {
			return nil, err
		}
		out[p] = srv
	}
	return out, nil
}

func (ps nicPlugins) setDevices(p *nic.Pool, devs []device.Device, _ bool) { ps[p].SetDevices(devs) }

func (ps nicPlugins) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(ps))
	for _, srv := range ps {
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

var (
	_ deviceplugin.Backend            = nicBackend{}
	_ deviceplugin.PreferredAllocator = nicBackend{}
)

// nicBackend is a pool as its server's backend: the pool's answer, plus
// the device-information file of each allocated NIC, which Multus reads
// when it creates the pod's sandbox, after Allocate.
type nicBackend struct {
	pool *nic.Pool
	s    *nicServer
}

// Allocate fails when a file cannot be written: a pod whose secondary
// network would come up without its device information is worse than one
// the kubelet retries.
func (b nicBackend) Allocate(ids []string) (*device.Answer, error) {
	// No CDI name nothing defines (read-only or full spec dir).
	if err := b.s.specs.Unwritten(b.pool.Resource()); err != nil {
		return nil, err
	}
	resp, err := b.pool.Allocate(ids)
	if err != nil {
		return nil, err
	}
	b.s.infoMu.Lock()
	defer b.s.infoMu.Unlock()
	nics := b.pool.NICs()
	for _, id := range ids {
		i, found := slices.BinarySearchFunc(nics, id, func(n sysfs.NIC, id string) int { return cmp.Compare(n.Address, id) })
		if !found {
			return nil, fmt.Errorf("%w %q in %s", nic.ErrUnknownNIC, id, b.pool.Resource())
		}
		if _, err := b.s.info.Write(b.pool.Resource(), nics[i]); err != nil {
			return nil, fmt.Errorf("device information for CNI plugins of %s in %s: %w", id, b.pool.Resource(), err)
		}
	}
	return resp, nil
}

func (b nicBackend) Preferred(available, mustInclude []string, size int) ([]string, error) {
	return b.pool.Preferred(available, mustInclude, size)
}

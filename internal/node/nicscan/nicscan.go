package nicscan

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
)

// Front is the front-end the pools' devices go to.
type Front interface {
	// SetNICDevices passes on a pool's devices; first is the scan at start.
	SetNICDevices(p *nic.Pool, devs []device.Device, first bool)
	// ServeNICs serves the pools until ctx ends. It is called after the
	// first scan, so the first the kubelet hears is what is there.
	ServeNICs(ctx context.Context) error
}

// Recorder takes the pools' members for the plugin's metrics.
type Recorder interface {
	// Pool is where the health of resource's devices goes.
	Pool(resource string) health.Recorder
	// NIC records a member's facts under resource.
	NIC(resource string, n sysfs.NIC)
}

// Options are where a Scanner scans and what it passes each scan on to.
type Options struct {
	// SysfsRoot and ProcRoot are the host's roots the NICs are read under.
	SysfsRoot, ProcRoot string
	// Interval is how often Run rescans (nicRescanInterval); required.
	Interval time.Duration

	Front   Front         // required
	Specs   *ondisk.Store // nil without CDI
	Metrics Recorder      // nil without metrics
	// Info holds the CNI device-information files, shared with the
	// front-end's Allocate.
	Info *devinfo.Locked // required
	// Scanned, when set, is given every successful scan's updates
	// (health reporting to the API server).
	Scanned func([]nic.Update)
	// Turned, when set, is called after every scan of Run, failed or
	// not: the plugin's liveness, which a scan stuck in sysfs stops.
	Turned func()
	Log    *slog.Logger
}

// Scanner serves every configured NIC pool and rescans sysfs at
// Options.Interval: hot-plugged NICs join their pool, removed or
// failed ones turn unhealthy. A pool that starts empty is served anyway,
// so NICs that arrive later can join it. Rescan runs on one goroutine only
// (Run's); Allocate runs on the front-end's.
type Scanner struct {
	scanner *sysfs.NICScanner
	pools   *nic.Pools
	o       Options
	recs    map[*nic.Pool]health.Recorder // nil without metrics
	log     *slog.Logger

	failing bool
	// healthy is each pool's device health as last recorded in metrics.
	healthy map[*nic.Pool]map[string]nicHealth
}

// nicHealth is a NIC's health as last recorded in metrics.
type nicHealth struct {
	healthy bool
	reason  string
}

// New keeps pools (nic.NewPools, before their first scan) in step with
// sysfs.
func New(pools *nic.Pools, o Options) *Scanner {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Scanner{
		scanner: sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: o.SysfsRoot, ProcRoot: o.ProcRoot, Log: log}),
		pools:   pools,
		o:       o,
		recs:    map[*nic.Pool]health.Recorder{},
		log:     log,
		healthy: map[*nic.Pool]map[string]nicHealth{},
	}
	for _, p := range pools.All() {
		if o.Metrics != nil {
			s.recs[p] = o.Metrics.Pool(p.Resource())
		}
		s.healthy[p] = map[string]nicHealth{}
	}
	return s
}

// Pools are the configured pools, in the order of nicResources.
func (s *Scanner) Pools() []*nic.Pool { return s.pools.All() }

// Rescan folds a fresh scan into the pools and passes the result on: CDI
// specs, device lists, metrics and device-information files. first is the
// scan at start.
func (s *Scanner) Rescan(first bool) {
	scan, err := s.scanner.Scan()
	if err != nil {
		// Keep what is served: a failed scan says nothing about the
		// NICs. Said once per run of failures, not every interval.
		if !s.failing {
			s.log.Warn("scanning NICs failed; keeping the last state and retrying", "err", err, "every", s.o.Interval.String())
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
		if s.o.Specs != nil {
			if spec, err := u.Pool.CDISpec(); err != nil {
				s.log.Error("building CDI spec", "resource", u.Pool.Resource(), "err", err)
			} else {
				s.o.Specs.Publish(u.Pool.Resource(), spec)
			}
		}
		s.record(u.Pool, u.Devices, first)
		if u.Changed || first {
			s.o.Front.SetNICDevices(u.Pool, u.Devices, first)
		}
		if first {
			s.log.Info("NIC pool", "resource", u.Pool.Resource(), "devices", len(u.Devices))
		}
	}
	if s.o.Scanned != nil {
		s.o.Scanned(updates)
	}
	s.syncDeviceInfo(scan, first)
}

// record passes health to the pool's metrics: every device's at first
// sight and at each change of state or reason, and a transition at each
// change of state. The facts of every member go too, at every scan: a
// driver rebind can change them.
func (s *Scanner) record(p *nic.Pool, devs []device.Device, first bool) {
	rec := s.recs[p]
	if rec == nil {
		return
	}
	for _, n := range p.NICs() {
		s.o.Metrics.NIC(p.Resource(), n)
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

// syncDeviceInfo removes stale device-information files of our resources
// (at start, those of NICs the scan does not list; later, those of NICs
// in no pool) and rewrites the existing files of present NICs whose facts
// changed (an RDMA device renamed by a driver rebind).
func (s *Scanner) syncDeviceInfo(scan []sysfs.NIC, first bool) {
	present := map[string]bool{}
	for _, n := range scan {
		present[n.Address] = true
	}
	_ = s.o.Info.With(func(info devinfo.Dir) error {
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
				if info.Exists(p.Resource(), n.Address) {
					if _, err := info.Write(p.Resource(), n); err != nil {
						s.log.Warn("refreshing device information for CNI plugins", "resource", p.Resource(), "device", n.Address, "err", err)
					}
				}
			}
			keep[p.Resource()] = ids
		}
		removed, err := info.Prune(keep)
		for _, f := range removed {
			s.log.Info("removed stale device information file", "path", f)
		}
		if err != nil {
			s.log.Warn("removing stale device information files", "dir", info.Path, "err", err)
		}
		return nil
	})
}

// Run scans at start, has the front-end serve the pools, and rescans every
// Options.Interval until ctx ends or the front-end fails.
func (s *Scanner) Run(ctx context.Context) error {
	s.Rescan(true)
	s.turned()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Go(func() {
		if err := s.o.Front.ServeNICs(ctx); err != nil {
			errc <- err
			cancel()
		}
	})
	tick := time.NewTicker(s.o.Interval)
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
			s.Rescan(false)
			s.turned()
		}
	}
}

func (s *Scanner) turned() {
	if s.o.Turned != nil {
		s.o.Turned()
	}
}

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/deviceplugin"
	"github.com/gpu-device-plugin/gpu-device-plugin/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs"
)

// serveNICs serves every configured NIC pool, each on its own socket, and
// rescans sysfs at cfg.NICRescanInterval: hot-plugged NICs join their
// pool, removed or failed ones turn unhealthy. A pool that starts empty is
// served anyway, so NICs that arrive later can join it.
func serveNICs(ctx context.Context, cfg config.Config, specs *specStore, log *slog.Logger) error {
	scanner := sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: cfg.SysfsRoot, ProcRoot: cfg.ProcRoot, Log: log})
	pools, err := nic.NewPools(cfg.NICResources, nic.Options{DevRoot: cfg.DevRoot, Strategies: cfg.DeviceListStrategy, Log: log})
	if err != nil {
		return fmt.Errorf("NIC pools: %w", err)
	}
	servers := map[*nic.Pool]*deviceplugin.Server{}
	for _, p := range pools.All() {
		srv, err := deviceplugin.New(deviceplugin.Options{ResourceName: p.Resource(), SocketDir: cfg.DevicePluginDir, Backend: p, Log: log})
		if err != nil {
			return err
		}
		servers[p] = srv
	}
	failing := false
	rescan := func(first bool) {
		scan, err := scanner.Scan()
		if err != nil {
			// Keep what is served: a failed scan says nothing about the
			// NICs. Said once per run of failures, not every interval.
			if !failing {
				log.Warn("scanning NICs failed; keeping the last state and retrying", "err", err, "every", cfg.NICRescanInterval.String())
			}
			failing = true
			return
		}
		if failing {
			log.Info("scanning NICs works again")
			failing = false
		}
		for _, u := range pools.Rescan(scan) {
			if !u.Changed && !first {
				continue
			}
			// The spec first: the kubelet may hand out a CDI name as soon
			// as it sees the device.
			if specs != nil {
				if spec, err := u.Pool.CDISpec(); err != nil {
					log.Error("building CDI spec", "resource", u.Pool.Resource(), "err", err)
				} else {
					specs.publish(u.Pool.Resource(), spec)
				}
			}
			servers[u.Pool].SetDevices(u.Devices)
			if first {
				log.Info("NIC pool", "resource", u.Pool.Resource(), "devices", len(u.Devices))
			}
		}
	}
	rescan(true)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(servers))
	for _, srv := range servers {
		wg.Go(func() {
			if err := srv.Run(ctx); err != nil {
				errc <- fmt.Errorf("serving %s: %w", srv.Resource(), err)
				cancel()
			}
		})
	}
	tick := time.NewTicker(cfg.NICRescanInterval.Duration)
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
			rescan(false)
		}
	}
}

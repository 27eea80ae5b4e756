package daemon

import (
	"context"
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/nicscan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
)

// serveNICs serves the NIC pools through fe, rescanning them until ctx
// ends. rep is nil without reporting.
func serveNICs(ctx context.Context, cfg config.Config, specs *ondisk.Store, mets *metrics.Metrics, info *devinfo.Locked, fe FrontEnd, rep *reporting, status *probe.Status, log *slog.Logger) error {
	pools, err := NICPools(cfg, log)
	if err != nil {
		return err
	}
	o := NICScan(cfg)
	o.Front, o.Specs, o.Info, o.Log = fe, specs, info, log
	if mets != nil {
		o.Metrics = mets.NICs()
	}
	o.Turned = func() {
		status.Gate(gateNICs, "")
		status.Turned(loopNICScan, cfg.NICRescanInterval.Duration)
	}
	if rep != nil {
		o.Scanned = rep.nicScan
	}
	s := nicscan.New(pools, o)
	if err := fe.TakeNICPools(s.Pools()); err != nil {
		return err
	}
	return s.Run(ctx)
}

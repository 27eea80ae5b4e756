package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
)

// mpsDaemons runs the MPS control daemons of the units shared through MPS
// until ctx ends (they stay up after, for the next process to adopt), and
// returns the notifier that holds each such GPU down while its daemon is.
// With none, daemons an earlier run left are stopped; a daemon is run
// confined in the driver root (package mpsexec), through this executable.
func mpsDaemons(ctx context.Context, cfg config.Config, lib nvml.Library, fe FrontEnd, units []servedUnit, next health.Notifier, mets *metrics.Metrics, log *slog.Logger) (health.Notifier, func(context.Context), *mpsd.Manager, error) {
	if c, ok := fe.(mpsClaims); ok {
		m, err := mpsManager(cfg, lib, log)
		if err != nil {
			return nil, nil, nil, err
		}
		// The GPUs are gated as claims start their daemons.
		gate := mpsd.NewGate(next, m, nil)
		if mets != nil {
			mets.SetMPSDaemons(m.Up)
		}
		self, err := os.Executable()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("finding this executable, which runs nvidia-smi confined: %w", err)
		}
		timeSlice := func(ctx context.Context, uuid string, level int) (string, error) {
			return mpsexec.SetTimeSlice(ctx, self, cfg.DriverRoot, cfg.DevRoot, uuid, level)
		}
		return gate, func(ctx context.Context) {
			c.UseSharing(ctx, m, timeSlice)
			gate.Run(ctx)
		}, m, nil
	}
	var gpus []mpsd.GPU
	var uuids []string
	for _, su := range units {
		u := su.unit
		if !u.MPS {
			continue
		}
		// The daemon holds every client to the most shares a container
		// may hold (one by default), whatever its environment says.
		g := mpsd.GPU{UUID: u.UUID(), Replicas: u.Replicas, MaxShares: MPS(cfg).SharesPerContainer(), Memory: u.GPU.MemoryBytes}
		gpus, uuids = append(gpus, g), append(uuids, g.UUID)
	}
	m, err := mpsManager(cfg, lib, log)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(gpus) == 0 {
		m.Set(ctx, nil) // what an earlier run left
		return next, nil, nil, nil
	}
	log.Info("sharing GPUs through MPS; each is offered once its control daemon is up", "gpus", len(gpus), "mpsRoot", cfg.MPSRoot)
	gate := mpsd.NewGate(next, m, uuids)
	if mets != nil {
		mets.SetMPSDaemons(m.Up)
	}
	run := func(ctx context.Context) {
		m.Set(ctx, gpus)
		gate.Run(ctx)
	}
	return gate, run, m, nil
}

// mpsClaims is a front-end whose claims start and stop MPS daemons and
// set GPUs' time-slice intervals (DRA).
type mpsClaims interface {
	UseSharing(ctx context.Context, m *mpsd.Manager, timeSlice func(ctx context.Context, uuid string, level int) (string, error))
}

// mpsManager is the manager of the MPS control daemons under cfg's
// mpsRoot, run through this executable, and started through the MPS
// launcher when cfg names one; lib sets compute modes (nil: not set).
func mpsManager(cfg config.Config, lib nvml.Library, log *slog.Logger) (*mpsd.Manager, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("MPS: finding this executable, which runs the control daemons confined: %w", err)
	}
	o := mpsd.Options{
		Binary:  mpsexec.DefaultBinary,
		Root:    cfg.MPSRoot,
		ShmSize: cfg.MPSShmBytes(),
		// The servers the daemons this process started left, in its PID
		// namespace; or the launcher's, which sees the host's.
		Servers: func(uuid string) ([]int, error) {
			if cfg.MPSLauncherSocket == "" {
				return mpsd.ProcServers("/proc", uuid)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return launcher.Servers(ctx, cfg.MPSLauncherSocket, uuid)
		},
		Command: func(ctx context.Context, dirs mpsd.Dirs, env []string, args ...string) (*exec.Cmd, error) {
			if cfg.MPSLauncherSocket != "" && slices.Equal(args, []string{"-d"}) {
				// The daemon is forked in the launcher's process tree,
				// which a plugin restart leaves running.
				return launcher.Command(ctx, self, cfg.MPSLauncherSocket, env)
			}
			// Located at each run: a driver installed later is found.
			s, err := mpsexec.Locate(cfg.DriverRoot)
			if err != nil {
				return nil, err
			}
			s.DevRoot, s.Pipe, s.Log, s.Shm = cfg.DevRoot, dirs.Pipe, dirs.Log, dirs.Shm
			s.Env, s.Args = append(s.Env, env...), args
			return mpsexec.Command(ctx, self, s)
		},
		Log: log,
	}
	if lib != nil {
		o.ComputeMode = func(uuid string, exclusive bool) error { return nvml.SetComputeMode(lib, uuid, exclusive) }
		o.IsExclusive = func(uuid string) (bool, error) { return nvml.IsExclusive(lib, uuid) }
	}
	return mpsd.New(o), nil
}

// MPSStatus asks the MPS control daemons of the GPUs with uuids, which a
// serving plugin runs, what they say of themselves (list shows it).
func MPSStatus(cfg config.Config, uuids []string, log *slog.Logger) (map[string]mpsd.Status, error) {
	m, err := mpsManager(cfg, nil, log)
	if err != nil {
		return nil, err
	}
	out := make(map[string]mpsd.Status, len(uuids))
	for _, id := range uuids {
		out[id] = m.Query(id)
	}
	return out, nil
}

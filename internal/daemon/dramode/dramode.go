// Package dramode connects the DRA front-end to daemon: it builds the
// front-end's settings from the configuration and hands daemon the
// front-end through daemon.WithDRA. It is apart from daemon so that only
// gpu-device-plugin-dra (and the test lanes) link package dra and the
// Kubernetes client; it holds wiring only.
package dramode

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/imexd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra"
)

// With is the daemon option that serves through DRA: dra.NewFrontEnd with
// opts, given the settings of the configuration daemon runs with.
func With(opts ...dra.FrontEndOption) daemon.Option {
	start := dra.NewFrontEnd(opts...)
	return daemon.WithDRA(func(ctx context.Context, cfg config.Config, specs *ondisk.Store, log *slog.Logger) (*dra.FrontEnd, error) {
		s, err := Settings(cfg)
		if err != nil {
			return nil, err
		}
		if s.IMEXDaemons, err = imexDaemons(cfg, log); err != nil {
			return nil, err
		}
		return start(ctx, s, specs, log)
	})
}

// Settings are the settings the DRA front-end takes. It fails only when
// the Node's name is neither set nor the host's.
func Settings(c config.Config) (dra.Settings, error) {
	node, err := c.Node()
	if err != nil {
		return dra.Settings{}, fmt.Errorf("DRA: %w", err)
	}
	return dra.Settings{
		DriverName:         config.DRADriverName,
		FieldManager:       config.FieldManager,
		Node:               node,
		Kubeconfig:         c.Kubeconfig,
		PluginDir:          c.DRAPluginDir,
		PluginRegistryDir:  c.PluginRegistryDir,
		PodUID:             c.PodUID,
		DeviceMetadata:     c.DRADeviceMetadata,
		CDISpecDir:         c.CDISpecDir,
		PodResourcesSocket: c.PodResourcesSocket,
		SysfsRoot:          c.SysfsRoot,
		DevRoot:            c.DevRoot,
		ProcRoot:           c.ProcRoot,
		MPSRoot:            c.MPSRoot,
		NICPools:           len(c.NICResources),
		IgnoredTimeSlicing: len(c.Sharing.TimeSlicing.Resources),
		MemoryShares:       daemon.MemoryShares(c),
		MIGPartitioned:     daemon.MIGPartitioned(c),
		IMEXNodeIP:         c.IMEX.NodeIP,
	}, nil
}

// imexDaemons are the node's nvidia-imex daemons when imex.computeDomains
// is on, their files under the plugin directory, run confined through this
// executable; nil when off.
func imexDaemons(c config.Config, log *slog.Logger) (dra.IMEXDaemons, error) {
	if !c.IMEX.ComputeDomains {
		return nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("ComputeDomains: finding this executable, which runs nvidia-imex confined: %w", err)
	}
	return imexd.New(imexd.Options{
		Dir:        filepath.Join(c.DRAPluginDir, "compute-domains"),
		BindIP:     c.IMEX.NodeIP,
		DriverRoot: c.DriverRoot,
		DevRoot:    c.DevRoot,
		Self:       self,
		Log:        log.With("component", "imexd"),
	}), nil
}

package main

import (
	"io"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/daemon"
)

func serve(c *cli.Context, open daemon.OpenFunc, stderr io.Writer) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	log.Info("starting gpu-device-plugin", "version", version, "commit", commit,
		"devicePluginDir", cfg.DevicePluginDir, "driverRoot", cfg.DriverRoot, "deviceIDStrategy", cfg.DeviceIDStrategy)
	err = daemon.Run(c.Context, cfg, open, log)
	log.Info("stopped")
	return err
}

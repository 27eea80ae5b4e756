package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
)

// mpsLauncherCommand runs the MPS launcher: the process tree the MPS
// control daemons live in, apart from the plugin's (package launcher).
func mpsLauncherCommand(stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "mps-launcher",
		Usage: "start the MPS control daemons the plugin asks for on --mps-launcher-socket, so that they outlive a plugin restart (run as a DaemonSet of its own)",
		Flags: settingFlags(launcherKeys...),
		Action: noArgs(func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			if cfg.MPSLauncherSocket == "" {
				return errors.New("mps-launcher: set --mps-launcher-socket (the plugin's mpsLauncherSocket), where it listens")
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("mps-launcher: finding this executable, which runs the control daemons confined: %w", err)
			}
			log := commandLogger(cfg, stderr)
			log.Info("starting the MPS launcher", "version", version, "commit", commit)
			return launcher.New(launcher.Options{
				Socket: cfg.MPSLauncherSocket, Root: cfg.MPSRoot, DriverRoot: cfg.DriverRoot, DevRoot: cfg.DevRoot, Self: self, Log: log,
			}).Serve(c.Context)
		}),
	}
}

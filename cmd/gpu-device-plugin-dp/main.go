// Command gpu-device-plugin-dp serves the node's GPUs and NIC pools
// through the kubelet's device-plugin API. `gpu-device-plugin serve`
// starts it in device-plugin mode (kubeletAPI: device-plugin, the
// default), replacing itself, with the configuration it resolved; it is
// not meant to be run by hand. It is a program of its own so that the
// daemon links neither the CLI nor its one-shot commands: urfave/cli's
// help printer runs text/template, whose run-time method lookup keeps
// 2 MB more of code in the executable, all of it resident.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/gcpercent"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/handoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// Set at link time, as for gpu-device-plugin.
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	handoff.RunIfHelper()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		// As serve in its own process says it: the same error line, for
		// whatever reads the pod's log.
		fmt.Fprintln(os.Stderr, "gpu-device-plugin:", err)
		os.Exit(1)
	}
}

// run serves. serve has logged the start line with every setting; this
// line says which executable took over, in case an install mixed releases.
func run(ctx context.Context, args []string) error {
	cfg, err := handoff.Read(args, config.KubeletAPIDevicePlugin)
	if err != nil {
		return err
	}
	log := daemon.NewLogger(cfg, os.Stderr)
	log.Info("serving through the device-plugin API", "executable", handoff.DevicePlugin, "version", version, "commit", commit,
		"gogc", gcpercent.Tune(os.LookupEnv))
	err = daemon.Run(ctx, cfg, nvml.Open, log)
	log.Info("stopped")
	return err
}

// Command gpu-device-plugin-dra serves the node's GPUs and NIC pools
// through Dynamic Resource Allocation. `gpu-device-plugin serve` starts it
// in DRA mode (kubeletAPI: dra), replacing itself, with the configuration
// it resolved; it is not meant to be run by hand. It is a separate program
// so that the device-plugin mode links no Kubernetes client code.
//
// `gpu-device-plugin-dra compute-domain-controller ARGS`, how charts of
// earlier releases ran the ComputeDomain controller, execs
// gpu-device-plugin-controller beside it with ARGS.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/dramode"
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
	if len(os.Args) > 1 && os.Args[1] == controllerCommand {
		// Returns only on failure.
		fail(execController(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	fail(err)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-device-plugin-dra:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg, err := handoff.Read(args, config.KubeletAPIDRA)
	if err != nil {
		return err
	}
	log := daemon.NewLogger(cfg, os.Stderr)
	// As serve does in device-plugin mode.
	gogc := gcpercent.Tune(os.LookupEnv)
	log.Info("starting gpu-device-plugin in DRA mode", "version", version, "commit", commit,
		"driver", config.DRADriverName, "pluginDir", cfg.DRAPluginDir, "driverRoot", cfg.DriverRoot, "gogc", gogc)
	err = daemon.RunWith(ctx, cfg, nvml.Open, log, dramode.With())
	log.Info("stopped")
	return err
}

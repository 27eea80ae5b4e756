package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
)

// probeTimeout bounds one question; the kubelet's timeoutSeconds is the
// outer bound.
const probeTimeout = 5 * time.Second

// probeCommand asks a running plugin, on its healthSocket, whether it is
// live or ready: the chart's liveness and readiness probes run it. It
// exits 0 when so, 1 when not (printing why), 2 on a usage mistake.
func probeCommand(stdout io.Writer) *cli.Command {
	ask := func(name, path, usage string) *cli.Command {
		return &cli.Command{
			Name:   name,
			Usage:  usage,
			Flags:  settingFlags(probeKeys...),
			Action: noArgs(func(c *cli.Context) error { return askPlugin(c, path, stdout) }),
		}
	}
	return &cli.Command{
		Name:  "probe",
		Usage: "ask the running plugin on --health-socket whether it is live or ready; exit 0 when so, 1 when not (the chart's liveness and readiness probes)",
		Subcommands: []*cli.Command{
			ask("live", "livez", "exit 0 while every main loop (GPU health polls, NIC scans) turns in time"),
			ask("ready", "readyz", "exit 0 once the kubelet holds every resource's registration, or the ResourceSlices were published (DRA)"),
		},
		Action: noArgs(func(*cli.Context) error {
			return cli.Exit("probe: say live or ready, e.g. gpu-device-plugin probe ready --health-socket /run/gpu-device-plugin/health.sock", 2)
		}),
	}
}

// askPlugin asks the plugin on healthSocket for path and prints its answer.
func askPlugin(c *cli.Context, path string, stdout io.Writer) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	if cfg.HealthSocket == "" {
		return cli.Exit("probe: set --health-socket to the plugin's healthSocket (the chart uses /run/gpu-device-plugin/health.sock)", 2)
	}
	ctx, cancel := context.WithTimeout(c.Context, probeTimeout)
	defer cancel()
	text, err := probe.Ask(ctx, cfg.HealthSocket, path)
	switch {
	case errors.Is(err, probe.ErrNotOK):
		fmt.Fprintln(stdout, text)
		return cli.Exit("", 1)
	case err != nil:
		return cli.Exit(fmt.Sprintf("probe: %v", err), 1)
	}
	fmt.Fprintln(stdout, text)
	return nil
}

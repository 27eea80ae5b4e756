package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
)

// remediationTimeout bounds one question to the plugin; a release waits
// for the remediation's goroutine, which never waits on a reset.
const remediationTimeout = 10 * time.Second

// remediationCommand asks the running plugin's remediation, on its
// healthSocket as probe does: its status, or a human's release of a GPU
// out for a human or a reboot. Exit 0 when done, 1 when the plugin
// refuses or cannot be asked (the message says why), 2 on a usage
// mistake.
func remediationCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "remediation",
		Usage: "ask the running plugin on --health-socket for its GPUs' remediation, or give a GPU out for a human or a reboot back",
		Subcommands: []*cli.Command{
			{
				Name:   "status",
				Usage:  "every GPU's remediation as the running plugin has it now: state, decision, since, resets, why",
				Flags:  append(settingFlags(probeKeys...), outputFlag()),
				Action: noArgs(func(c *cli.Context) error { return remediationStatus(c, stdout) }),
			},
			{
				Name:      "release",
				Usage:     "give back a GPU in needsHuman or needsReboot once a human has dealt with it: the plugin offers it again and clears its reset budget",
				ArgsUsage: "GPU-<uuid>",
				Flags:     settingFlags(probeKeys...),
				Action:    func(c *cli.Context) error { return remediationRelease(c, stdout) },
			},
		},
		Action: noArgs(func(*cli.Context) error {
			return cli.Exit("remediation: say status or release, e.g. gpu-device-plugin remediation release --health-socket /run/probe/health.sock GPU-<uuid>", 2)
		}),
	}
}

// remediationClient is the client of the plugin on healthSocket.
func remediationClient(c *cli.Context, cmd string) (remediate.Client, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return remediate.Client{}, err
	}
	if cfg.HealthSocket == "" {
		return remediate.Client{}, cli.Exit(cmd+": set --health-socket to the plugin's healthSocket (the chart uses /run/probe/health.sock)", 2)
	}
	return remediate.Client{Socket: cfg.HealthSocket}, nil
}

func remediationRelease(c *cli.Context, stdout io.Writer) error {
	const cmd = "remediation release"
	// Flags after the GPU are not parsed as flags (the CLI stops at the
	// first argument): say where they go rather than take them as GPUs.
	args := c.Args().Slice()
	switch {
	case len(args) > 1 && strings.HasPrefix(args[1], "-"):
		return cli.Exit(fmt.Sprintf("%s: give %s before the GPU: gpu-device-plugin remediation release --health-socket PATH GPU-<uuid>", cmd, args[1]), 2)
	case len(args) != 1 || !strings.HasPrefix(args[0], "GPU-"):
		return cli.Exit(cmd+": name one GPU by its UUID (GPU-…), as list shows it: gpu-device-plugin remediation release --health-socket PATH GPU-<uuid>", 2)
	}
	gpu := args[0]
	client, err := remediationClient(c, cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, remediationTimeout)
	defer cancel()
	st, err := client.Release(ctx, gpu)
	var nt *remedy.NotTerminalError
	switch {
	case errors.As(err, &nt):
		return cli.Exit(fmt.Sprintf("%s: %v; nothing changed", cmd, err), 1)
	case err != nil:
		return cli.Exit(fmt.Sprintf("%s: %v", cmd, err), 1)
	case st.Absent:
		fmt.Fprintf(stdout, "released %s: it was %s (%s) and is not on the node; the plugin forgot it\n", gpu, st.State, st.Reason)
	default:
		fmt.Fprintf(stdout, "released %s: it was %s (%s); it is offered again while health finds it healthy, and its reset budget is cleared\n", gpu, st.State, st.Reason)
	}
	return nil
}

func remediationStatus(c *cli.Context, stdout io.Writer) error {
	const cmd = "remediation status"
	if err := checkOutput(c); err != nil {
		return cli.Exit(cmd+": "+err.Error(), 2)
	}
	client, err := remediationClient(c, cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, remediationTimeout)
	defer cancel()
	all, err := client.Status(ctx)
	if err != nil {
		return cli.Exit(fmt.Sprintf("%s: %v", cmd, err), 1)
	}
	if output, _ := outputFormat(c); output == "json" {
		if all == nil {
			all = []remedy.Status{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(map[string][]remedy.Status{"gpus": all})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tSTATE\tDECISION\tSINCE\tRESETS\tWHY")
	for _, st := range all {
		since := "-"
		if !st.Since.IsZero() {
			since = st.Since.UTC().Format(time.RFC3339)
		}
		gpu := st.GPU
		if st.Absent {
			gpu += " (not on the node)"
		}
		why := st.Reason
		if st.Waiting != "" {
			why = strings.TrimPrefix(why+"; waiting: "+st.Waiting, "; ")
		}
		if st.HeldFor != "" {
			why = strings.TrimPrefix(why+"; held for "+st.HeldFor, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", gpu, st.State, orDash(string(st.Decision)), since, st.Resets, orDash(why))
	}
	return tw.Flush()
}

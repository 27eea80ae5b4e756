package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

func cdiCommand(open daemon.OpenFunc, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:   "cdi",
		Usage:  "CDI specs for the node's devices",
		Action: noArgs(func(c *cli.Context) error { return cli.ShowSubcommandHelp(c) }),
		Subcommands: []*cli.Command{{
			Name:  "generate",
			Usage: "write the CDI specs (GPUs and NIC pools) without serving, e.g. from a node package's install step",
			Flags: append(settingFlags(cdiKeys...), &cli.StringFlag{
				Name: "output", Aliases: []string{"o"},
				Usage: `directory to write to (default: --cdi-spec-dir), or "-" to print the specs`,
			}),
			Action: noArgs(func(c *cli.Context) error { return generateCDI(c, open, stdout, stderr) }),
		}},
	}
}

func generateCDI(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	cfg, log, err := setUp(c, stderr)
	if err != nil {
		return err
	}
	node, err := daemon.Snapshot(c.Context, cfg, open, log, daemon.SnapshotOptions{})
	if err != nil {
		return err
	}
	all, err := daemon.CDISpecs(cfg, node, log)
	if err != nil {
		return err
	}
	out := c.String("output")
	if out == "-" {
		for _, s := range all {
			data, err := cdi.Marshal(s)
			if err != nil {
				return err
			}
			if _, err := stdout.Write(append(data, '\n')); err != nil {
				return err
			}
		}
		return nil
	}
	if out == "" {
		out = cfg.CDISpecDir
	}
	w := cdi.Writer{Dir: out, Owner: cdi.DefaultOwner}
	var keep []string
	for _, s := range all {
		p, err := w.Write(s)
		if err != nil {
			return err
		}
		keep = append(keep, p)
		fmt.Fprintf(stdout, "wrote %s (%d devices)\n", p, len(s.Devices))
	}
	return w.RemoveStale(keep)
}

package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
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
	n, err := lookAtNode(c, open, stderr)
	if err != nil {
		return err
	}
	defer n.lib.Shutdown()
	cfg, log, inv := n.cfg, n.log, n.inv
	gpuSpec, err := ondisk.GPUSpec(daemon.CDIOptions(cfg), inv.GPUs, log)
	if err != nil {
		return fmt.Errorf("building the %s CDI spec: %w", gpu.ResourceName, err)
	}
	all := []*specs.Spec{gpuSpec}
	if len(cfg.NICResources) > 0 {
		_, updates, err := scanPools(cfg, log)
		if err != nil {
			return err
		}
		for _, u := range updates {
			spec, err := u.Pool.CDISpec()
			if err != nil {
				return fmt.Errorf("building the %s CDI spec: %w", u.Pool.Resource(), err)
			}
			if spec != nil {
				all = append(all, spec)
			}
		}
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

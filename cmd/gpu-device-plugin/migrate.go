package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config/nvidia"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

func migrateCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "convert NVIDIA k8s-device-plugin's config file and/or environment variables into this plugin's config (or Helm values)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "from", Usage: "NVIDIA's config file (version: v1)"},
			&cli.BoolFlag{Name: "env", Usage: "also read NVIDIA's environment variables (MIG_STRATEGY, ...) from this environment; they win over --from, as in NVIDIA's plugin"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "config", Usage: "config (our config file) or values (our Helm chart's values)"},
			&cli.StringFlag{Name: "compute-domains", Usage: "a YAML manifest: print it with NVIDIA's ComputeDomains (resource.nvidia.com/v1beta1) rewritten to ours, every other object as it was (docs/compute-domains.md)"},
		},
		Action: noArgs(func(c *cli.Context) error { return migrate(c, stdout, stderr) }),
	}
}

// migrate prints our config for NVIDIA's settings on stdout, and one line
// on stderr for each setting it could not carry over.
func migrate(c *cli.Context, stdout, stderr io.Writer) error {
	if f := c.String("compute-domains"); f != "" {
		if c.String("from") != "" || c.Bool("env") {
			return cli.Exit("migrate: --compute-domains converts a manifest on its own; run it apart from --from and --env", 2)
		}
		return migrateComputeDomains(f, stdout, stderr)
	}
	output := c.String("output")
	if output != "config" && output != "values" {
		return cli.Exit(fmt.Sprintf("migrate: --output: %q is not allowed; use config or values", output), 2)
	}
	from := c.String("from")
	if from == "" && !c.Bool("env") {
		return cli.Exit("migrate: nothing to read; give --from FILE (NVIDIA's config file), --env (NVIDIA's variables in this environment), or both", 2)
	}
	var file []byte
	if from != "" {
		data, err := os.ReadFile(from)
		if err != nil {
			return fmt.Errorf("migrate: reading NVIDIA's config: %w", err)
		}
		file = data
	}
	var lookup func(string) (string, bool)
	if c.Bool("env") {
		lookup = os.LookupEnv
	}
	r, err := nvidia.Convert(file, lookup)
	if err != nil {
		return fmt.Errorf("migrate: --from %s: %w", from, err)
	}
	var out []byte
	notes := r.Notes
	if output == "values" {
		values, more := r.Values()
		notes = append(notes, more...)
		out, err = yaml.Marshal(values)
		out = append([]byte("# Values for deploy/helm/gpu-device-plugin, from NVIDIA's settings.\n"), out...)
	} else {
		out, err = r.ConfigYAML()
		out = append([]byte("# gpu-device-plugin config ("+config.ReferencePath+"), from NVIDIA's settings.\n"), out...)
	}
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "migrate:", n)
	}
	// A value NVIDIA took and we refuse (a rename we do not allow, say) is
	// printed anyway, to be fixed in place, but fails the command.
	checkErr := nvidia.Check(r.Config)
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if checkErr != nil {
		return fmt.Errorf("migrate: the converted config needs a fix before the plugin takes it:\n%w", checkErr)
	}
	return nil
}

// warnNVIDIAEnv logs once, when any of NVIDIA's variables is set, each
// one and what to set here instead: a DaemonSet switched over from
// NVIDIA's plugin may still carry them, and they do nothing here.
func warnNVIDIAEnv(log *slog.Logger) {
	found := nvidia.InEnv(os.LookupEnv)
	if len(found) == 0 {
		return
	}
	log.Warn("NVIDIA k8s-device-plugin environment variables are set; they are not applied",
		"variables", nvidia.Describe(found),
		"fix", "set our counterparts instead (gpu-device-plugin migrate --env prints them as config), and remove these")
}

// migrateComputeDomains prints the manifest in file with NVIDIA's
// ComputeDomains rewritten to ours, and how many on stderr.
func migrateComputeDomains(file string, stdout, stderr io.Writer) error {
	in, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("migrate: --compute-domains: %w", err)
	}
	out, n, err := computedomain.Migrate(in)
	if err != nil {
		return fmt.Errorf("migrate: --compute-domains %s: %w", file, err)
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(stderr, "migrate: %d ComputeDomain(s) rewritten to %s\n", n, computedomain.APIVersion)
	return nil
}

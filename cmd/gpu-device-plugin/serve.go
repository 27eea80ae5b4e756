package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/gcpercent"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/handoff"
)

func serve(c *cli.Context, open daemon.OpenFunc, stderr io.Writer) error {
	cfg, o, err := loadSettings(c)
	if err != nil {
		return err
	}
	log := commandLogger(cfg, stderr)
	name := handoff.Executable(cfg.KubeletAPI)
	if cfg.KubeletAPI == config.KubeletAPIDRA {
		// Found first: without it the one line is the error.
		path, err := handoff.Find(name, true)
		if err != nil {
			return fmt.Errorf("kubeletAPI dra: %w", err)
		}
		log.Info("starting gpu-device-plugin", append(startAttrs(cfg, o), "executable", path)...)
		return handOver(c.Context, cfg, path, log)
	}
	// Set here, not in main: the one-shot commands exit before a GC
	// matters; gpu-device-plugin-dp sets it again, from the same
	// environment.
	gogc := gcpercent.Tune(os.LookupEnv)
	if path, err := handoff.Find(name, false); err == nil {
		log.Info("starting gpu-device-plugin", append(startAttrs(cfg, o), "gogc", gogc, "executable", path)...)
		return handOver(c.Context, cfg, path, log)
	}
	// Serving in this process works the same, with the CLI's code
	// resident too (about 2.5 MiB): a copy of this executable alone, or a
	// test. The start line says which.
	log.Info("starting gpu-device-plugin", append(startAttrs(cfg, o), "gogc", gogc, "executable", "this process")...)
	err = daemon.Run(c.Context, cfg, open, log)
	log.Info("stopped")
	return err
}

// handOver execs the daemon at path, unless ctx is already done: a
// SIGTERM before the exec was taken by this process's handler, and the
// daemon would never hear of it.
func handOver(ctx context.Context, cfg config.Config, path string, log *slog.Logger) error {
	if ctx.Err() != nil {
		log.Info("stopped")
		return nil
	}
	return handoff.Exec(cfg, path)
}

// startAttrs are serve's start line: the version, the config file and
// every setting in effect under its config key. No setting holds a
// secret (kubeconfig is a path).
func startAttrs(cfg config.Config, o origin) []any {
	file := o.file
	if file == "" {
		file = "none"
	}
	attrs := []any{"version", version, "commit", commit, "config", file}
	values := cfg.Values()
	for _, k := range config.Keys() {
		attrs = append(attrs, k, values[k]) // an absent nicResources: ""
	}
	return attrs
}

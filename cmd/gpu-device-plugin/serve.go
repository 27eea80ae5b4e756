package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/gcpercent"
)

func serve(c *cli.Context, open daemon.OpenFunc, stderr io.Writer) error {
	cfg, o, err := loadSettings(c)
	if err != nil {
		return err
	}
	log := commandLogger(cfg, stderr)
	if cfg.KubeletAPI == config.KubeletAPIDRA {
		// Found first: without it the one line is the error.
		path, err := findDRA()
		if err != nil {
			return err
		}
		log.Info("starting gpu-device-plugin", startAttrs(cfg, o)...)
		return execDRA(cfg, path)
	}
	// Set here, not in main: the one-shot commands exit before a GC
	// matters, and DRA mode is another executable, which sets its own.
	gogc := gcpercent.Tune(os.LookupEnv)
	log.Info("starting gpu-device-plugin", append(startAttrs(cfg, o), "gogc", gogc)...)
	err = daemon.Run(c.Context, cfg, open, log)
	log.Info("stopped")
	return err
}

// draExecutable serves DRA mode. It is a program of its own because the
// Kubernetes client code DRA needs would more than double the device-
// plugin mode's memory (package init alone), and Go runs every linked
// package's init whichever mode is chosen.
const draExecutable = "gpu-device-plugin-dra"

// resolvedConfigFlag carries the merged configuration (file, environment,
// flags) to gpu-device-plugin-dra as JSON, so both read settings one way.
const resolvedConfigFlag = "--resolved-config"

// execDRA replaces this process with gpu-device-plugin-dra at path (from
// findDRA: the same directory, else $PATH), keeping its PID, so signals and the container's
// lifetime carry over.
func execDRA(cfg config.Config, path string) error {
	js, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("kubeletAPI dra: encoding the configuration for %s: %w", draExecutable, err)
	}
	err = syscall.Exec(path, []string{draExecutable, resolvedConfigFlag, string(js)}, os.Environ())
	return fmt.Errorf("kubeletAPI dra: starting %s: %w", path, err)
}

func findDRA() (string, error) {
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			p := filepath.Join(filepath.Dir(self), draExecutable)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	p, err := exec.LookPath(draExecutable)
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("kubeletAPI dra needs %s beside this executable or on $PATH (the image and the packages install it); it is not there", draExecutable)
	}
	return p, err
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

package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// printVersion prints the semantic version first, "gpu-device-plugin
// v0.1.0" (v0.1.0+<commit> between releases; "dev" when not built by make,
// which stamps the VERSION file's), then the commit, Go, go-nvml and what
// the driver says. Scripts read the first line.
func printVersion(c *cli.Context, open daemon.OpenFunc, w, stderr io.Writer) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	commandLogger(cfg, stderr)
	goNVML := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/NVIDIA/go-nvml" {
				goNVML = dep.Version
			}
		}
	}
	fmt.Fprintf(w, "gpu-device-plugin %s\ncommit:  %s\ngo:      %s\ngo-nvml: %s\n", version, commit, runtime.Version(), goNVML)
	lib, _, err := nvml.Load(open, cfg.DriverRoot, cfg.NVMLLibrary)
	if err != nil {
		fmt.Fprintf(w, "driver:  not found (%v)\n", err)
		return nil
	}
	defer lib.Shutdown()
	driver, _ := lib.SystemGetDriverVersion()
	nvmlVersion, _ := lib.SystemGetNVMLVersion()
	fmt.Fprintf(w, "driver:  %s\nnvml:    %s\n", driver, nvmlVersion)
	return nil
}

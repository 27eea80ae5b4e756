// Command gpu-device-plugin serves NVIDIA GPUs to the kubelet.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// Set at link time: -ldflags "-X main.version=v1.2.3 -X main.commit=abc".
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newApp(nvml.Open, os.Stdout, os.Stderr).RunContext(ctx, os.Args)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-device-plugin:", err)
		os.Exit(1)
	}
}

const configFlag = "config"

// settingFlags builds the flags for every config setting. Each command
// gets its own instances, so a setting may be given before or after the
// command name. The flags do not read the environment themselves:
// loadConfig does, so that a flag at any level beats its environment twin
// and an empty variable counts as unset.
func settingFlags() []cli.Flag {
	flags := []cli.Flag{&cli.StringFlag{
		Name:  configFlag,
		Usage: "YAML config file; flags and environment variables override it" + envNote(config.EnvName(configFlag)),
	}}
	for _, s := range config.Settings() {
		flags = append(flags, &cli.StringFlag{Name: s.Flag, Usage: s.Usage + envNote(s.Env), Value: s.Default})
	}
	return flags
}

func envNote(env string) string { return " [$" + env + "]" }

// newApp builds the CLI. open loads NVML: nvml.Open in production, a
// mock in tests.
func newApp(open daemon.OpenFunc, stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "gpu-device-plugin",
		Usage:     "serve NVIDIA GPUs to the kubelet",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags:     settingFlags(),
		Action:    func(c *cli.Context) error { return serve(c, open, stderr) },
		Commands: []*cli.Command{
			{
				Name:   "serve",
				Usage:  "serve the discovered devices to the kubelet (the default)",
				Flags:  settingFlags(),
				Action: func(c *cli.Context) error { return serve(c, open, stderr) },
			},
			{
				Name:  "list",
				Usage: "list the discovered GPUs",
				Flags: append(settingFlags(), &cli.StringFlag{
					Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json",
					EnvVars: []string{config.EnvName("output")},
				}),
				Action: func(c *cli.Context) error { return list(c, open, stdout, stderr) },
			},
			allocateCommand(open, stdout, stderr),
			cdiCommand(open, stdout, stderr),
			{
				Name:   "version",
				Usage:  "print version and build information",
				Flags:  settingFlags(),
				Action: func(c *cli.Context) error { return printVersion(c, open, stdout) },
			},
		},
		HideVersion: true,
	}
}

// loadConfig merges, lowest first: defaults, the config file, the
// environment, then the flags, those after the command name last. An empty
// environment variable is unset: GPU_DEVICE_PLUGIN_XID_IGNORE= must not
// turn into an empty list.
func loadConfig(c *cli.Context) (config.Config, error) {
	lineage := c.Lineage()
	cfg := config.Default()
	path := os.Getenv(config.EnvName(configFlag))
	for i := len(lineage) - 1; i >= 0; i-- {
		if lineage[i].IsSet(configFlag) {
			path = lineage[i].String(configFlag)
		}
	}
	if path != "" {
		loaded, err := config.Load(path)
		if err != nil {
			return cfg, err
		}
		cfg = loaded
	}
	byFlag := map[string]config.Setting{}
	for _, s := range config.Settings() {
		byFlag[s.Flag] = s
		if v := os.Getenv(s.Env); v != "" {
			if err := cfg.Set(s.Key, v); err != nil {
				return cfg, fmt.Errorf("%w (env %s)", err, s.Env)
			}
		}
	}
	for i := len(lineage) - 1; i >= 0; i-- {
		for _, name := range lineage[i].LocalFlagNames() {
			s, ok := byFlag[name]
			if !ok {
				continue
			}
			if err := cfg.Set(s.Key, lineage[i].String(name)); err != nil {
				return cfg, fmt.Errorf("%w (flag --%s)", err, s.Flag)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger { return daemon.NewLogger(cfg, w) }

// discover loads NVML and walks the GPUs, for the commands that look at
// the node once. The caller shuts the library down.
func discover(cfg config.Config, open daemon.OpenFunc, log *slog.Logger) (nvml.Library, *nvml.Inventory, error) {
	lib, err := open(nvml.LibraryPath(cfg.DriverRoot, cfg.NVMLLibrary))
	if err != nil {
		return nil, nil, err
	}
	inv, err := nvml.Discover(lib, cfg.SysfsRoot, log)
	if err != nil {
		lib.Shutdown()
		return nil, nil, fmt.Errorf("discovering GPUs: %w", err)
	}
	return lib, inv, nil
}

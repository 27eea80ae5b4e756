// Command gpu-device-plugin serves NVIDIA GPUs to the kubelet.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
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
		code := 1
		if exit, ok := err.(cli.ExitCoder); ok {
			code = exit.ExitCode()
		}
		os.Exit(code)
	}
}

const configFlag = "config"

// Which settings each one-shot command reads; serve (and a bare
// gpu-device-plugin) takes them all. A command lists only the flags it
// uses, so `version --help` is short and a flag that would change nothing
// is refused. The config file may still hold every key.
var (
	driverKeys  = []string{"driverRoot", "nvmlLibrary", "sysfsRoot", "devRoot", "procRoot"}
	servedKeys  = []string{"deviceIDStrategy", "deviceListStrategy", "migStrategy", "mpsRoot"}
	loggingKeys = []string{"logLevel", "logFormat"}
	healthKeys  = []string{"xidIgnore", "xidFatal", "xids", "xidRecoveryPeriod", "thermalMarginC", "healthRecoveryPolls",
		"healthSlowdownSamples", "healthNVMLFailurePolls", "healthChecksDisabled"}

	// setUp reads these for list, allocate and cdi generate.
	nodeKeys = slices.Concat(driverKeys, []string{"excludeGPUs", "includeGPUs"}, loggingKeys)

	// list reads the running plugin's remediation.json with these.
	remediationKeys = []string{"stateDir", "remediation.enabled", "remediation.window"}

	listKeys     = slices.Concat(nodeKeys, servedKeys, healthKeys, remediationKeys, []string{"kubeletAPI", "podResourcesSocket", "nodeName", "cdiHookPath", "runtimeConfigRoot"})
	allocateKeys = slices.Concat(nodeKeys, servedKeys, []string{"imex.channelIDs", "imex.required"})
	cdiKeys      = slices.Concat(nodeKeys, []string{"cdiSpecDir", "hostDriverRoot", "cdiHookPath"})
	versionKeys  = slices.Concat([]string{"driverRoot", "nvmlLibrary"}, loggingKeys)
	launcherKeys = slices.Concat([]string{"driverRoot", "devRoot", "mpsRoot", "mpsLauncherSocket"}, loggingKeys)
	probeKeys    = []string{"healthSocket"}
)

// outputFlag is -o of list and allocate: a table for people, JSON for
// scripts. Its variable is read by output, as the settings' are by
// loadConfig, so that an error can name where the value came from.
func outputFlag() cli.Flag {
	return &cli.StringFlag{
		Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json" + envNote(config.EnvName("output")),
	}
}

// outputFormat is outputFlag's value, and the flag or variable it came from.
func outputFormat(c *cli.Context) (value, from string) {
	if slices.Contains(c.LocalFlagNames(), "output") {
		return c.String("output"), "--output"
	}
	if v := os.Getenv(config.EnvName("output")); v != "" {
		return v, config.EnvName("output")
	}
	return c.String("output"), "--output"
}

// checkOutput refuses an outputFlag other than table or json.
func checkOutput(c *cli.Context) error {
	if v, from := outputFormat(c); v != "table" && v != "json" {
		return fmt.Errorf("%s: %q is not allowed; use table or json", from, v)
	}
	return nil
}

// settingFlags builds the flags for the settings named by keys (all when
// none are named), grouped by category in help. Each command gets its own
// instances, so a setting may be given before or after the command name.
// The flags do not read the environment themselves: loadConfig does, so
// that a flag at any level beats its environment twin and an empty
// variable counts as unset.
func settingFlags(keys ...string) []cli.Flag {
	flags := []cli.Flag{&cli.StringFlag{
		Name:     configFlag,
		Usage:    "YAML config file; flags and environment variables override it" + envNote(config.EnvName(configFlag)),
		Category: "Configuration",
	}}
	for _, s := range config.Settings() {
		if len(keys) == 0 || slices.Contains(keys, s.Key) {
			flags = append(flags, &cli.StringFlag{Name: s.Flag, Usage: s.Usage + envNote(s.Env), Value: s.Default, Category: s.Category})
		}
	}
	return flags
}

func envNote(env string) string { return " [$" + env + "]" }

// commandNames lists the commands for the error a stray word gets.
func commandNames(cmds []*cli.Command) string {
	var names []string
	for _, c := range cmds {
		if !c.Hidden && c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	return strings.Join(names, ", ")
}

// noArgs wraps an action that takes no positional arguments: a mistyped
// command (`gpu-device-plugin lst`) or a stray word after one must not
// start the server or be ignored. It exits 2, as a usage error.
func noArgs(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() == 0 {
			return action(c)
		}
		var path []string // the command's words, "cdi generate"
		for _, ctx := range c.Lineage() {
			if ctx.Command != nil && ctx.Command.Name != "" && ctx.Command.Name != c.App.Name {
				path = append([]string{ctx.Command.Name}, path...)
			}
		}
		if len(path) == 0 {
			return cli.Exit(fmt.Sprintf("unknown command %q; commands: %s (see --help)", c.Args().First(), commandNames(c.App.Commands)), 2)
		}
		if commandNames(c.Command.Subcommands) != "" {
			return cli.Exit(fmt.Sprintf("unknown command %q; %s commands: %s", strings.Join(append(path, c.Args().First()), " "), strings.Join(path, " "), commandNames(c.Command.Subcommands)), 2)
		}
		name := strings.Join(path, " ")
		return cli.Exit(fmt.Sprintf("%s: unexpected argument %q; %s takes flags only (see %s --help)", name, c.Args().First(), name, name), 2)
	}
}

// flagError matches the flag package's parse errors, to name the flag the
// way our docs write it.
var flagError = regexp.MustCompile(`^(flag provided but not defined|flag needs an argument|invalid (?:boolean )?value "(.*)" for (?:flag )?)[: ]*-{1,2}([^\s:]+)`)

// usageErrors makes every bad flag one line naming it and where its help
// is, exit 2 as an unknown command, instead of urfave's help page and 1.
// path is the command's words ("cdi generate"); "" for the top level.
func usageErrors(app *cli.App) {
	app.OnUsageError = usageError(app, "")
	var walk func(cmds []*cli.Command, prefix string)
	walk = func(cmds []*cli.Command, prefix string) {
		for _, c := range cmds {
			path := strings.TrimSpace(prefix + " " + c.Name)
			c.OnUsageError = usageError(app, path)
			walk(c.Subcommands, path)
		}
	}
	walk(app.Commands, "")
}

func usageError(app *cli.App, path string) cli.OnUsageErrorFunc {
	return func(_ *cli.Context, err error, _ bool) error {
		help := strings.Join(slices.DeleteFunc([]string{app.Name, path, "--help"}, func(w string) bool { return w == "" }), " ")
		prefix := ""
		if path != "" {
			prefix = path + ": "
		}
		m := flagError.FindStringSubmatch(err.Error())
		if m == nil {
			return cli.Exit(fmt.Sprintf("%s%v (see %s)", prefix, err, help), 2)
		}
		name := "--" + m[3]
		if len(m[3]) == 1 {
			name = "-" + m[3]
		}
		switch {
		case strings.HasPrefix(m[1], "flag needs"):
			return cli.Exit(fmt.Sprintf("%sflag %s needs a value (see %s)", prefix, name, help), 2)
		case strings.HasPrefix(m[1], "invalid boolean"):
			return cli.Exit(fmt.Sprintf("%sflag %s: %q is not true or false (see %s)", prefix, name, m[2], help), 2)
		case strings.HasPrefix(m[1], "invalid"):
			return cli.Exit(fmt.Sprintf("%sflag %s: %q is not allowed (see %s)", prefix, name, m[2], help), 2)
		}
		if path == "" {
			if owners := commandsWithFlag(app.Commands, m[3], ""); len(owners) > 0 {
				return cli.Exit(fmt.Sprintf("unknown flag %s before the command; it is a flag of %s: give it after the command name (see %s %s --help)",
					name, strings.Join(owners, ", "), app.Name, owners[0]), 2)
			}
		}
		return cli.Exit(fmt.Sprintf("%sunknown flag %s (see %s)", prefix, name, help), 2)
	}
}

// commandsWithFlag lists the commands ("cdi generate") that define the flag.
func commandsWithFlag(cmds []*cli.Command, flag, prefix string) []string {
	var out []string
	for _, c := range cmds {
		if c.Hidden {
			continue
		}
		path := strings.TrimSpace(prefix + " " + c.Name)
		for _, f := range c.Flags {
			if slices.Contains(f.Names(), flag) {
				out = append(out, path)
				break
			}
		}
		out = append(out, commandsWithFlag(c.Subcommands, flag, path)...)
	}
	return out
}

// newApp builds the CLI. open loads NVML: nvml.Open in production, a
// mock in tests.
func newApp(open daemon.OpenFunc, stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "gpu-device-plugin",
		Usage:     "serve NVIDIA GPUs and NIC pools to the kubelet",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags:     settingFlags(),
		Action:    noArgs(func(c *cli.Context) error { return serve(c, open, stderr) }),
		Commands: []*cli.Command{
			{
				Name:   "serve",
				Usage:  "serve the discovered devices to the kubelet (the default)",
				Flags:  settingFlags(),
				Action: noArgs(func(c *cli.Context) error { return serve(c, open, stderr) }),
			},
			{
				Name:  "list",
				Usage: "list the node's GPUs, their MIG devices and its NICs, with health, how each is served and who holds it",
				Flags: append(settingFlags(listKeys...),
					outputFlag(),
					&cli.BoolFlag{Name: "dra", Usage: "also show the devices DRA mode would publish (shown anyway with --kubelet-api=dra; always in -o json)"},
				),
				Action: noArgs(func(c *cli.Context) error { return list(c, open, stdout, stderr) }),
			},
			allocateCommand(open, stdout, stderr),
			cdiCommand(open, stdout, stderr),
			migrateCommand(stdout, stderr),
			{
				// The plugin runs nvidia-cuda-mps-control through this, in a
				// mount namespace of its own (see mpsexec).
				Name:            mpsexec.HelperCommand,
				Hidden:          true,
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return mpsexec.Main(c.Args().First()) },
			},
			{
				// The plugin proves a GPU works through this, confined (see
				// cudaprobe); its report is on stdout.
				Name:            cudaprobe.HelperCommand,
				Hidden:          true,
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return cudaprobe.Main(c.Args().Slice()) },
			},
			mpsLauncherCommand(stderr),
			probeCommand(stdout),
			remediationCommand(stdout),
			{
				// The plugin asks the MPS launcher for a daemon through this
				// (see package launcher).
				Name:            launcher.HelperCommand,
				Hidden:          true,
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return launcher.Main(c.Context, c.Args().Slice()) },
			},
			{
				Name:   "version",
				Usage:  "print version and build information, and the driver's",
				Flags:  settingFlags(versionKeys...),
				Action: noArgs(func(c *cli.Context) error { return printVersion(c, open, stdout, stderr) }),
			},
		},
		HideVersion: true,
		// main prints errors and picks the exit status; cli would exit from
		// inside Run, tests included.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	usageErrors(app)
	return app
}

// loadConfig merges, lowest first: defaults, the config file, the
// environment, then the flags, those after the command name last (a flag
// given both before and after the command takes the value after). An
// empty environment variable is unset, except for the settings whose
// empty value turns something off (config.Setting.EmptyOff):
// GPU_DEVICE_PLUGIN_XID_IGNORE= must not turn into an empty list, while
// GPU_DEVICE_PLUGIN_POD_RESOURCES_SOCKET= turns the reads off as
// --pod-resources-socket "" does.
func loadConfig(c *cli.Context) (config.Config, error) {
	cfg, _, err := loadSettings(c)
	return cfg, err
}

// origin says where each setting's value came from.
type origin struct {
	file string            // the config file's path; "" for none
	from map[string]string // key -> "env X", "--flag" or "in <file>"; absent: the default
}

// loadSettings is loadConfig that also says where each value came from,
// for serve's start line and for errors, which name the flag, variable or
// file a bad value was given in.
func loadSettings(c *cli.Context) (config.Config, origin, error) {
	lineage := c.Lineage()
	cfg := config.Default()
	o := origin{file: os.Getenv(config.EnvName(configFlag)), from: map[string]string{}}
	for i := len(lineage) - 1; i >= 0; i-- {
		if lineage[i].IsSet(configFlag) {
			o.file = lineage[i].String(configFlag)
		}
	}
	if o.file != "" {
		loaded, err := config.Load(o.file)
		if err != nil {
			return cfg, o, err
		}
		defaults := cfg.Values()
		for k, v := range loaded.Values() {
			if d, ok := defaults[k]; !ok || d != v {
				o.from[k] = "in " + o.file
			}
		}
		cfg = loaded
	}
	byFlag := map[string]config.Setting{}
	for _, s := range config.Settings() {
		byFlag[s.Flag] = s
		if v, ok := os.LookupEnv(s.Env); ok && (v != "" || s.EmptyOff) {
			if err := cfg.Set(s.Key, v); err != nil {
				return cfg, o, fmt.Errorf("%w (env %s)", err, s.Env)
			}
			o.from[s.Key] = "env " + s.Env
		}
	}
	for i := len(lineage) - 1; i >= 0; i-- {
		for _, name := range lineage[i].LocalFlagNames() {
			s, ok := byFlag[name]
			if !ok {
				continue
			}
			if err := cfg.Set(s.Key, lineage[i].String(name)); err != nil {
				return cfg, o, fmt.Errorf("%w (flag --%s)", err, s.Flag)
			}
			o.from[s.Key] = "--" + s.Flag
		}
	}
	if err := daemon.ValidateConfig(cfg, func(key string) string { return o.from[key] }); err != nil {
		return cfg, o, err
	}
	return cfg, o, nil
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger { return daemon.NewLogger(cfg, w) }

// commandLogger is the logger of a command that loaded the config, which
// first warns about NVIDIA's variables in the environment.
func commandLogger(cfg config.Config, w io.Writer) *slog.Logger {
	log := newLogger(cfg, w)
	warnNVIDIAEnv(log)
	return log
}

// setUp loads the config of a command that looks at the node once (list,
// allocate, cdi generate), runs the command's checks of its own flags
// before anything is read, and makes its logger.
func setUp(c *cli.Context, stderr io.Writer, checks ...func(*cli.Context) error) (config.Config, *slog.Logger, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return cfg, nil, err
	}
	for _, check := range checks {
		if err := check(c); err != nil {
			return cfg, nil, err
		}
	}
	return cfg, commandLogger(cfg, stderr), nil
}

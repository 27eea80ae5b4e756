package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/handoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// A mistyped command or a stray word is a usage error (exit 2) naming the
// commands; it never falls through to serve, which would start a second
// plugin on the kubelet's socket.
func TestStrayArgumentsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lst"}, `unknown command "lst"; commands: serve, list, allocate, cdi, migrate, mps-launcher, probe, remediation, version`},
		{[]string{"--log-level=debug", "lst"}, `unknown command "lst"`},
		{[]string{"serve", "extra-arg"}, `serve: unexpected argument "extra-arg"`},
		{[]string{"list", "x"}, `list: unexpected argument "x"`},
		{[]string{"version", "x"}, `version: unexpected argument "x"`},
		{[]string{"allocate", "x"}, `allocate: unexpected argument "x"`},
		{[]string{"cdi", "gen"}, `unknown command "cdi gen"; cdi commands: generate`},
		{[]string{"cdi", "generate", "x"}, `cdi generate: unexpected argument "x"`},
		{[]string{"migrate", "x"}, `migrate: unexpected argument "x"`},
	} {
		// With the device-plugin directory unwritable, a serve that started
		// anyway would fail rather than hang.
		_, _, err := run(t, mockOpen, append([]string{"--device-plugin-dir", t.TempDir() + "/missing"}, tc.args...)...)
		var exit cli.ExitCoder
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want exit 2 saying %q", tc.args, err, tc.want)
		}
	}
}

// Each command lists only the flags it reads; serve's are grouped.
func TestHelpShowsWhatEachCommandUses(t *testing.T) {
	count := func(help string) int { return strings.Count(help, "\n   --") }
	help := func(args ...string) string {
		t.Helper()
		out, _, err := run(t, mockOpen, append(args, "--help")...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	v := help("version")
	if n := count(v); n > 6 || strings.Contains(v, "--xid-ignore") || !strings.Contains(v, "--driver-root") {
		t.Errorf("version --help lists %d flags (want its own few: driver root, NVML library, logging):\n%s", n, v)
	}
	l := help("list")
	if i, j := strings.Index(l, "--output"), strings.Index(l, "--driver-root"); i < 0 || i > j {
		t.Errorf("list --help: --output should come before the settings:\n%s", l)
	}
	for _, absent := range []string{"--metrics-address", "--events", "--device-plugin-dir", "--pod-uid"} {
		if strings.Contains(l, absent) {
			t.Errorf("list --help lists %s, which list does not read", absent)
		}
	}
	s := help("serve")
	for _, group := range []string{"Kubelet", "NVML and driver", "Health", "CDI", "NICs", "DRA", "Reporting", "Logging"} {
		if !strings.Contains(s, "\n   "+group+"\n") {
			t.Errorf("serve --help has no %q group", group)
		}
	}
	if strings.Contains(help("cdi", "generate"), "--xid-fatal") {
		t.Error("cdi generate --help lists health flags")
	}
}

// stubbed is the app with every command's action replaced by one that
// loads the settings and hands them to got: what the flags, variables and
// file say, without touching the node.
func stubbed(got func(config.Config, error)) *cli.App {
	app := newApp(mockOpen, &bytes.Buffer{}, &bytes.Buffer{})
	action := func(c *cli.Context) error {
		cfg, err := loadConfig(c)
		got(cfg, err)
		return err
	}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			if !c.SkipFlagParsing {
				c.Action = action
			}
			walk(c.Subcommands)
		}
	}
	app.Action = action
	walk(app.Commands)
	return app
}

// commandFlags are the setting flags each command takes after its name.
func commandFlags(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var walk func(cmds []*cli.Command, prefix string)
	walk = func(cmds []*cli.Command, prefix string) {
		for _, c := range cmds {
			path := strings.TrimSpace(prefix + " " + c.Name)
			for _, f := range c.Flags {
				for _, s := range config.Settings() {
					if f.Names()[0] == s.Flag {
						out[path] = append(out[path], s.Flag)
					}
				}
			}
			walk(c.Subcommands, path)
		}
	}
	walk(newApp(mockOpen, io.Discard, io.Discard).Commands, "")
	return out
}

// Every setting a command reads is a flag after its name as well as
// before it; the commands that look at the node all read the GPU
// selection (list --exclude-gpus 0, as NVIDIA's docs write it).
func TestSettingsAfterTheCommand(t *testing.T) {
	flags := commandFlags(t)
	for _, cmd := range []string{"list", "allocate", "cdi generate"} {
		for _, want := range []string{"exclude-gpus", "include-gpus", "driver-root", "sysfs-root", "proc-root", "log-level"} {
			if !slices.Contains(flags[cmd], want) {
				t.Errorf("%s does not take --%s after its name", cmd, want)
			}
		}
	}
	byFlag := map[string]config.Setting{}
	for _, s := range config.Settings() {
		byFlag[s.Flag] = s
	}
	for cmd, names := range flags {
		for _, name := range names {
			s := byFlag[name]
			for _, args := range [][]string{
				append(strings.Fields(cmd), "--"+name, s.Default),
				append([]string{"--" + name, s.Default}, strings.Fields(cmd)...),
			} {
				err := stubbed(func(config.Config, error) {}).RunContext(context.Background(), append([]string{"gpu-device-plugin"}, args...))
				if err != nil {
					t.Errorf("%v: %v", args, err)
				}
			}
		}
	}

	out, stderr, err := run(t, mockOpen, "list", "--exclude-gpus", "0", "-o", "json", "--sysfs-root", t.TempDir())
	if err != nil {
		t.Fatalf("list --exclude-gpus 0: %v\n%s", err, stderr)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(l.GPUs, func(g listedGPU) bool { return g.Index == 0 }); i < 0 || l.GPUs[i].Health != healthExcluded {
		t.Errorf("list --exclude-gpus 0 did not exclude GPU 0: %+v", l.GPUs)
	}
}

// A setting given both before and after the command takes the value
// after it, the one nearer the command it configures.
func TestSettingBeforeAndAfterTheCommandTakesTheLater(t *testing.T) {
	for _, args := range [][]string{
		{"--log-level", "warn", "list", "--log-level", "error"},
		{"--log-level=warn", "cdi", "generate", "--log-level=error"},
		{"--log-level", "warn", "serve", "--log-level", "error"},
	} {
		var got string
		app := stubbed(func(c config.Config, _ error) { got = c.LogLevel })
		if err := app.RunContext(context.Background(), append([]string{"gpu-device-plugin"}, args...)); err != nil {
			t.Fatal(err)
		}
		if got != "error" {
			t.Errorf("%v: logLevel %q, want the later error", args, got)
		}
	}
}

// A bad flag is a usage error like an unknown command: one line naming
// the flag and where the command's help is, exit 2, no help page.
func TestBadFlagsAreOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--bogus"}, "list: unknown flag --bogus (see gpu-device-plugin list --help)"},
		{[]string{"list", "-x"}, "list: unknown flag -x (see gpu-device-plugin list --help)"},
		{[]string{"--bogus", "list"}, "unknown flag --bogus (see gpu-device-plugin --help)"},
		{[]string{"version", "--xid-ignore", "13"}, "version: unknown flag --xid-ignore (see gpu-device-plugin version --help)"},
		{[]string{"cdi", "generate", "--nope"}, "cdi generate: unknown flag --nope (see gpu-device-plugin cdi generate --help)"},
		{[]string{"--output", "json", "list"}, "unknown flag --output before the command; it is a flag of list, allocate, cdi generate, migrate, remediation status: give it after the command name (see gpu-device-plugin list --help)"},
		{[]string{"list", "--output"}, "list: flag --output needs a value (see gpu-device-plugin list --help)"},
		{[]string{"list", "--dra=maybe"}, `list: flag --dra: "maybe" is not true or false (see gpu-device-plugin list --help)`},
		{[]string{"allocate", "--size", "two"}, `allocate: flag --size: "two" is not allowed (see gpu-device-plugin allocate --help)`},
	} {
		out, stderr, err := run(t, mockOpen, tc.args...)
		var exit cli.ExitCoder
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || err.Error() != tc.want {
			t.Errorf("%v: err = %v, want exit 2 saying\n%s", tc.args, err, tc.want)
		}
		if out != "" || stderr != "" {
			t.Errorf("%v printed more than the error:\n%s%s", tc.args, out, stderr)
		}
	}
}

// A bad value names where it was given: the variable, the flag or the
// config file, whichever set it.
func TestBadValueNamesWhereItCameFrom(t *testing.T) {
	file := configFile(t, "logLevel: loud\n")
	for _, tc := range []struct {
		env, value string
		args       []string
		want, not  string
	}{
		{"GPU_DEVICE_PLUGIN_LOG_LEVEL", "verbose", []string{"list"}, `logLevel (env GPU_DEVICE_PLUGIN_LOG_LEVEL): "verbose" is not allowed`, "--log-level"},
		{"GPU_DEVICE_PLUGIN_THERMAL_MARGIN", "x", []string{"list"}, `thermalMarginC: "x" is not a whole number (env GPU_DEVICE_PLUGIN_THERMAL_MARGIN)`, "--thermal-margin"},
		{"GPU_DEVICE_PLUGIN_METRICS_ADDRESS", "9400", []string{"serve"}, `metricsAddress (env GPU_DEVICE_PLUGIN_METRICS_ADDRESS): "9400" is not host:port`, "--metrics-address"},
		{"", "", []string{"list", "--log-level", "verbose"}, `logLevel (--log-level): "verbose" is not allowed`, "GPU_DEVICE_PLUGIN"},
		{"GPU_DEVICE_PLUGIN_LOG_LEVEL", "verbose", []string{"list", "--log-level", "loud"}, `logLevel (--log-level): "loud" is not allowed`, "GPU_DEVICE_PLUGIN"},
		{"", "", []string{"list", "--config", file}, `logLevel (in ` + file + `): "loud" is not allowed`, "--log-level"},
	} {
		if tc.env != "" {
			t.Setenv(tc.env, tc.value)
		}
		err := stubbed(func(config.Config, error) {}).RunContext(context.Background(), append([]string{"gpu-device-plugin"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("%s=%s %v: err = %v, want %q without %q", tc.env, tc.value, tc.args, err, tc.want, tc.not)
		}
		if tc.env != "" {
			os.Unsetenv(tc.env)
		}
	}
}

// An empty variable turns off what an empty flag turns off (the
// EmptyOff settings); for the rest it is unset, as before.
func TestEmptyVariable(t *testing.T) {
	var off []string
	for _, s := range config.Settings() {
		if s.EmptyOff {
			off = append(off, s.Key)
			t.Setenv(s.Env, "")
		}
	}
	if !slices.Contains(off, "podResourcesSocket") {
		t.Fatal("podResourcesSocket is not EmptyOff")
	}
	t.Setenv("GPU_DEVICE_PLUGIN_XID_IGNORE", "")
	t.Setenv("GPU_DEVICE_PLUGIN_LOG_LEVEL", "")
	var got config.Config
	err := stubbed(func(c config.Config, _ error) { got = c }).RunContext(context.Background(), []string{"gpu-device-plugin", "--config", configFile(t, "metricsAddress: \":9400\"\n"), "serve"})
	if err != nil {
		t.Fatal(err)
	}
	values := got.Values()
	for _, k := range off {
		if values[k] != "" {
			t.Errorf("%s = %q with its variable empty, want \"\" (off)", k, values[k])
		}
	}
	if d := config.Default(); !slices.Equal(got.XIDIgnore, d.XIDIgnore) || got.LogLevel != d.LogLevel {
		t.Errorf("an empty GPU_DEVICE_PLUGIN_XID_IGNORE or LOG_LEVEL changed the setting: %v %q", got.XIDIgnore, got.LogLevel)
	}
}

// A SIGTERM that arrives before serve hands over to gpu-device-plugin-dp
// is this process's to act on: serve stops instead of exec'ing a daemon
// that would never hear of it. The stand-in beside this test binary fails
// the run if it is exec'd.
func TestServeStoppedBeforeHandOver(t *testing.T) {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		t.Fatal(err)
	}
	dp := filepath.Join(filepath.Dir(self), handoff.DevicePlugin)
	if _, err := os.Stat(dp); err == nil {
		t.Skipf("%s exists; not replacing it", dp)
	}
	if err := os.WriteFile(dp, []byte("#!/bin/sh\necho \"$0 ran: serve handed over after it was stopped\" >&2\nexit 3\n"), 0o755); err != nil {
		t.Skipf("cannot put a stand-in beside the test binary: %v", err)
	}
	t.Cleanup(func() { os.Remove(dp) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := t.TempDir()
	var stderr bytes.Buffer
	err = newApp(mockOpen, io.Discard, &stderr).RunContext(ctx, []string{"gpu-device-plugin", "serve",
		"--device-plugin-dir", d, "--sysfs-root", d, "--state-dir", "", "--cdi-spec-dir", d, "--device-info-dir", d,
		"--runtime-config-root", "", "--pod-resources-socket", "", "--node-labels", "none"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"executable=" + dp, "msg=stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("serve's output lacks %s:\n%s", want, stderr.String())
		}
	}
}

// serve's start line is one line with the config file, every key and
// the GOGC in effect.
func TestServeLogsItsSettings(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // serve starts, says what it runs with, and stops
	d := t.TempDir()
	file := configFile(t, "deviceIDStrategy: index\n")
	t.Setenv("GPU_DEVICE_PLUGIN_LOG_LEVEL", "info")
	var stderr bytes.Buffer
	err := newApp(mockOpen, io.Discard, &stderr).RunContext(ctx, []string{"gpu-device-plugin", "serve", "--config", file,
		"--device-plugin-dir", d, "--sysfs-root", d, "--state-dir", "", "--cdi-spec-dir", d, "--device-info-dir", d,
		"--runtime-config-root", "", "--pod-resources-socket", "", "--node-labels", "none", "--exclude-gpus", "3,7"})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, `msg="starting gpu-device-plugin"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d start lines, want 1:\n%s", len(lines), stderr.String())
	}
	for _, want := range []string{"config=" + file, "deviceIDStrategy=index", "excludeGPUs=3,7", "logLevel=info", "podResourcesSocket=\"\"", "xidIgnore=8,11,13,", "xids=\"\"", "gogc="} {
		if !strings.Contains(lines[0], " "+want) {
			t.Errorf("start line lacks %s:\n%s", want, lines[0])
		}
	}
	for _, k := range config.Keys() {
		if !strings.Contains(lines[0], " "+k+"=") {
			t.Errorf("start line lacks %s:\n%s", k, lines[0])
		}
	}
}

// An excludeGPUs or includeGPUs entry that names no GPU is a warning
// naming it and the forms an entry takes, and list shows it.
func TestUnmatchedGPUEntries(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []config.UnmatchedGPU
	}{
		{[]string{"--include-gpus", "A100"}, []config.UnmatchedGPU{{Key: "includeGPUs", Entry: "A100", Hint: "Mock NVIDIA A100-SXM4-40GB"}}},
		{[]string{"--exclude-gpus", "42,GPU-typo,1"}, []config.UnmatchedGPU{{Key: "excludeGPUs", Entry: "42"}, {Key: "excludeGPUs", Entry: "GPU-typo"}}},
		{[]string{"--include-gpus", "mock nvidia a100-sxm4-40gb"}, nil},
	} {
		out, stderr, err := run(t, mockOpen, append([]string{"list", "-o", "json", "--sysfs-root", t.TempDir()}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var l listing
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatal(err)
		}
		if l.UnmatchedGPUEntries == nil || !slices.Equal(l.UnmatchedGPUEntries, append([]config.UnmatchedGPU{}, tc.want...)) {
			t.Errorf("%v: unmatchedGPUEntries = %+v, want %+v", tc.args, l.UnmatchedGPUEntries, tc.want)
		}
		for _, u := range tc.want {
			line := fmt.Sprintf("level=WARN msg=\"%s entry %q matches no GPU on this node; an entry is %s", u.Key, u.Entry, config.GPUEntryForms)
			if n := strings.Count(strings.ReplaceAll(stderr, `\"`, `"`), line); n != 1 {
				t.Errorf("%v: warned %d times about %q, want once:\n%s", tc.args, n, u.Entry, stderr)
			}
		}
		if len(tc.want) == 0 && strings.Contains(stderr, "matches no GPU") {
			t.Errorf("%v: warned though every entry names a GPU:\n%s", tc.args, stderr)
		}
	}
	out, _, err := run(t, mockOpen, "list", "--sysfs-root", t.TempDir(), "--include-gpus", "A100")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `includeGPUs entry "A100" matches no GPU on this node`) || !strings.Contains(out, `(did you mean "Mock NVIDIA A100-SXM4-40GB"?)`) {
		t.Errorf("the table does not show the unmatched entry:\n%s", out)
	}
}

// A MIG GPU without MIG devices is reported once, by what serves it,
// whatever the MIG strategy.
func TestMIGWithoutInstancesReportedOnce(t *testing.T) {
	open := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		nvmltest.Device(s, 2).UUID = "GPU-mig-without-instances"
		nvmltest.Device(s, 2).MigMode = gonvml.DEVICE_MIG_ENABLE
		return s, nil
	}
	for _, strategy := range []string{"none", "single", "mixed"} {
		_, stderr, err := run(t, open, "list", "--mig-strategy", strategy, "--sysfs-root", t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		// The health record (GPU health changed, mig-enabled) stays, at
		// info: the one warning says what to do.
		var said []string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.Contains(l, "GPU-mig-without-instances") && !strings.Contains(l, "level=DEBUG") && !strings.Contains(l, `msg="GPU health changed"`) {
				said = append(said, l)
			}
		}
		if len(said) != 1 || !strings.Contains(said[0], "level=WARN") || !strings.Contains(said[0], "no MIG devices") || !strings.Contains(said[0], "nvidia-smi mig -cgi") {
			t.Errorf("migStrategy %s: reported %d times, want one warning with the fix:\n%s", strategy, len(said), strings.Join(said, "\n"))
		}
		if n := strings.Count(stderr, "level=WARN"); strings.Contains(stderr, `level=WARN msg="GPU health changed" device=GPU-mig-without-instances`) {
			t.Errorf("migStrategy %s: the mig-enabled health record is a warning too (%d warnings):\n%s", strategy, n, stderr)
		}
	}
}

// Device-plugin mode hears no DRA words (pcieRoot) above debug; --dra
// and DRA mode do.
func TestDRAWordsOnlyForDRA(t *testing.T) {
	for _, tc := range []struct {
		args []string
		dra  bool
	}{
		{[]string{"list"}, false},
		{[]string{"list", "-o", "json"}, false},
		{[]string{"list", "--dra"}, true},
		{[]string{"list", "--kubelet-api", "dra"}, true},
	} {
		_, stderr, err := run(t, mockOpen, append(tc.args, "--sysfs-root", t.TempDir(), "--node-name", "n")...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(stderr, "pcieRoot"); got != tc.dra {
			t.Errorf("%v: pcieRoot in the log: %v, want %v:\n%s", tc.args, got, tc.dra, stderr)
		}
	}
}

// -o of list and allocate names its variable too when the value came
// from it.
func TestBadOutputNamesWhereItCameFrom(t *testing.T) {
	_, _, err := run(t, mockOpen, "list", "-o", "yaml")
	if err == nil || !strings.HasPrefix(err.Error(), `--output: "yaml" is not allowed`) {
		t.Errorf("list -o yaml: %v", err)
	}
	t.Setenv("GPU_DEVICE_PLUGIN_OUTPUT", "yaml")
	_, _, err = run(t, mockOpen, "list")
	if err == nil || !strings.HasPrefix(err.Error(), `GPU_DEVICE_PLUGIN_OUTPUT: "yaml" is not allowed`) {
		t.Errorf("GPU_DEVICE_PLUGIN_OUTPUT=yaml list: %v", err)
	}
}

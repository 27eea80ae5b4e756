package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// A mistyped command or a stray word is a usage error (exit 2) naming the
// commands; it never falls through to serve, which would start a second
// plugin on the kubelet's socket.
func TestStrayArgumentsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lst"}, `unknown command "lst"; commands: serve, list, allocate, cdi, migrate, mps-launcher, version`},
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

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The tests run this test binary as runc-nosysres (TestMain calls main
// when RUNC_NOSYSRES_MAIN is set), with a fake runc first on PATH that
// writes down the arguments it was given, one a line, in $RUNC_ARGS.

func TestMain(m *testing.M) {
	if os.Getenv("RUNC_NOSYSRES_MAIN") != "" {
		main()
		return
	}
	os.Exit(m.Run())
}

const fakeRunc = "#!/bin/sh\nprintf '%s\\n' \"$@\" >\"$RUNC_ARGS\"\n"

// caps holds CAP_SYS_RESOURCE first, between others, last, alone, and not
// at all; withoutSysResource is caps without it.
var (
	caps = map[string][]string{
		"bounding":    {"CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"},
		"effective":   {"CAP_SYS_RESOURCE", "CAP_CHOWN", "CAP_SYS_ADMIN"},
		"permitted":   {"CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE"},
		"inheritable": {"CAP_SYS_RESOURCE"},
		"ambient":     {"CAP_KILL", "CAP_SETUID"},
	}
	withoutSysResource = map[string][]string{
		"bounding":    {"CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"},
		"effective":   {"CAP_CHOWN", "CAP_SYS_ADMIN"},
		"permitted":   {"CAP_CHOWN", "CAP_SYS_ADMIN"},
		"inheritable": {},
		"ambient":     {"CAP_KILL", "CAP_SETUID"},
	}
)

// process is an OCI process with the given capabilities (none: nil), and
// CAP_SYS_RESOURCE where the wrapper must leave it: in env and args.
func process(c map[string][]string) map[string]any {
	p := map[string]any{
		"terminal": false,
		"user":     map[string]any{"uid": 0, "gid": 0},
		"args":     []string{"/sbin/init", "CAP_SYS_RESOURCE"},
		"env":      []string{"PATH=/usr/bin", "KEEP=CAP_SYS_RESOURCE"},
		"cwd":      "/",
		"rlimits":  []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}},
	}
	if c != nil {
		p["capabilities"] = c
	}
	return p
}

// config is an OCI bundle's config.json with the given process.
func config(p map[string]any) map[string]any {
	return map[string]any{
		"ociVersion":  "1.2.0",
		"process":     p,
		"root":        map[string]any{"path": "rootfs"},
		"hostname":    "kind-control-plane",
		"annotations": map[string]string{"note": "CAP_SYS_RESOURCE"},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "mount"}},
			"resources":  map[string]any{"memory": map[string]any{"limit": -1}},
		},
	}
}

type env struct {
	wrapper, bundle, args string
	environ               []string
}

// setup makes a bundle directory and a fake runc.
func setup(t *testing.T) env {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	bundle := filepath.Join(dir, "bundle")
	for _, d := range []string{bin, bundle} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "runc"), []byte(fakeRunc), 0o755); err != nil {
		t.Fatal(err)
	}
	args := filepath.Join(dir, "runc-args")
	return env{
		wrapper: os.Args[0],
		bundle:  bundle,
		args:    args,
		environ: append(os.Environ(),
			"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
			"RUNC_ARGS="+args, "RUNC_NOSYSRES_MAIN=1"),
	}
}

// run runs the wrapper in dir and checks that it handed runc exactly args.
func (e env) run(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(e.wrapper, args...)
	cmd.Dir = dir
	cmd.Env = e.environ
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runc-nosysres %q: %v\n%s", args, err, out)
	} else if len(out) != 0 {
		t.Errorf("runc-nosysres %q said %s", args, out)
	}
	b, err := os.ReadFile(e.args)
	if err != nil {
		t.Fatalf("runc-nosysres %q did not run runc: %v", args, err)
	}
	if got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); !slices.Equal(got, args) {
		t.Errorf("runc got %q, want %q", got, args)
	}
}

func write(t *testing.T, path string, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// decode reads JSON keeping numbers as written, so that a number the
// rewrite changed shows.
func decode(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return v
}

// check compares the JSON file at path with want, field by field.
func check(t *testing.T, path string, want any) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := decode(t, got), decode(t, w); !reflect.DeepEqual(g, w) {
		t.Errorf("%s is\n%s\nwant\n%s", filepath.Base(path), got, w)
	}
	if _, err := os.Stat(path + ".nosysres"); !os.IsNotExist(err) {
		t.Errorf("%s.nosysres left behind (%v)", filepath.Base(path), err)
	}
}

// TestRuncNoSysResBundle: create and run drop CAP_SYS_RESOURCE from every
// list under the bundle's .process.capabilities, whichever way the bundle
// is given, and leave the rest of config.json as it was.
func TestRuncNoSysResBundle(t *testing.T) {
	for _, c := range []struct {
		name string
		args func(bundle string) []string
		cwd  bool // run in the bundle, for the default bundle "."
	}{
		{"create --bundle", func(b string) []string { return []string{"--root", "/r", "create", "--bundle", b, "id"} }, false},
		{"create -b", func(b string) []string { return []string{"--root", "/r", "create", "-b", b, "--pid-file", "/p", "id"} }, false},
		{"--bundle= run", func(b string) []string { return []string{"--bundle=" + b, "run", "id"} }, false},
		{"run --bundle=", func(b string) []string { return []string{"run", "--detach", "--bundle=" + b, "id"} }, false},
		{"create in the bundle", func(string) []string { return []string{"--root", "/r", "create", "id"} }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t)
			path := filepath.Join(e.bundle, "config.json")
			write(t, path, config(process(caps)))
			dir := t.TempDir()
			if c.cwd {
				dir = e.bundle
			}
			e.run(t, dir, c.args(e.bundle)...)
			check(t, path, config(process(withoutSysResource)))
		})
	}
}

// TestRuncNoSysResExec: exec drops CAP_SYS_RESOURCE from every list under
// the process file's .capabilities, however the file is given, and leaves
// the bundle's config.json alone.
func TestRuncNoSysResExec(t *testing.T) {
	for _, c := range []struct {
		name string
		args func(proc string) []string
	}{
		{"--process", func(p string) []string { return []string{"--root", "/r", "exec", "--process", p, "--detach", "id"} }},
		{"-p", func(p string) []string { return []string{"exec", "-p", p, "id"} }},
		{"--process=", func(p string) []string { return []string{"exec", "--process=" + p, "id"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t)
			proc := filepath.Join(t.TempDir(), "process.json")
			write(t, proc, process(caps))
			cfg := filepath.Join(e.bundle, "config.json")
			before := write(t, cfg, config(process(caps)))
			e.run(t, e.bundle, c.args(proc)...)
			check(t, proc, process(withoutSysResource))
			if after, _ := os.ReadFile(cfg); !bytes.Equal(after, before) {
				t.Errorf("exec changed the bundle's config.json:\n%s", after)
			}
		})
	}
}

// TestRuncNoSysResOthers: other subcommands, and exec without a process
// file, hand over to runc and leave config.json byte for byte, though the
// bundle is given or is the working directory.
func TestRuncNoSysResOthers(t *testing.T) {
	for _, c := range []struct {
		name string
		args func(bundle string) []string
	}{
		{"start", func(string) []string { return []string{"--root", "/r", "start", "id"} }},
		{"start --bundle", func(b string) []string { return []string{"start", "--bundle", b, "id"} }},
		{"delete", func(string) []string { return []string{"delete", "--force", "id"} }},
		{"kill", func(string) []string { return []string{"kill", "id", "KILL"} }},
		{"exec without --process", func(b string) []string { return []string{"exec", "--bundle", b, "id", "sh"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t)
			path := filepath.Join(e.bundle, "config.json")
			before := write(t, path, config(process(caps)))
			e.run(t, e.bundle, c.args(e.bundle)...)
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Errorf("config.json changed:\n%s", after)
			}
		})
	}
}

// TestRuncNoSysResNoCapabilities: a bundle whose process has no
// capabilities is no error, runc still runs, and config.json stays byte for
// byte: to runc, no capabilities (keep the process's own) is not an empty
// set (drop them all).
func TestRuncNoSysResNoCapabilities(t *testing.T) {
	e := setup(t)
	path := filepath.Join(e.bundle, "config.json")
	before := write(t, path, config(process(nil)))
	e.run(t, e.bundle, "create", "--bundle", e.bundle, "id")
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Errorf("config.json changed:\n%s", after)
	}
}

// TestRuncNoSysResKeepsNumbersAndMode: the rewrite keeps every number as
// written (an unlimited rlimit is 2^64-1, which a float64 rounds to a value
// runc then refuses) and the file's mode.
func TestRuncNoSysResKeepsNumbersAndMode(t *testing.T) {
	e := setup(t)
	path := filepath.Join(e.bundle, "config.json")
	const unlimited = "18446744073709551615"
	raw := `{"ociVersion":"1.2.0","process":{"rlimits":[{"type":"RLIMIT_MEMLOCK","hard":` + unlimited +
		`,"soft":` + unlimited + `}],"capabilities":{"bounding":["CAP_SYS_RESOURCE","CAP_CHOWN"]}},` +
		`"linux":{"resources":{"memory":{"limit":9223372036854775807,"swappiness":0.5}}}}`
	if err := os.WriteFile(path, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run(t, e.bundle, "create", "--bundle", e.bundle, "id")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{`"hard":` + unlimited, `"soft":` + unlimited, `"limit":9223372036854775807`, `"swappiness":0.5`} {
		if !bytes.Contains(b, []byte(n)) {
			t.Errorf("config.json lost %s:\n%s", n, b)
		}
	}
	if bytes.Contains(b, []byte("CAP_SYS_RESOURCE")) || !bytes.Contains(b, []byte(`"bounding":["CAP_CHOWN"]`)) {
		t.Errorf("bounding set not rewritten to [CAP_CHOWN]:\n%s", b)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("config.json mode %v (%v), want 0600", info.Mode().Perm(), err)
	}
}

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// asDRA, set in a copy of the test binary's environment, makes it run
// main as gpu-device-plugin-dra would, with the copy's arguments.
const asDRA = "GPU_DEVICE_PLUGIN_DRA_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asDRA) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// draCopy is a copy of this test binary, run as gpu-device-plugin-dra,
// alone in a directory of its own.
func draCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "gpu-device-plugin-dra")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func runDRA(t *testing.T, exe string, args ...string) (*exec.Cmd, string, error) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), asDRA+"=1")
	out, err := cmd.CombinedOutput()
	return cmd, string(out), err
}

// Charts of earlier releases run `gpu-device-plugin-dra
// compute-domain-controller ARGS`: it becomes gpu-device-plugin-controller
// beside it, with ARGS, in the same process.
func TestControllerCommandExecs(t *testing.T) {
	dra := draCopy(t)
	standIn := filepath.Join(filepath.Dir(dra), "gpu-device-plugin-controller")
	if err := os.WriteFile(standIn, []byte("#!/bin/sh\necho \"pid=$$ argv0=$0 args=$*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd, out, err := runDRA(t, dra, "compute-domain-controller", "--namespace=gpu", "--resync=1m")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "pid=" + strconv.Itoa(cmd.Process.Pid) + " argv0=" + standIn + " args=--namespace=gpu --resync=1m\n"
	if out != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

// Without gpu-device-plugin-controller beside it, the command fails with
// one line naming what is missing.
func TestControllerCommandAbsent(t *testing.T) {
	_, out, err := runDRA(t, draCopy(t), "compute-domain-controller", "--namespace=gpu")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("err = %v, want exit status 1\n%s", err, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "gpu-device-plugin-dra: compute-domain-controller: gpu-device-plugin-controller is not beside this executable") {
		t.Errorf("output %q, want one line naming gpu-device-plugin-controller", out)
	}
}

// Package mpstest builds the stand-in nvidia-cuda-mps-control (mockmps)
// for tests.
package mpstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// Install builds mockmps as <driverRoot>/usr/bin/nvidia-cuda-mps-control,
// links it as usr/bin/nvidia-smi (its compute-policy stand-in) and
// usr/bin/mps-client (a CUDA client stand-in), and returns the control program's path. It is static (no cgo), so it also
// runs chrooted into a driver root that has no libc.
func Install(t testing.TB, driverRoot string) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	bin := filepath.Join(driverRoot, "usr", "bin", "nvidia-cuda-mps-control")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", bin, "./mockmps")
	cmd.Dir = filepath.Dir(self)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building mockmps: %v\n%s", err, out)
	}
	for _, name := range []string{"nvidia-smi", "mps-client"} {
		if err := os.Link(bin, filepath.Join(filepath.Dir(bin), name)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// DriverRoot is a driver root with the stand-in control daemon at
// /usr/bin/nvidia-cuda-mps-control and the directories a host's has.
func DriverRoot(t testing.TB) (root, bin string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "driver")
	for _, dir := range []string{"dev", "proc", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, Install(t, root)
}

// NeedConfinement returns this test executable, which must act as the
// mps-exec helper (see mpsexec), when the test may run the control daemon
// confined: as root, with private mount namespaces. Otherwise it skips
// the test, or fails it where CI=true.
func NeedConfinement(t testing.TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root"
	} else {
		probe := exec.Command(self, "-test.run=^$")
		probe.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		if out, err := probe.CombinedOutput(); err != nil {
			why = fmt.Sprintf("needs a private mount namespace, and unshare failed: %v %s", err, out)
		}
	}
	if why == "" {
		return self
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test %s, and CI=true", why)
	}
	t.Skip(why)
	return ""
}

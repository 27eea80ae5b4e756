// Package mpstest builds the stand-in nvidia-cuda-mps-control (mockmps)
// for tests.
package mpstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Install builds mockmps as <driverRoot>/usr/bin/nvidia-cuda-mps-control
// and returns its path. It is static (no cgo), so it also runs chrooted
// into a driver root that has no libc.
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
	return bin
}

// Package cudatest builds the mock libcuda.so.1 for tests: the cluster
// lane's own, e2e/cluster/fixture/mockcuda/libcuda.c, whose comment lists
// its switches (mockcuda.conf).
package cudatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// Source is the mock's C source, in this repository's e2e tree.
func Source(t testing.TB) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "..", "..", "..", "..", "e2e", "cluster", "fixture", "mockcuda", "libcuda.c")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("the mock libcuda's source is not here: %v", err)
	}
	return src
}

// DriverRoot builds the mock as a driver installs libcuda, in a new driver
// root: usr/lib/<triplet>/libcuda.so.550.54.15 and its soname link, with
// conf as mockcuda.conf beside it. It returns the root and the library
// directory.
func DriverRoot(t testing.TB, conf string) (root, libDir string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "driver")
	libDir = filepath.Join(root, nvml.LibraryDirs(runtime.GOARCH)[0])
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	Build(t, filepath.Join(libDir, "libcuda.so.550.54.15"))
	if err := os.Symlink("libcuda.so.550.54.15", filepath.Join(libDir, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libDir, "mockcuda.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, libDir
}

// CC is the C compiler ($CC, else gcc). It skips the test where there is
// none.
func CC(t testing.TB) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build a stand-in libcuda: %v", cc, err)
	}
	return cc
}

// Build compiles the mock into out, with libcuda's soname, as the cluster
// fixture does. It skips the test where there is no C compiler.
func Build(t testing.TB, out string) {
	t.Helper()
	src, cc := Source(t), CC(t)
	b, err := exec.Command(cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", out, src).CombinedOutput()
	if err != nil {
		t.Fatalf("building the mock libcuda: %v\n%s", err, b)
	}
}

// Package cudatest builds the mock libcuda.so.1 for tests: the cluster
// lane's own, e2e/cluster/fixture/mockcuda/libcuda.c, whose comment lists
// its switches (mockcuda.conf).
package cudatest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// GPU is one GPU of Node: its /dev/nvidia<Minor> and who the mock says it is.
type GPU struct {
	Minor       int
	BusID, UUID string
}

// GPUs are Node's four GPUs.
var GPUs = []GPU{
	{0, "00000000:18:00.0", "GPU-8c1e7d5a-0000-4000-8000-000000000000"},
	{1, "00000000:2A:00.0", "GPU-8c1e7d5a-0000-4000-8000-000000000001"},
	{2, "00000000:3B:00.0", "GPU-8c1e7d5a-0000-4000-8000-000000000002"},
	{3, "00000000:5D:00.0", "GPU-8c1e7d5a-0000-4000-8000-000000000003"},
}

// Node is a fake node of four GPUs: a driver root with the mock libcuda
// (DriverRoot), a /dev with the GPUs' nodes, nvidiactl and null (character
// devices 1:3, as the cluster fixture makes them), and a sysfs.
type Node struct {
	DriverRoot, LibDir, DevRoot, SysRoot string
}

// NewNode makes a Node whose mockcuda.conf names GPUs, then conf's lines.
// It needs root, for mknod.
func NewNode(t testing.TB, conf ...string) Node {
	t.Helper()
	var lines []string
	for _, g := range GPUs {
		lines = append(lines, fmt.Sprintf("gpu %d %s %s", g.Minor, g.BusID, g.UUID))
	}
	root, libDir := DriverRoot(t, strings.Join(append(lines, conf...), "\n")+"\n")
	n := Node{DriverRoot: root, LibDir: libDir, DevRoot: filepath.Join(t.TempDir(), "dev"), SysRoot: filepath.Join(t.TempDir(), "sys")}
	for _, d := range []string{n.DevRoot, filepath.Join(n.SysRoot, "bus", "pci")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "null"} {
		if err := unix.Mknod(filepath.Join(n.DevRoot, name), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// AddConf adds lines to the mock's switches; the probe reads them when it
// loads the library.
func (n Node) AddConf(t testing.TB, lines ...string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(n.LibDir, "mockcuda.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		t.Fatal(err)
	}
}

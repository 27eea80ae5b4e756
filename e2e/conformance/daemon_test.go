package conformance

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/deviceplugin"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// The NIC pools of config/testdata/example-nics.yaml.
const (
	rdmaNUMA0 = "example.com/rdma_numa0"
	rdmaNUMA1 = "example.com/rdma_numa1"
)

// shortPluginDir returns an empty device-plugin directory outside
// t.TempDir, whose path carries the test name: the NIC resources' socket
// names are long enough for that to overflow sun_path.
func shortPluginDir(t *testing.T, resources ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, r := range resources {
		if p := filepath.Join(dir, deviceplugin.SocketName(r)); len(p) >= maxSocketPath {
			t.Fatalf("socket %s is too long for sun_path; shorten TMPDIR", p)
		}
	}
	return dir
}

// exampleNICResources are the NIC pools of the example config: ConnectX-7
// RDMA NICs, one pool per NUMA node.
func exampleNICResources(t *testing.T) []config.NICResource {
	t.Helper()
	c, err := config.Load("../../config/testdata/example-nics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.NICResources) != 2 || c.NICResources[0].Name != rdmaNUMA0 || c.NICResources[1].Name != rdmaNUMA1 {
		t.Fatalf("example config's NIC pools are %v, want %s and %s", c.NICResources, rdmaNUMA0, rdmaNUMA1)
	}
	return c.NICResources
}

// startDaemon runs the whole serve process, daemon.Run, on cfg with lib
// as NVML (an nvmltest mock: its UUIDs are random, so a test that needs
// them discovers the same instance first). stop cancels it and returns
// what Run returned; it is also called when the test ends, and calling
// it again is harmless.
func startDaemon(t *testing.T, cfg config.Config, lib nvml.Library) (stop func() error) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	open := func(string) (nvml.Library, error) { return lib, nil }
	go func() { done <- daemon.Run(ctx, cfg, open, log) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			deadline := time.NewTimer(waitTimeout)
			defer deadline.Stop()
			select {
			case err = <-done:
			case <-deadline.C:
				// Its goroutines may still log; the test cannot end cleanly.
				t.Fatalf("daemon.Run did not return within %v of being cancelled", waitTimeout)
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
	})
	return stop
}

// driverTree materialises a driver-root manifest (the format of
// cdi/testdata/driver-root/manifest.txt) in a new temporary directory and
// returns its root. Character devices are real where mknod is allowed
// (root) and FIFOs elsewhere; chars says which. It is the cdi package's
// test helper, which lives in a _test.go file and so cannot be imported.
func driverTree(t *testing.T, manifest string) (root string, chars bool) {
	t.Helper()
	root = t.TempDir()
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	chars = true
	// parent creates the parent of rel, refusing to go through a link that
	// leaves the tree (an absolute link resolves on the real host here).
	parent := func(rel string) string {
		dir := filepath.Join(root, filepath.Dir(rel))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("manifest: %s: %v", rel, err)
		}
		if real, err := filepath.EvalSymlinks(dir); err != nil || !strings.HasPrefix(real+"/", realRoot+"/") {
			t.Fatalf("manifest: %s: parent %s leaves the tree (%s, %v)", rel, dir, real, err)
		}
		return filepath.Join(root, rel)
	}
	sc := bufio.NewScanner(strings.NewReader(manifest))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		bad := func(err error) {
			if err != nil {
				t.Fatalf("manifest line %d %q: %v", n, sc.Text(), err)
			}
		}
		switch {
		case f[0] == "file" && len(f) == 2:
			bad(os.WriteFile(parent(f[1]), nil, 0o644))
		case f[0] == "dir" && len(f) == 2:
			bad(os.MkdirAll(parent(f[1]), 0o755))
		case f[0] == "link" && len(f) == 3:
			bad(os.Symlink(f[2], parent(f[1])))
		case f[0] == "char" && len(f) == 4:
			major, err := strconv.ParseUint(f[2], 10, 32)
			bad(err)
			minor, err := strconv.ParseUint(f[3], 10, 32)
			bad(err)
			p := parent(f[1])
			if chars {
				if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor)))); err != nil {
					chars = false
				}
			}
			if !chars {
				bad(unix.Mkfifo(p, 0o666))
			}
		default:
			t.Fatalf("manifest line %d %q: want file, dir, link or char", n, sc.Text())
		}
	}
	return root, chars
}

// driverManifest is the cdi package's fake driver root: driver 550.54.15
// and the /dev of a DGX A100.
func driverManifest(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../cdi/testdata/driver-root/manifest.txt")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

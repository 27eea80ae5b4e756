package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

var profile = filepath.Join("..", "..", "profiles", "dgx-h100.profile")

// build is the plugin and the mock library, built once for the tests the
// way the e2e harness builds them, so the build cache they share makes it
// a link.
var build = sync.OnceValues(func() (options, error) {
	dir, err := os.MkdirTemp("", "first-look-test")
	if err != nil {
		return options{}, err
	}
	plugin := filepath.Join(dir, "gpu-device-plugin")
	cmd := exec.Command("go", "build", "-o", plugin, "./cmd/gpu-device-plugin")
	cmd.Dir = filepath.Join("..", "..", "..")
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" {
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return options{}, fmt.Errorf("building the plugin: %w\n%s", err, out)
	}
	mock, err := mocknvml.Build(filepath.Join(dir, "mock"))
	return options{plugin: plugin, mock: mock, profile: profile}, err
})

func TestMain(m *testing.M) {
	code := m.Run()
	if o, err := build(); err == nil {
		os.RemoveAll(filepath.Dir(o.plugin))
	}
	os.Exit(code)
}

func built(t *testing.T) options {
	t.Helper()
	o, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// nodeDir is the mock node's folder, as the first look names it.
var nodeDir = regexp.MustCompile(`its files in (\S+)`)

// TestFirstLook runs what make first-look runs after its builds, so the
// README's first command cannot rot: each step under its heading, serve's
// Allocate answer, the XID's GPU Unhealthy, and nothing left behind.
func TestFirstLook(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), built(t), &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []string{
		"\n== The mock node: 8 × NVIDIA H100 80GB HBM3 (profile dgx-h100)",
		"\n== 1. gpu-device-plugin list: ",
		"\n$ gpu-device-plugin list\n",
		"\n== 2. gpu-device-plugin allocate --size 2: ",
		"\n$ gpu-device-plugin allocate --size 2\n",
		"\n0-1   18 ", // the pair allocate chose, over 18 NVLinks
		"\n== 3. gpu-device-plugin serve: ",
		`msg="registered with kubelet"`,
		"ListAndWatch: 8 devices of nvidia.com/gpu, 8 Healthy",
		"  CDI     gpu-device-plugin.github.io/gpu=GPU-",
		"  device  /dev/nvidia0, /dev/nvidia1   (its GPUs)",
		"  mount   /usr/lib/libnvidia-ml.so.",
		"\n== 4. A health change: ",
		`new=Unhealthy reason="xid=79"`,
		"GPU-a4c123b1-612d-d272-d137-1c17149d4395 Unhealthy",
		"; 7 of 8 GPUs left for pods",
		"Allocate of it is refused: ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the first look does not show %q", want)
		}
	}
	// list and allocate show their warnings: the mock node should give none.
	if n := strings.Count(got, "level=WARN"); n != 1 {
		t.Errorf("%d warnings; want only serve's health change", n)
	}
	assertGone(t, got)
}

// TestFirstLookInterrupted: Ctrl-C while serve runs stops it and removes
// the node.
func TestFirstLookInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &cancelAt{mark: "ListAndWatch: 8 devices", cancel: cancel}
	err := run(ctx, built(t), w)
	if err == nil {
		t.Fatalf("the first look ran to its end after the interrupt:\n%s", w.String())
	}
	if !strings.Contains(w.String(), "\n== 3.") {
		t.Fatalf("interrupted before serve (%v):\n%s", err, w.String())
	}
	assertGone(t, w.String())
}

// assertGone checks that the node folder in the output is removed and no
// plugin process runs from the test's binary anymore.
func assertGone(t *testing.T, out string) {
	t.Helper()
	m := nodeDir.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output names no node folder:\n%s", out)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the node folder %s is still there (%v)", m[1], err)
	}
	plugin := built(t).plugin
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.HasPrefix(b, []byte(plugin+"\x00")) {
			t.Errorf("a plugin process is still running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// cancelAt is an output that cancels once mark is written.
type cancelAt struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	mark   string
	cancel context.CancelFunc
}

func (c *cancelAt) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if strings.Contains(c.buf.String(), c.mark) {
		c.cancel()
	}
	return len(p), nil
}

func (c *cancelAt) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

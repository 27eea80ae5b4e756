package ondisk

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func gpus(t *testing.T) []nvml.GPU {
	t.Helper()
	inv, err := nvml.Discover(nvmltest.NewDGXA100(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return inv.GPUs
}

// At start the plugin keeps its specs of kinds it still serves (running
// containers restart with their names), removes its own of kinds it no
// longer serves (an older version's nvidia.com/gpu file among them), never
// touches another vendor's, and warns, naming the file, about any other
// spec that defines our GPU kind.
func TestSpecStoreStart(t *testing.T) {
	const toolkit = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    env: [A=1]\n"
	const clash = "cdiVersion: 0.5.0\nkind: " + cdi.GPUKind + "\ndevices:\n- name: \"0\"\n  containerEdits:\n    env: [A=1]\n"
	setup := func(t *testing.T) string {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json"), "{}")
		writeFile(t, filepath.Join(dir, "gpu-device-plugin_nvidia.com-gpu.json"), "{}")
		writeFile(t, filepath.Join(dir, "gpu-device-plugin_example.com-gone.json"), "{}")
		writeFile(t, filepath.Join(dir, "nvidia.yaml"), toolkit)
		writeFile(t, filepath.Join(dir, "someone-else.yaml"), clash)
		return dir
	}
	tests := []struct {
		name string
		cdi  bool
		want []string
	}{
		{"cdi-cri keeps its GPU spec", true,
			[]string{"gpu-device-plugin_gpu-device-plugin.github.io-gpu.json", "nvidia.yaml", "someone-else.yaml"}},
		{"back to envvar removes every spec of ours", false,
			[]string{"nvidia.yaml", "someone-else.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := setup(t)
			o := Options{SpecDir: dir, CDI: tt.cdi}
			var logs logtest.Buffer
			s, err := NewStore(o, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if got := listDir(t, dir); !slices.Equal(got, tt.want) {
				t.Errorf("spec dir holds %v, want %v", got, tt.want)
			}
			if (s != nil) != tt.cdi {
				t.Errorf("store %v with CDI %v", s, tt.cdi)
			}
			warned := strings.Contains(logs.String(), filepath.Join(dir, "someone-else.yaml"))
			if warned != tt.cdi || strings.Contains(logs.String(), "nvidia.yaml") {
				t.Errorf("warning names the clashing file: %v, want %v; logs:\n%s", warned, tt.cdi, logs.String())
			}
		})
	}
}

// A spec that cannot be written is retried until it lands; meanwhile
// Ensure refuses, so Allocate hands out no name nothing defines.
func TestSpecStoreRetriesUntilWritable(t *testing.T) {
	base := t.TempDir()
	blocker := filepath.Join(base, "cdi")
	writeFile(t, blocker, "a file where the spec directory should be")
	o := Options{SpecDir: filepath.Join(blocker, "specs"), CDI: true, DevRoot: t.TempDir(), DriverRoot: t.TempDir()}
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := NewStore(o, log)
	if err != nil {
		t.Fatal(err)
	}
	store.retryMin, store.retryMax = time.Millisecond, 4*time.Millisecond
	rounds := make(chan int, 100)
	store.retried = func(failed int) { rounds <- failed }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go store.Run(ctx)

	g, err := NewGPU(o, store, gpus(t), nil, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Ensure(); !errors.Is(err, device.ErrNotReady) {
		t.Fatalf("Ensure with an unwritable dir = %v, want ErrNotReady", err)
	}
	// A few failed rounds, logged as an error once.
	for range 3 {
		if n := <-rounds; n != 1 {
			t.Fatalf("retry round left %d failed, want 1", n)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for one unwritable spec, want 1:\n%s", n, logs.String())
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	for n := range rounds {
		if n == 0 {
			break
		}
	}
	if err := g.Ensure(); err != nil {
		t.Fatalf("Ensure once the dir is writable: %v", err)
	}
	if got := listDir(t, o.SpecDir); !slices.Equal(got, []string{"gpu-device-plugin_gpu-device-plugin.github.io-gpu.json"}) {
		t.Errorf("spec dir holds %v", got)
	}
	if !strings.Contains(logs.String(), "wrote CDI spec after failures") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}

// A control node that appears after start (nvidia-uvm at the first CUDA
// call) is in the spec before the next name is handed out.
func TestGPUSpecsFollowControlNodes(t *testing.T) {
	o := Options{SpecDir: t.TempDir(), CDI: true, DevRoot: t.TempDir(), DriverRoot: t.TempDir()}
	writeFile(t, filepath.Join(o.DevRoot, "nvidiactl"), "")
	log := slog.New(slog.DiscardHandler)
	store, err := NewStore(o, log)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGPU(o, store, gpus(t), nil, log)
	if err != nil {
		t.Fatal(err)
	}
	read := func() string { return readGPUSpec(t, o.SpecDir) }
	if s := read(); !strings.Contains(s, `"/dev/nvidiactl"`) || strings.Contains(s, "nvidia-uvm") {
		t.Fatalf("first spec:\n%s", s)
	}
	writeFile(t, filepath.Join(o.DevRoot, "nvidia-uvm"), "")
	if err := g.Ensure(); err != nil {
		t.Fatal(err)
	}
	if s := read(); !strings.Contains(s, `"/dev/nvidia-uvm"`) {
		t.Fatalf("spec after nvidia-uvm appeared lacks it:\n%s", s)
	}
}

// A hook missing at start is left out of the spec, said once with what
// breaks, and reported; once installed, the next check puts it in.
func TestGPUSpecsFollowTheHook(t *testing.T) {
	root, _ := cditest.Tree(t, cditest.Manifest(t)) // a driver, so the spec has hook arguments to give
	o := Options{SpecDir: t.TempDir(), CDI: true, DevRoot: filepath.Join(root, "dev"), DriverRoot: root, HookPath: filepath.Join(t.TempDir(), cdi.HookName)}
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	store, err := NewStore(o, log)
	if err != nil {
		t.Fatal(err)
	}
	var heard []bool
	g, err := NewGPU(o, store, gpus(t), func(ok bool, _ error) { heard = append(heard, ok) }, log)
	if err != nil {
		t.Fatal(err)
	}
	read := func() string { return readGPUSpec(t, o.SpecDir) }
	if s := read(); strings.Contains(s, cdi.HookName) {
		t.Fatalf("spec runs a hook that is not installed:\n%s", s)
	}
	if err := g.Ensure(); err != nil { // no change: said once
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "not installed at "+o.HookPath); n != 1 || !strings.Contains(logs.String(), "CUDA fails at its first call") {
		t.Errorf("%d warnings, want 1 saying what breaks:\n%s", n, logs.String())
	}
	writeFile(t, o.HookPath, "#!/bin/sh\n")
	if err := os.Chmod(o.HookPath, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := g.refresh(false, true); err != nil { // Watch's next tick
		t.Fatal(err)
	}
	if err := g.Ensure(); err != nil {
		t.Fatal(err)
	}
	if s := read(); !strings.Contains(s, o.HookPath) {
		t.Fatalf("spec after the hook was installed lacks it:\n%s", s)
	}
	if !slices.Equal(heard, []bool{false, true}) {
		t.Errorf("observer heard %v, want [false true]", heard)
	}
}

// readGPUSpec reads the GPU spec the plugin wrote in dir.
func readGPUSpec(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

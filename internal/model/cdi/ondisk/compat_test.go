package ondisk

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"
)

// The spec files of the release this one follows (commit c596a2d), in
// testdata/c596a2d under the names it gave them, with "$ROOT" for the test
// host's root: its GPU spec of the mock DGX A100 (the UUIDs below, the
// cditest driver tree, the hook at its default path) and the spec of the
// pool example.com/rdma_numa0 of the DGX H100 NIC fixture.
const (
	previousGPUSpec = "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json"
	previousNICSpec = "gpu-device-plugin_example.com-rdma_numa0.json"
	nicPool         = "example.com/rdma_numa0"
)

// fixedGPUs are the mock DGX A100's GPUs with the UUIDs the previous
// release's spec names.
func fixedGPUs(t *testing.T) []nvml.GPU {
	t.Helper()
	s := nvmltest.NewDGXA100()
	for i := range s.Devices {
		nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-%d1b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d%d", i, i)
	}
	inv, err := nvml.Discover(s, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return inv.GPUs
}

// The file names are the contract between releases: the same kind is
// the same file, under the owner's prefix, which each release cleans of
// the kinds it does not serve. cdiVersion is what runtimes read: 0.5.0 is
// the newest the CDI library v0.5.4 reads, which containerd 1.7 and the
// CRI-O of its time vendor; the plugin's specs need no newer version.
func TestSpecNamesAndVersionArePinned(t *testing.T) {
	if cdi.DefaultOwner != "gpu-device-plugin" {
		t.Errorf("owner %q: the previous release cleans only files starting gpu-device-plugin_", cdi.DefaultOwner)
	}
	w := cdi.Writer{Dir: "/specs"}
	for kind, want := range map[string]string{cdi.GPUKind: previousGPUSpec, nicPool: previousNICSpec} {
		if p, err := w.Path(kind); err != nil || filepath.Base(p) != want {
			t.Errorf("spec file of %s is %s (%v), the previous release's is %s", kind, p, err, want)
		}
	}
	for _, name := range []string{previousGPUSpec, previousNICSpec} {
		b, err := os.ReadFile(filepath.Join("testdata", "c596a2d", name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"cdiVersion": "0.5.0"`) {
			t.Errorf("the previous release's %s is not cdiVersion 0.5.0:\n%.80s", name, b)
		}
	}
}

// An upgrade from the previous release, with its specs on disk: this
// release writes its GPU spec over the previous one's file, keeps the NIC
// pool's, leaves no second file defining our names (a CDI cache would drop
// every name two specs define, failing every container that uses them)
// and removes its own owner's file of another name that a newer release
// might have left; every name resolves, to this release's file.
func TestSpecsOfThePreviousRelease(t *testing.T) {
	root, _ := cditest.Tree(t, cditest.Manifest(t))
	dir := t.TempDir()
	for _, name := range []string{previousGPUSpec, previousNICSpec} {
		b, err := os.ReadFile(filepath.Join("testdata", "c596a2d", name))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name), strings.ReplaceAll(string(b), "$ROOT", root))
	}
	prev, err := os.ReadFile(filepath.Join(dir, previousGPUSpec))
	if err != nil {
		t.Fatal(err)
	}
	// A newer release's file of our GPU kind under another name.
	writeFile(t, filepath.Join(dir, "gpu-device-plugin_gpu-device-plugin.github.io-gpu.yaml"), strings.Replace(string(prev), `"cdiVersion": "0.5.0"`, `"cdiVersion": "1.1.0"`, 1))

	o := Options{SpecDir: dir, CDI: true, NICResources: []string{nicPool}, DevRoot: filepath.Join(root, "dev"), DriverRoot: root, HookPath: filepath.Join(t.TempDir(), cdi.HookName)}
	writeFile(t, o.HookPath, "#!/bin/sh\n")
	if err := os.Chmod(o.HookPath, 0o755); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	store, err := NewStore(o, log)
	if err != nil {
		t.Fatal(err)
	}
	gpus := fixedGPUs(t)
	if _, err := NewGPU(o, store, gpus, nil, log); err != nil {
		t.Fatal(err)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{previousNICSpec, previousGPUSpec}) {
		t.Fatalf("spec dir holds %v, want the previous release's two file names", got)
	}
	ours := readGPUSpec(t, dir)
	if ours == string(prev) {
		t.Fatal("the GPU spec was not rewritten (the hook path differs, so it must be)")
	}
	if !strings.Contains(ours, `"cdiVersion": "0.5.0"`) || !strings.Contains(ours, o.HookPath) {
		t.Errorf("this release's GPU spec, with the hook, is not cdiVersion 0.5.0:\n%.200s", ours)
	}

	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	names := []string{cdi.QualifiedName(nicPool, "0000:18:00.0")}
	for _, g := range gpus {
		names = append(names, cdi.QualifiedName(cdi.GPUKind, g.UUID), cdi.QualifiedName(cdi.GPUKind, fmt.Sprint(g.Index)))
	}
	for _, n := range names {
		d := cache.GetDevice(n)
		if d == nil {
			t.Errorf("%s does not resolve", n)
			continue
		}
		want := previousGPUSpec
		if strings.HasPrefix(n, nicPool) {
			want = previousNICSpec
		}
		if got := filepath.Base(d.GetSpec().GetPath()); got != want {
			t.Errorf("%s is defined by %s, want %s", n, got, want)
		}
	}
}

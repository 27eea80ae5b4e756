package nicscan

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config/configtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// nicFixture is the DGX-H100-like tree with docs/nic-pools.md's pools, CDI specs
// and device-information files in temporary directories.
type nicFixture struct {
	root    string // the tree: sys/, dev/, proc/
	cfg     config.Config
	infoDir string
	specs   *ondisk.Store
}

func newNICFixture(t *testing.T) *nicFixture {
	t.Helper()
	root, cfg := configtest.NICPools(t, config.Default())
	specs, err := ondisk.NewStore(ondisk.Options{SpecDir: cfg.CDISpecDir, CDI: cfg.UsesCDI()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DeviceInfoDir = filepath.Join(t.TempDir(), "devinfo", "dp")
	return &nicFixture{root: root, cfg: cfg, infoDir: cfg.DeviceInfoDir, specs: specs}
}

func (f *nicFixture) server(t *testing.T, mets *metrics.Metrics) *Scanner {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	pools, err := nic.NewPools(f.cfg.NICResources, nic.Options{DevRoot: f.cfg.DevRoot, Strategies: f.cfg.DeviceListStrategy, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{SysfsRoot: f.cfg.SysfsRoot, ProcRoot: f.cfg.ProcRoot, Interval: f.cfg.NICRescanInterval.Duration,
		Front: noFront{}, Specs: f.specs, Info: devinfo.NewLocked(f.infoDir), Log: log}
	if mets != nil {
		o.Metrics = mets.NICs()
	}
	return New(pools, o)
}

// noFront serves nothing: these tests look at what a scan leaves on disk
// and in metrics.
type noFront struct{}

func (noFront) SetNICDevices(*nic.Pool, []device.Device, bool) {}
func (noFront) ServeNICs(context.Context) error                { return nil }

// A driver rebind that renumbers uverbsN changes no device ID, health or
// NUMA node; the CDI spec must follow it anyway, or cdi-cri hands a pod
// another NIC's verbs device.
func TestNICRescanRewritesCDISpecAfterRenumber(t *testing.T) {
	f := newNICFixture(t)
	s := f.server(t, nil)
	s.Rescan(true)
	if entries, _ := os.ReadDir(f.infoDir); len(entries) != 0 {
		t.Fatalf("a scan wrote device-information files before any Allocate: %v", entries)
	}
	spec := filepath.Join(f.cfg.CDISpecDir, "gpu-device-plugin_example.com-rdma_numa0.json")
	before, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(before), "/dev/infiniband/uverbs0") {
		t.Fatalf("spec before the rebind has no uverbs0:\n%s", before)
	}
	dev := filepath.Join(f.root, "sys", "devices", "pci0000:00", "0000:18:00.0", "infiniband_verbs")
	if err := os.Rename(filepath.Join(dev, "uverbs0"), filepath.Join(dev, "uverbs8")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(f.root, "dev", "infiniband", "uverbs0"), filepath.Join(f.root, "dev", "infiniband", "uverbs8")); err != nil {
		t.Fatal(err)
	}
	s.Rescan(false)
	after, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(after), "/dev/infiniband/uverbs0") || !strings.Contains(string(after), "/dev/infiniband/uverbs8") {
		t.Errorf("after the rebind the spec still says:\n%s", after)
	}
}

// Stale files of our pools go: at start those of NICs not present, later
// those of NICs in no pool. A member that disappears keeps its file (a pod
// may hold it); other plugins' files are never touched.
func TestNICStaleDeviceInfoRemoved(t *testing.T) {
	f := newNICFixture(t)
	if err := os.MkdirAll(f.infoDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{ // name -> kept at start
		"example.com-rdma_numa0-0000:18:00.0-device.json": true,  // present member
		"example.com-rdma_numa0-0000:77:00.0-device.json": false, // not on the node
		"example.com-rdma_numa1-0000:18:00.0-device.json": false, // another pool's NIC
		"intel.com-sriov-0000:77:00.2-device.json":        true,  // not ours
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(f.infoDir, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := f.server(t, nil)
	s.Rescan(true)
	for name, kept := range files {
		_, err := os.Stat(filepath.Join(f.infoDir, name))
		if (err == nil) != kept {
			t.Errorf("%s: present=%v after start, want %v", name, err == nil, kept)
		}
	}
	// The kept file of a present NIC was refreshed to its real content.
	if data, _ := os.ReadFile(filepath.Join(f.infoDir, "example.com-rdma_numa0-0000:18:00.0-device.json")); !strings.Contains(string(data), `"pci-address": "0000:18:00.0"`) {
		t.Errorf("the kept file was not refreshed: %s", data)
	}

	// The NIC goes away while a pod may hold it: its file stays.
	if err := os.RemoveAll(filepath.Join(f.root, "sys", "bus", "pci", "devices", "0000:18:00.0")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(f.root, "sys", "devices", "pci0000:00", "0000:18:00.0")); err != nil {
		t.Fatal(err)
	}
	s.Rescan(false)
	if _, err := os.Stat(filepath.Join(f.infoDir, "example.com-rdma_numa0-0000:18:00.0-device.json")); err != nil {
		t.Errorf("a removed member's file went while it is still listed: %v", err)
	}
	// A file of a NIC in no pool is removed at the next rescan.
	stray := filepath.Join(f.infoDir, "example.com-rdma_numa1-0000:40:00.0-device.json")
	if err := os.WriteFile(stray, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Rescan(false)
	if _, err := os.Stat(stray); err == nil {
		t.Error("a file of a NIC outside its pool survived a rescan")
	}
}

// NIC health reaches the metrics as GPU health does: a gauge per device
// from the start, and a transition counted when a NIC fails.
func TestNICHealthMetrics(t *testing.T) {
	f := newNICFixture(t)
	reg := exposition.NewRegistry()
	m, err := metrics.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := f.server(t, m)
	s.Rescan(true)
	s.Rescan(false) // no change: nothing counted
	// gather reads /metrics as Prometheus would.
	gather := func() map[string]float64 {
		t.Helper()
		var b strings.Builder
		if _, err := reg.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		families, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, fam := range families {
			for _, s := range fam.GetMetric() {
				key := fam.GetName()
				for _, l := range s.GetLabel() {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				got[key] = s.GetGauge().GetValue() + s.GetCounter().GetValue()
			}
		}
		return got
	}
	const (
		healthy40 = "gpu_device_plugin_device_healthy,device=0000:40:00.0,reason=,resource=example.com/rdma_numa0"
		gone40    = "gpu_device_plugin_device_healthy,device=0000:40:00.0,reason=removed: gone from sysfs,resource=example.com/rdma_numa0"
		trans40   = "gpu_device_plugin_health_transitions_total,device=0000:40:00.0,reason=removed: gone from sysfs,resource=example.com/rdma_numa0,to=Unhealthy"
		info40    = "gpu_device_plugin_device_info,device=0000:40:00.0,index=,model=15b3:1021,numa_node=0,pci_bus_id=0000:40:00.0,resource=example.com/rdma_numa0,uuid="
	)
	got := gather()
	if v, ok := got[healthy40]; !ok || v != 1 {
		t.Errorf("%s = %v (present %v), want 1; all: %v", healthy40, v, ok, got)
	}
	if v, ok := got[info40]; !ok || v != 1 {
		t.Errorf("%s = %v (present %v), want 1; all: %v", info40, v, ok, got)
	}
	for k := range got {
		if strings.HasPrefix(k, "gpu_device_plugin_health_transitions_total,") {
			t.Errorf("a transition counted before any change: %s", k)
		}
	}
	if err := os.RemoveAll(filepath.Join(f.root, "sys", "bus", "pci", "devices", "0000:40:00.0")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(f.root, "sys", "devices", "pci0000:00", "0000:40:00.0")); err != nil {
		t.Fatal(err)
	}
	s.Rescan(false)
	s.Rescan(false)
	got = gather()
	if _, ok := got[healthy40]; ok {
		t.Errorf("the healthy series of the gone NIC is still there: %v", got)
	}
	if v, ok := got[gone40]; !ok || v != 0 || got[trans40] != 1 {
		t.Errorf("after the NIC went: %s = %v (present %v), %s = %v, want 0 and 1; all: %v", gone40, v, ok, trans40, got[trans40], got)
	}
	// Its facts stay: it may still be allocated.
	if got[info40] != 1 {
		t.Errorf("%s = %v after the NIC went, want 1", info40, got[info40])
	}
}

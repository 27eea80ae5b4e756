package dpnode

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config/configtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
)

// nicFixture is the DGX-H100-like tree with docs/nic-pools.md's pools,
// scanned once, their CDI specs written, in temporary directories.
type nicFixture struct {
	cfg     config.Config
	pools   *nic.Pools
	infoDir string
	specs   *ondisk.Store
}

func newNICFixture(t *testing.T) *nicFixture {
	t.Helper()
	_, cfg := configtest.NICPools(t, config.Default())
	log := slog.New(slog.DiscardHandler)
	specs, err := ondisk.NewStore(ondisk.Options{SpecDir: cfg.CDISpecDir, CDI: cfg.UsesCDI()}, log)
	if err != nil {
		t.Fatal(err)
	}
	pools, err := nic.NewPools(cfg.NICResources, nic.Options{DevRoot: cfg.DevRoot, Strategies: cfg.DeviceListStrategy, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	scan, err := sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: cfg.SysfsRoot, ProcRoot: cfg.ProcRoot, Log: log}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range pools.Rescan(scan) {
		spec, err := u.Pool.CDISpec()
		if err != nil {
			t.Fatal(err)
		}
		specs.Publish(u.Pool.Resource(), spec)
	}
	return &nicFixture{cfg: cfg, pools: pools, infoDir: filepath.Join(t.TempDir(), "devinfo", "dp"), specs: specs}
}

func (f *nicFixture) pool(t *testing.T, resource string) *nic.Pool {
	t.Helper()
	for _, p := range f.pools.All() {
		if p.Resource() == resource {
			return p
		}
	}
	t.Fatalf("no pool %s", resource)
	return nil
}

// Allocate of a NIC writes the file Multus reads for it: the spec's name
// and content, with the NIC's PCI address and RDMA device.
func TestNICAllocateWritesDeviceInfo(t *testing.T) {
	f := newNICFixture(t)
	pool := f.pool(t, "example.com/rdma_numa0")
	b := nicBackend{pool: pool, specs: f.specs, info: devinfo.NewLocked(f.infoDir)}
	resp, err := b.Allocate([]string{"0000:18:00.0"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Env["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0"] != "0000:18:00.0" {
		t.Errorf("the pool's own answer is lost: %v", resp.Env)
	}
	p := filepath.Join(f.infoDir, "example.com-rdma_numa0-0000:18:00.0-device.json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("no device-information file after Allocate: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	pci, _ := got["pci"].(map[string]any)
	if got["type"] != "pci" || got["version"] != devinfo.Version || pci["pci-address"] != "0000:18:00.0" || pci["rdma-device"] != "mlx5_0" {
		t.Errorf("%s holds %s", p, data)
	}

	t.Run("refuses while the pool's CDI spec cannot be written", func(t *testing.T) {
		// A file where the spec directory was: every write fails.
		dir := f.cfg.CDISpecDir
		if err := os.Rename(dir, dir+".away"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		restore := func() {
			if err := os.Remove(dir); err == nil {
				if err := os.Rename(dir+".away", dir); err != nil {
					t.Fatal(err)
				}
			}
		}
		defer restore()
		spec, err := pool.CDISpec()
		if err != nil {
			t.Fatal(err)
		}
		f.specs.Publish(pool.Resource(), spec)
		_, err = b.Allocate([]string{"0000:40:00.0"})
		if !errors.Is(err, device.ErrNotReady) || !strings.Contains(err.Error(), pool.Resource()) {
			t.Fatalf("Allocate with the spec unwritten: %v, want ErrNotReady naming the pool", err)
		}
		restore()
		f.specs.Publish(pool.Resource(), spec)
		if _, err := b.Allocate([]string{"0000:40:00.0"}); err != nil {
			t.Fatalf("Allocate once the spec is written: %v", err)
		}
	})

	t.Run("fails Allocate when the file cannot be written", func(t *testing.T) {
		blocker := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(blocker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		b := nicBackend{pool: pool, specs: f.specs, info: devinfo.NewLocked(filepath.Join(blocker, "dp"))}
		if _, err := b.Allocate([]string{"0000:40:00.0"}); err == nil || !strings.Contains(err.Error(), "0000:40:00.0") {
			t.Errorf("Allocate with an unwritable directory: %v, want an error naming the NIC", err)
		}
	})
}

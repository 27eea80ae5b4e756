// Package configtest is the configuration tests share: docs/nic-pools.md's
// NIC pools over sysfstest's DGX-H100-like tree. Tests only.
package configtest

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
)

// NICPools is base with the pools of testdata/example-nics.yaml over a
// fresh copy of the DGX-H100-like tree, whose root it returns: envvar and
// cdi-cri answers, CDI specs in a temporary directory.
func NICPools(t testing.TB, base config.Config) (string, config.Config) {
	t.Helper()
	root := sysfstest.Load(t, "dgx-h100")
	_, file, _, _ := runtime.Caller(0)
	example, err := config.Load(filepath.Join(filepath.Dir(file), "..", "testdata", "example-nics.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := base
	cfg.SysfsRoot, cfg.ProcRoot, cfg.DevRoot = filepath.Join(root, "sys"), filepath.Join(root, "proc"), filepath.Join(root, "dev")
	cfg.NICResources = example.NICResources
	cfg.DeviceListStrategy = []string{"envvar", "cdi-cri"}
	cfg.CDISpecDir = t.TempDir()
	return root, cfg
}

package nvml

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestDiscoverRealDriver runs discovery against the machine's own driver and
// /sys; it skips where no NVIDIA driver is installed.
func TestDiscoverRealDriver(t *testing.T) {
	lib, err := Open(LibraryPath("", ""))
	if errors.Is(err, ErrNoDriver) {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if ret := lib.Shutdown(); ret != gonvml.SUCCESS {
			t.Errorf("Shutdown: %v", ret)
		}
	})

	var buf bytes.Buffer
	inv, err := Discover(lib, "/sys", testLogger(&buf))
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	checkTopologyShape(t, inv)
	if inv.DriverVersion == "" {
		t.Error("no driver version")
	}
	for _, g := range inv.GPUs {
		if !strings.HasPrefix(g.UUID, "GPU-") || g.PCIBusID == "" || g.NUMANode < -1 || g.MemoryBytes == 0 {
			t.Errorf("implausible GPU %+v", g)
		}
	}
	t.Logf("inventory: %+v\nlog:\n%s", inv, buf.String())
}

package mocknvml

import (
	"bytes"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// discoverCase is what the plugin's discovery must find on one profile.
type discoverCase struct {
	name    string
	profile string
	gpus    int
	// noSysfs leaves the fake sysfs empty, so NUMA nodes come from NVML.
	noSysfs bool
	nvlinks func(i, j int) int
	pcie    func(i, j int) nvml.LinkLevel
}

func sameHalf(n int) func(i, j int) bool {
	return func(i, j int) bool { return i/(n/2) == j/(n/2) }
}

var discoverCases = []discoverCase{
	{
		name: "dgx-h100 links every pair with 18 NVLinks", profile: "dgx-h100", gpus: 8,
		nvlinks: func(i, j int) int { return 18 },
		pcie: func(i, j int) nvml.LinkLevel {
			if sameHalf(8)(i, j) {
				return nvml.LinkSameNUMA
			}
			return nvml.LinkCrossCPU
		},
	},
	{
		name: "pcie-4gpu has no NVLink and two PCIe switches", profile: "pcie-4gpu", gpus: 4,
		nvlinks: func(i, j int) int { return 0 },
		pcie: func(i, j int) nvml.LinkLevel {
			if sameHalf(4)(i, j) {
				return nvml.LinkSingleSwitch
			}
			return nvml.LinkCrossCPU
		},
	},
	{
		name: "pcie-4gpu takes NUMA nodes from NVML without sysfs", profile: "pcie-4gpu", gpus: 4, noSysfs: true,
		nvlinks: func(i, j int) int { return 0 },
		pcie: func(i, j int) nvml.LinkLevel {
			if sameHalf(4)(i, j) {
				return nvml.LinkSingleSwitch
			}
			return nvml.LinkCrossCPU
		},
	},
	{
		name: "hgx-16 links only inside each island", profile: "hgx-16", gpus: 16,
		nvlinks: func(i, j int) int {
			if sameHalf(16)(i, j) {
				return 18
			}
			return 0
		},
		pcie: func(i, j int) nvml.LinkLevel {
			switch {
			case i/2 == j/2:
				return nvml.LinkSingleSwitch
			case sameHalf(16)(i, j):
				return nvml.LinkSameNUMA
			default:
				return nvml.LinkCrossCPU
			}
		},
	},
}

func TestDiscover(t *testing.T) {
	for _, c := range discoverCases {
		t.Run(c.name, func(t *testing.T) {
			runChild(t, "TestChildDiscover", envCase+"="+c.name, "MOCK_NVML_PROFILE="+profilePath(c.profile))
		})
	}
}

// TestChildDiscover runs the plugin's discovery through go-nvml's real
// binding against the mock library, and checks what it finds against the
// profile as LoadProfile reads it and against the case's topology.
func TestChildDiscover(t *testing.T) {
	childOnly(t)
	var c discoverCase
	for _, dc := range discoverCases {
		if dc.name == os.Getenv(envCase) {
			c = dc
		}
	}
	if c.name == "" {
		t.Fatalf("no discover case %q", os.Getenv(envCase))
	}
	prof, err := LoadProfile(os.Getenv("MOCK_NVML_PROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	sysfsRoot := t.TempDir()
	if !c.noSysfs {
		if err := prof.WriteSysfs(sysfsRoot); err != nil {
			t.Fatal(err)
		}
	}

	lib, err := nvml.Open(os.Getenv(envLib))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != gonvml.SUCCESS {
			t.Errorf("Shutdown: %v", ret)
		}
	}()
	var logs bytes.Buffer
	inv, err := nvml.Discover(lib, sysfsRoot, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	t.Logf("discovery log:\n%s", logs.String())
	// The mock answers everything discovery asks; only a missing sysfs is worth a warning.
	if warned := strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR"); warned != c.noSysfs {
		t.Errorf("discovery warned: %v, want %v", warned, c.noSysfs)
	}

	if inv.DriverVersion != prof.DriverVersion || inv.NVMLVersion != prof.NVMLVersion || inv.CUDADriverVersion != prof.CUDADriverVersion {
		t.Errorf("versions = %q %q %d, want %q %q %d", inv.DriverVersion, inv.NVMLVersion, inv.CUDADriverVersion,
			prof.DriverVersion, prof.NVMLVersion, prof.CUDADriverVersion)
	}
	if len(inv.GPUs) != c.gpus || len(prof.GPUs) != c.gpus {
		t.Fatalf("found %d GPUs, profile has %d, want %d", len(inv.GPUs), len(prof.GPUs), c.gpus)
	}
	for i, got := range inv.GPUs {
		p := prof.GPUs[i]
		want := nvml.GPU{
			Index: i, UUID: p.UUID, Minor: p.Minor, Name: p.Name, MemoryBytes: p.MemoryBytes(),
			PCIBusID: p.BusID, NUMANode: p.NUMANode,
			Brand: p.Brand, Architecture: p.Architecture, CUDAComputeCapability: p.ComputeCapability,
			Virtualization: nvml.VirtualizationNone,
		}
		if p.VGPUHost != nil {
			want.Virtualization = nvml.VirtualizationVGPU
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("GPU %d:\n got %+v\nwant %+v", i, got, want)
		}
		if !strings.HasPrefix(got.PCIBusID, "0000:") || strings.ToLower(got.PCIBusID) != got.PCIBusID {
			t.Errorf("GPU %d: bus id %q is not canonical", i, got.PCIBusID)
		}
	}
	for i := range c.gpus {
		for j := range c.gpus {
			want := nvml.Link{NVLinks: c.nvlinks(i, j), PCIe: c.pcie(i, j)}
			if i == j {
				want = nvml.Link{PCIe: nvml.LinkSameBoard}
			}
			if got := inv.Topology.Between(i, j); got != want {
				t.Errorf("link %d-%d = %+v, want %+v", i, j, got, want)
			}
		}
	}
}

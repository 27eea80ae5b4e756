package nvml

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// writeNUMANodes builds a fake sysfs tree with a numa_node file per address.
func writeNUMANodes(t *testing.T, root string, nodes map[string]string) {
	t.Helper()
	for addr, content := range nodes {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// dgxSysfs is the kernel's view of the mock DGX A100: GPUs 0-3 on node 0,
// 4-7 on node 1.
func dgxSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	nodes := map[string]string{}
	for i := range 8 {
		nodes[nvmltest.GPUAddress(i)] = []string{"0\n", "1\n"}[i/4]
	}
	writeNUMANodes(t, root, nodes)
	return root
}

func testLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func discover(t *testing.T, lib Library, sysfsRoot string) (*Inventory, string) {
	t.Helper()
	var buf bytes.Buffer
	inv, err := Discover(lib, sysfsRoot, testLogger(&buf))
	if err != nil {
		t.Fatalf("Discover: %v\nlog:\n%s", err, buf.String())
	}
	checkTopologyShape(t, inv)
	return inv, buf.String()
}

// checkTopologyShape pins what holds for every inventory: a square,
// symmetric matrix with zero-value diagonal, handles in GPU order.
func checkTopologyShape(t *testing.T, inv *Inventory) {
	t.Helper()
	n := len(inv.GPUs)
	if len(inv.Topology.Links) != n {
		t.Fatalf("topology has %d rows, want %d", len(inv.Topology.Links), n)
	}
	for i := range n {
		if len(inv.Topology.Links[i]) != n {
			t.Fatalf("topology row %d has %d columns, want %d", i, len(inv.Topology.Links[i]), n)
		}
		if got := inv.Topology.Between(i, i); got != (Link{}) {
			t.Errorf("diagonal %d = %+v, want the zero Link", i, got)
		}
		for j := range n {
			if inv.Topology.Between(i, j) != inv.Topology.Between(j, i) {
				t.Errorf("link %d-%d = %+v but %d-%d = %+v", i, j, inv.Topology.Between(i, j), j, i, inv.Topology.Between(j, i))
			}
		}
		if inv.Handle(i) == nil {
			t.Errorf("Handle(%d) is nil", i)
		}
	}
	if inv.Handle(n) != nil || inv.Handle(-1) != nil {
		t.Error("Handle out of range is not nil")
	}
}

func TestDiscoverDGXA100(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	inv, _ := discover(t, srv, dgxSysfs(t))

	if len(inv.GPUs) != 8 {
		t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
	}
	if inv.DriverVersion != "550.54.15" || inv.NVMLVersion != "12.550.54.15" || inv.CUDADriverVersion != 12040 {
		t.Errorf("versions = %q %q %d", inv.DriverVersion, inv.NVMLVersion, inv.CUDADriverVersion)
	}
	for i, g := range inv.GPUs {
		d := nvmltest.Device(srv, i)
		want := GPU{
			Index:       i,
			UUID:        d.UUID,
			Minor:       i,
			Name:        "Mock NVIDIA A100-SXM4-40GB",
			MemoryBytes: 42949672960,
			PCIBusID:    nvmltest.GPUAddress(i),
			NUMANode:    i / 4,
			// A100s can do MIG; the mock's is off.
			MIGCapable: true,

			Brand:                 "nvidia",
			Architecture:          "ampere",
			CUDAComputeCapability: "8.0",
			Virtualization:        VirtualizationNone,
		}
		if !reflect.DeepEqual(g, want) {
			t.Errorf("GPU %d = %+v, want %+v", i, g, want)
		}
		if inv.Handle(i) != srv.Devices[i] {
			t.Errorf("Handle(%d) is not NVML device %d", i, i)
		}
	}
}

func TestDiscoverPCIeLevels(t *testing.T) {
	inv, _ := discover(t, nvmltest.NewDGXA100(), dgxSysfs(t))
	tests := []struct {
		name string
		i, j int
		want LinkLevel
	}{
		{name: "pair behind one switch tree", i: 0, j: 1, want: LinkMultiSwitch},
		{name: "same NUMA node across host bridges", i: 0, j: 2, want: LinkSameNUMA},
		{name: "across sockets", i: 0, j: 7, want: LinkCrossCPU},
		{name: "second socket pair", i: 6, j: 7, want: LinkMultiSwitch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := inv.Topology.Between(tt.i, tt.j).PCIe; got != tt.want {
				t.Errorf("PCIe %d-%d = %d, want %d", tt.i, tt.j, got, tt.want)
			}
		})
	}
}

func TestPCIeLevelMapping(t *testing.T) {
	tests := []struct {
		name  string
		level gonvml.GpuTopologyLevel
		ret   gonvml.Return
		want  LinkLevel
	}{
		{name: "internal", level: gonvml.TOPOLOGY_INTERNAL, want: LinkSameBoard},
		{name: "single switch", level: gonvml.TOPOLOGY_SINGLE, want: LinkSingleSwitch},
		{name: "multiple switches", level: gonvml.TOPOLOGY_MULTIPLE, want: LinkMultiSwitch},
		{name: "host bridge", level: gonvml.TOPOLOGY_HOSTBRIDGE, want: LinkHostBridge},
		{name: "same NUMA node", level: gonvml.TOPOLOGY_NODE, want: LinkSameNUMA},
		{name: "across CPUs", level: gonvml.TOPOLOGY_SYSTEM, want: LinkCrossCPU},
		{name: "level NVML adds later", level: 60, want: LinkUnknown},
		{name: "query fails", ret: gonvml.ERROR_NOT_SUPPORTED, want: LinkUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &mock.Device{
				GetTopologyCommonAncestorFunc: func(gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
					return tt.level, tt.ret
				},
			}
			if got := pcieLevel(a, &mock.Device{}); got != tt.want {
				t.Errorf("pcieLevel = %d, want %d", got, tt.want)
			}
		})
	}
}

// setLinks makes GPU i of srv report remotes[link] as the far end of each
// link; an empty remote is a link that is not enabled.
func setLinks(srv *dgxa100.Server, i int, remotes []string) {
	d := nvmltest.Device(srv, i)
	d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
		if link >= len(remotes) {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		if remotes[link] == "" {
			return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
		}
		return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
		if link >= len(remotes) || remotes[link] == "" {
			return gonvml.PciInfo{}, gonvml.ERROR_INVALID_ARGUMENT
		}
		return nvmltest.PciInfo(remotes[link]), gonvml.SUCCESS
	}
}

func repeat(addr string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = addr
	}
	return out
}

// p2pOnlyWithin makes NVML's NVLink P2P status OK only inside each group of
// GPUs, as a driver does for GPUs not joined by NVLink.
func p2pOnlyWithin(srv *dgxa100.Server, group func(i int) int) {
	for i := range srv.Devices {
		nvmltest.Device(srv, i).GetP2PStatusFunc = func(peer gonvml.Device, _ gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			if group(peer.(*dgxa100.Device).Index) == group(i) {
				return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
			}
			return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
		}
	}
}

func TestDiscoverNVLinks(t *testing.T) {
	tests := []struct {
		name string
		// setup adjusts the mock DGX A100 (8 GPUs, 12 links each to 6 NVSwitches).
		setup func(srv *dgxa100.Server)
		// want returns the NVLinks expected between GPU positions i < j.
		want func(i, j int) int
	}{
		{
			name:  "NVSwitch fabric links every pair with all its switch links",
			setup: func(*dgxa100.Server) {},
			want:  func(i, j int) int { return 12 },
		},
		{
			name: "NVSwitch fabric without P2P answers is still linked",
			setup: func(srv *dgxa100.Server) {
				for i := range srv.Devices {
					nvmltest.Device(srv, i).GetP2PStatusFunc = func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
						return 0, gonvml.ERROR_NOT_SUPPORTED
					}
				}
			},
			want: func(i, j int) int { return 12 },
		},
		{
			name: "a GPU with a disabled switch link gives its peers the smaller count",
			setup: func(srv *dgxa100.Server) {
				remotes := make([]string, 12)
				for l := range remotes {
					remotes[l] = nvmltest.SwitchAddress(l / 2)
				}
				remotes[0] = ""
				setLinks(srv, 0, remotes)
			},
			want: func(i, j int) int {
				if i == 0 {
					return 11
				}
				return 12
			},
		},
		{
			name: "direct pairs link only the partners",
			setup: func(srv *dgxa100.Server) {
				srv.DeviceGetCountFunc = func() (int, gonvml.Return) { return 4, gonvml.SUCCESS }
				for i := range 4 {
					setLinks(srv, i, repeat(nvmltest.GPUAddress(i^1), 4))
				}
				p2pOnlyWithin(srv, func(i int) int { return i / 2 })
			},
			want: func(i, j int) int {
				if i/2 == j/2 {
					return 4
				}
				return 0
			},
		},
		{
			name: "two switch fabrics link only within each",
			setup: func(srv *dgxa100.Server) {
				for i := range 8 {
					remotes := make([]string, 12)
					for l := range remotes {
						remotes[l] = nvmltest.SwitchAddress(3*(i/4) + l/4)
					}
					setLinks(srv, i, remotes)
				}
				p2pOnlyWithin(srv, func(i int) int { return i / 4 })
			},
			want: func(i, j int) int {
				if i/4 == j/4 {
					return 12
				}
				return 0
			},
		},
		{
			name: "unreadable remote ends fall back to P2P status and active links",
			setup: func(srv *dgxa100.Server) {
				for i := range 8 {
					nvmltest.Device(srv, i).GetNvLinkRemotePciInfoFunc = func(int) (gonvml.PciInfo, gonvml.Return) {
						return gonvml.PciInfo{}, gonvml.ERROR_NOT_SUPPORTED
					}
				}
				// GPU 5 has only 6 links up.
				nvmltest.Device(srv, 5).GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
					if link >= 12 {
						return 0, gonvml.ERROR_INVALID_ARGUMENT
					}
					if link >= 6 {
						return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
					}
					return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
				}
			},
			want: func(i, j int) int {
				if i == 5 || j == 5 {
					return 6
				}
				return 12
			},
		},
		{
			name: "P2P over NVLink with no link state still counts one link",
			setup: func(srv *dgxa100.Server) {
				for i := range 8 {
					nvmltest.Device(srv, i).GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) {
						return 0, gonvml.ERROR_NOT_SUPPORTED
					}
				}
			},
			want: func(i, j int) int { return 1 },
		},
		{
			name: "PCIe-only machine has no NVLinks",
			setup: func(srv *dgxa100.Server) {
				for i := range 8 {
					d := nvmltest.Device(srv, i)
					d.GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) {
						return 0, gonvml.ERROR_NOT_SUPPORTED
					}
					d.GetP2PStatusFunc = func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
						return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
					}
				}
			},
			want: func(i, j int) int { return 0 },
		},
		{
			name: "links into a skipped GPU are not read as a switch",
			setup: func(srv *dgxa100.Server) {
				// Four GPUs in a full mesh, two links per pair; GPU 3 is lost.
				srv.DeviceGetCountFunc = func() (int, gonvml.Return) { return 4, gonvml.SUCCESS }
				for i := range 4 {
					var remotes []string
					for j := range 4 {
						if j != i {
							remotes = append(remotes, repeat(nvmltest.GPUAddress(j), 2)...)
						}
					}
					setLinks(srv, i, remotes)
				}
				nvmltest.Device(srv, 3).GetUUIDFunc = func() (string, gonvml.Return) {
					return "", gonvml.ERROR_GPU_IS_LOST
				}
			},
			want: func(i, j int) int { return 2 },
		},
		{
			name: "a failing link walk ends that GPU's walk only",
			setup: func(srv *dgxa100.Server) {
				srv.DeviceGetCountFunc = func() (int, gonvml.Return) { return 4, gonvml.SUCCESS }
				for i := range 4 {
					setLinks(srv, i, repeat(nvmltest.GPUAddress(i^1), 4))
				}
				nvmltest.Device(srv, 2).GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) {
					return 0, gonvml.ERROR_UNKNOWN
				}
				p2pOnlyWithin(srv, func(i int) int { return i / 2 })
			},
			// GPU 3 still sees its four links to GPU 2.
			want: func(i, j int) int {
				if i/2 == j/2 {
					return 4
				}
				return 0
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			tt.setup(srv)
			inv, log := discover(t, srv, dgxSysfs(t))
			if len(inv.GPUs) < 2 {
				t.Fatalf("discovered %d GPUs", len(inv.GPUs))
			}
			for i := range inv.GPUs {
				for j := i + 1; j < len(inv.GPUs); j++ {
					if got, want := inv.Topology.Between(i, j).NVLinks, tt.want(i, j); got != want {
						t.Errorf("NVLinks %d-%d = %d, want %d", i, j, got, want)
					}
				}
			}
			if t.Failed() {
				t.Logf("log:\n%s", log)
			}
		})
	}
}

func TestDiscoverNUMA(t *testing.T) {
	tests := []struct {
		name string
		// sysfs is the numa_node content for GPU 2; nil removes the file.
		sysfs *string
		// nvmlNode and nvmlRet are what NVML's GetNumaNodeId says for GPU 2.
		nvmlNode int
		nvmlRet  gonvml.Return
		want     int
		wantLog  string // substring of the log; "" for none expected
	}{
		{name: "sysfs wins over NVML", sysfs: ptr("0\n"), nvmlNode: 3, want: 0},
		{name: "sysfs -1 is kept", sysfs: ptr("-1\n"), nvmlNode: 0, want: -1},
		{name: "missing file falls back to NVML", sysfs: nil, nvmlNode: 1, want: 1, wantLog: "using NVML's NUMA node"},
		{name: "malformed file falls back to NVML", sysfs: ptr("abc\n"), nvmlNode: 1, want: 1, wantLog: "sysfs numa_node unreadable"},
		{name: "empty file falls back to NVML", sysfs: ptr(""), nvmlNode: 1, want: 1, wantLog: "malformed"},
		{name: "NVML -1 stays unknown", sysfs: nil, nvmlNode: -1, want: -1, wantLog: "NUMA node unknown"},
		{name: "NVML unsupported stays unknown", sysfs: nil, nvmlRet: gonvml.ERROR_NOT_SUPPORTED, want: -1, wantLog: "NUMA node unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := dgxSysfs(t)
			numaFile := filepath.Join(root, "bus", "pci", "devices", nvmltest.GPUAddress(2), "numa_node")
			if tt.sysfs == nil {
				if err := os.Remove(numaFile); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(numaFile, []byte(*tt.sysfs), 0o644); err != nil {
				t.Fatal(err)
			}
			srv := nvmltest.NewDGXA100()
			nvmltest.Device(srv, 2).GetNumaNodeIdFunc = func() (int, gonvml.Return) {
				return tt.nvmlNode, tt.nvmlRet
			}

			inv, log := discover(t, srv, root)

			if got := inv.GPUs[2].NUMANode; got != tt.want {
				t.Errorf("NUMA node = %d, want %d", got, tt.want)
			}
			for i, g := range inv.GPUs {
				if i != 2 && g.NUMANode != i/4 {
					t.Errorf("GPU %d NUMA node = %d, want %d", i, g.NUMANode, i/4)
				}
			}
			if tt.wantLog == "" {
				if strings.Contains(log, "numa") {
					t.Errorf("unexpected NUMA log:\n%s", log)
				}
				return
			}
			if !strings.Contains(log, tt.wantLog) || !strings.Contains(log, "device="+nvmltest.GPUAddress(2)) {
				t.Errorf("log does not contain %q for device %s:\n%s", tt.wantLog, nvmltest.GPUAddress(2), log)
			}
		})
	}
}

func TestDiscoverWithoutSysfs(t *testing.T) {
	inv, log := discover(t, nvmltest.NewDGXA100(), t.TempDir())
	for i, g := range inv.GPUs {
		if g.NUMANode != i/4 {
			t.Errorf("GPU %d NUMA node = %d, want NVML's %d", i, g.NUMANode, i/4)
		}
	}
	if !strings.Contains(log, "is the host /sys mounted?") {
		t.Errorf("log does not hint at the /sys mount:\n%s", log)
	}
}

func TestDiscoverSkipsBrokenGPU(t *testing.T) {
	lost := func() gonvml.Return { return gonvml.ERROR_GPU_IS_LOST }
	tests := []struct {
		name   string
		break3 func(srv *dgxa100.Server)
		reason string
	}{
		{
			name: "UUID lost",
			break3: func(srv *dgxa100.Server) {
				nvmltest.Device(srv, 3).GetUUIDFunc = func() (string, gonvml.Return) { return "", lost() }
			},
			reason: "ERROR_GPU_IS_LOST",
		},
		{
			name: "no handle",
			break3: func(srv *dgxa100.Server) {
				srv.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
					if i == 3 {
						return nil, gonvml.ERROR_UNKNOWN
					}
					return srv.Devices[i], gonvml.SUCCESS
				}
			},
			reason: "ERROR_UNKNOWN",
		},
		{
			name: "PCI info fails",
			break3: func(srv *dgxa100.Server) {
				nvmltest.Device(srv, 3).GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return gonvml.PciInfo{}, lost() }
			},
			reason: "ERROR_GPU_IS_LOST",
		},
		{
			name: "PCI bus id empty",
			break3: func(srv *dgxa100.Server) {
				nvmltest.Device(srv, 3).GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return gonvml.PciInfo{}, gonvml.SUCCESS }
			},
			reason: "malformed",
		},
		{
			name: "minor number fails",
			break3: func(srv *dgxa100.Server) {
				nvmltest.Device(srv, 3).GetMinorNumberFunc = func() (int, gonvml.Return) { return 0, lost() }
			},
			reason: "ERROR_GPU_IS_LOST",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			tt.break3(srv)

			inv, log := discover(t, srv, dgxSysfs(t))

			var indices []int
			for _, g := range inv.GPUs {
				indices = append(indices, g.Index)
			}
			if want := []int{0, 1, 2, 4, 5, 6, 7}; !slices.Equal(indices, want) {
				t.Fatalf("discovered NVML indices %v, want %v", indices, want)
			}
			if inv.Handle(3) != srv.Devices[4] {
				t.Error("Handle(3) is not NVML device 4")
			}
			if got := inv.Topology.Between(2, 3).NVLinks; got != 12 {
				t.Errorf("NVLinks between GPUs 2 and 4 = %d, want 12", got)
			}
			if !strings.Contains(log, "skipping GPU") || !strings.Contains(log, "index=3") || !strings.Contains(log, tt.reason) {
				t.Errorf("log does not explain skipping GPU 3 with %s:\n%s", tt.reason, log)
			}
		})
	}
}

func TestDiscoverKeepsGPUWithoutOptionalFacts(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	d := nvmltest.Device(srv, 0)
	d.GetNameFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
	d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, gonvml.ERROR_UNKNOWN }
	srv.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }

	inv, log := discover(t, srv, dgxSysfs(t))

	if len(inv.GPUs) != 8 {
		t.Fatalf("discovered %d GPUs, want 8", len(inv.GPUs))
	}
	if g := inv.GPUs[0]; g.Name != "" || g.MemoryBytes != 0 || g.UUID != d.UUID {
		t.Errorf("GPU 0 = %+v", g)
	}
	if inv.DriverVersion != "" || !strings.Contains(log, "reading driver version") {
		t.Errorf("driver version %q, log:\n%s", inv.DriverVersion, log)
	}
}

func TestDiscoverErrors(t *testing.T) {
	tests := []struct {
		name   string
		count  func() (int, gonvml.Return)
		wantIs error
	}{
		{name: "count fails", count: func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNINITIALIZED }, wantIs: gonvml.ERROR_UNINITIALIZED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			srv.DeviceGetCountFunc = tt.count
			inv, err := Discover(srv, dgxSysfs(t), nil)
			if err == nil {
				t.Fatalf("Discover = %+v, want an error", inv)
			}
			if !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v does not match %v", err, tt.wantIs)
			}
		})
	}
}

func TestDiscoverNoGPUs(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	srv.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.SUCCESS }
	inv, _ := discover(t, srv, t.TempDir())
	if len(inv.GPUs) != 0 || len(inv.Topology.Links) != 0 {
		t.Errorf("inventory = %+v, want empty", inv)
	}
}

func ptr(s string) *string { return &s }

func TestInventorySelect(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	inv, _ := discover(t, srv, dgxSysfs(t))
	link := inv.Topology.Between(1, 6)
	left := inv.Select(func(g GPU) bool { return g.Index != 0 && g.Index != 5 })
	if len(left) != 2 || left[0].Index != 0 || left[1].Index != 5 {
		t.Fatalf("left out %+v", left)
	}
	if len(inv.GPUs) != 6 || inv.GPUs[0].Index != 1 || inv.GPUs[4].Index != 6 {
		t.Fatalf("kept %+v", inv.GPUs)
	}
	// GPU 6 is now at position 4: handles and links follow it.
	if inv.Handle(4) != srv.Devices[6] {
		t.Error("handles not cut to match")
	}
	if got := inv.Topology.Between(0, 4); got != link {
		t.Errorf("link between GPUs 1 and 6 = %+v, was %+v", got, link)
	}
	if len(inv.Topology.Links) != 6 || len(inv.Topology.Links[0]) != 6 {
		t.Errorf("topology %dx%d", len(inv.Topology.Links), len(inv.Topology.Links[0]))
	}
	if left := inv.Select(func(GPU) bool { return true }); left != nil || len(inv.GPUs) != 6 {
		t.Errorf("keeping all left out %v", left)
	}
}

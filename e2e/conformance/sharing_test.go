package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// migNode is a DGX A100 (40GB GPUs) laid out as operators do: GPU 0
// split 3g.20gb + 2×2g.10gb, GPU 1 7×1g.5gb, GPU 2 in MIG mode with no
// instances, GPUs 3-7 whole. procRoot holds the driver's capability
// files for every instance, devRoot their nodes.
type migNode struct {
	lib                          *dgxa100.Server
	inv                          *nvml.Inventory
	events                       chan<- gonvml.EventData
	sysfsRoot, procRoot, devRoot string
}

// The MIG devices of migNode, by UUID: GPU 0's, then GPU 1's. A GPU
// instance G has capability minor capBase+10G, its compute instance 0
// capBase+10G+1.
const (
	mig3g   = "MIG-00000000-3g"
	capBase = 100
)

var mig2g = []string{"MIG-00000000-2g-a", "MIG-00000000-2g-b"}

func mig1g(k int) string { return fmt.Sprintf("MIG-00000001-1g-%d", k) }

func all1g() []string {
	var out []string
	for k := range 7 {
		out = append(out, mig1g(k))
	}
	return out
}

func newMIGNode(t *testing.T) *migNode {
	t.Helper()
	n := &migNode{lib: nvmltest.NewDGXA100(), procRoot: t.TempDir(), sysfsRoot: dgxSysfs(t)}
	n.events = nvmltest.WithEvents(n.lib)
	nvmltest.WithMIG(n.lib, 0,
		&nvmltest.MIG{UUID: mig3g, GPUInstance: 1, GISlices: 3, MemoryMiB: 19968, Multiprocessors: 42, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE},
		&nvmltest.MIG{UUID: mig2g[0], GPUInstance: 5, GISlices: 2, MemoryMiB: 9856, Multiprocessors: 28, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE},
		&nvmltest.MIG{UUID: mig2g[1], GPUInstance: 6, GISlices: 2, MemoryMiB: 9856, Multiprocessors: 28, GIProfile: gonvml.GPU_INSTANCE_PROFILE_2_SLICE})
	var ones []*nvmltest.MIG
	for k := range 7 {
		ones = append(ones, &nvmltest.MIG{UUID: mig1g(k), GPUInstance: 7 + k, GISlices: 1, MemoryMiB: 4864, Multiprocessors: 14, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE})
	}
	nvmltest.WithMIG(n.lib, 1, ones...)
	nvmltest.WithMIG(n.lib, 2)
	inv, err := nvml.Discover(n.lib, n.sysfsRoot, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.inv = inv
	n.devRoot = devTree(t, inv.GPUs)
	// The driver's capability files: a minor per GPU instance and per
	// compute instance, as /proc/driver/nvidia/capabilities has them.
	caps := filepath.Join(n.procRoot, "driver", "nvidia", "capabilities")
	write := func(path string, minor int) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\n", minor)), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(n.devRoot, "nvidia-caps"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.devRoot, "nvidia-caps", "nvidia-cap"+strconv.Itoa(minor)), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(caps, "mig", "config"), 1)
	write(filepath.Join(caps, "mig", "monitor"), 2)
	for _, g := range inv.GPUs {
		for _, m := range g.MIG {
			gi := filepath.Join(caps, "gpu"+strconv.Itoa(g.Minor), "mig", "gi"+strconv.Itoa(m.GPUInstance))
			write(filepath.Join(gi, "access"), capBase+10*m.GPUInstance)
			write(filepath.Join(gi, "ci"+strconv.Itoa(m.ComputeInstance), "access"), capBase+10*m.GPUInstance+1)
		}
	}
	return n
}

func (n *migNode) config(dir string) config.Config {
	cfg := config.Default()
	cfg.DevicePluginDir = dir
	cfg.SysfsRoot = n.sysfsRoot
	cfg.DevRoot, cfg.ProcRoot = n.devRoot, n.procRoot
	return cfg
}

// xid sends an XID on GPU i's handle, naming a MIG instance when gi >= 0
// (ci -1: the whole GPU instance).
func (n *migNode) xid(i int, code uint64, gi, ci int) {
	ev := gonvml.EventData{Device: nvmltest.Device(n.lib, i), EventType: gonvml.EventTypeXidCriticalError, EventData: code,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	if gi >= 0 {
		ev.GpuInstanceId = uint32(gi)
	}
	if ci >= 0 {
		ev.ComputeInstanceId = uint32(ci)
	}
	n.events <- ev
}

// exactly: the kubelet has these device IDs and no others.
func exactly(want ...string) func(map[string]*api.Device) bool {
	want = slices.Sorted(slices.Values(want))
	return func(d map[string]*api.Device) bool { return slices.Equal(slices.Sorted(maps.Keys(d)), want) }
}

func mustAllocate(t *testing.T, e endpoint, ids ...string) *api.ContainerAllocateResponse {
	t.Helper()
	r, err := allocateOne(e, ids...)
	if err != nil {
		t.Fatalf("Allocate %v: %v", ids, err)
	}
	return r
}

func devicePaths(r *api.ContainerAllocateResponse) []string {
	var out []string
	for _, d := range r.Devices {
		out = append(out, d.ContainerPath)
	}
	return out
}

// TestMIGMixed: the kubelet gets one resource per MIG profile and
// nvidia.com/gpu for the GPUs with MIG off; a MIG device is allocated
// with its UUID, its parent's node and its two capability nodes; an XID
// naming an instance turns only that device Unhealthy at the kubelet,
// one naming none every MIG device of the GPU.
func TestMIGMixed(t *testing.T) {
	n := newMIGNode(t)
	resources := []string{resname.GPU, "nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb"}
	dir := shortPluginDir(t, resources...)
	k, _ := startKubelet(t, dir)
	cfg := n.config(dir)
	cfg.MIGStrategy = config.MIGStrategyMixed
	// Health's own attribution of an XID to one MIG instance: the
	// remediation, on by default, decides per GPU and would withhold
	// every instance of a GPU that fell off the bus.
	cfg.Remediation.Enabled = false
	startDaemon(t, cfg, n.lib)

	var whole []string
	for _, g := range n.inv.GPUs[3:] {
		whole = append(whole, g.UUID)
	}
	k.waitDevices(t, resname.GPU, "GPUs 3-7", exactly(whole...))
	k.waitDevices(t, "nvidia.com/mig-3g.20gb", "the 3g.20gb", exactly(mig3g))
	k.waitDevices(t, "nvidia.com/mig-2g.10gb", "two 2g.10gb", exactly(mig2g...))
	got := k.waitDevices(t, "nvidia.com/mig-1g.5gb", "seven 1g.5gb", exactly(all1g()...))
	if nodes := got[mig1g(3)].Topology.GetNodes(); len(nodes) != 1 || nodes[0].ID != 0 {
		t.Errorf("MIG device topology = %v, want its parent's NUMA node 0", got[mig1g(3)].Topology)
	}

	e := k.waitConnected(t, "nvidia.com/mig-2g.10gb")
	r := mustAllocate(t, e, mig2g[1])
	if v := r.Envs[gpu.VisibleDevicesEnv]; v != mig2g[1] {
		t.Errorf("%s = %q, want %s", gpu.VisibleDevicesEnv, v, mig2g[1])
	}
	want := []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(capBase+60), "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(capBase+61), "/dev/nvidiactl", "/dev/nvidia-uvm"}
	if got := devicePaths(r); !slices.Equal(got, want) {
		t.Errorf("device nodes = %v, want %v (never the mig/config or mig/monitor capability)", got, want)
	}

	// gi 9 holds 1g.5gb number 2 of GPU 1.
	n.xid(1, 79, 9, 0)
	k.waitDevices(t, "nvidia.com/mig-1g.5gb", "only the XID's instance Unhealthy", func(d map[string]*api.Device) bool {
		for _, id := range all1g() {
			if want := id == mig1g(2); (d[id].Health == api.Unhealthy) != want {
				return false
			}
		}
		return true
	})
	// No instance named: every MIG device of GPU 0, nothing else.
	n.xid(0, 79, -1, -1)
	k.waitDevices(t, "nvidia.com/mig-2g.10gb", "GPU 0's MIG devices Unhealthy", func(d map[string]*api.Device) bool {
		return d[mig2g[0]].Health == api.Unhealthy && d[mig2g[1]].Health == api.Unhealthy
	})
	k.waitDevices(t, "nvidia.com/mig-3g.20gb", "GPU 0's MIG devices Unhealthy", healthOf(mig3g, api.Unhealthy))
	if d := k.waitDevices(t, resname.GPU, "whole GPUs", exactly(whole...)); d[whole[0]].Health != api.Healthy {
		t.Errorf("GPU 3 turned %s by GPU 0's XID", d[whole[0]].Health)
	}
}

// TestMIGSingle: one size is served as nvidia.com/gpu, the node's most
// common; the GPUs with MIG off and other sizes are left out.
func TestMIGSingle(t *testing.T) {
	n := newMIGNode(t)
	dir := shortPluginDir(t, resname.GPU)
	k, _ := startKubelet(t, dir)
	cfg := n.config(dir)
	cfg.MIGStrategy = config.MIGStrategySingle
	startDaemon(t, cfg, n.lib)
	k.waitDevices(t, resname.GPU, "the seven 1g.5gb", exactly(all1g()...))
	e := k.waitConnected(t, resname.GPU)
	r := mustAllocate(t, e, mig1g(6), mig1g(0))
	if v := r.Envs[gpu.VisibleDevicesEnv]; v != mig1g(0)+","+mig1g(6) {
		t.Errorf("%s = %q", gpu.VisibleDevicesEnv, v)
	}
	if got := devicePaths(r); strings.Count(strings.Join(got, " "), "/dev/nvidia1 ") != 1 {
		t.Errorf("parent node not exactly once: %v", got)
	}
}

// TestTimeSlicing: four replicas per GPU; two replicas of one GPU name
// it once; preferred allocation spreads; an XID on a shared GPU turns all
// its replicas Unhealthy at the kubelet and no other device.
func TestTimeSlicing(t *testing.T) {
	n := newMIGNode(t)
	// MIG off everywhere: plain GPUs.
	for i := range 3 {
		nvmltest.Device(n.lib, i).MigMode = 0
	}
	inv, err := nvml.Discover(n.lib, n.sysfsRoot, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	dir := shortPluginDir(t, resname.GPU+".shared")
	k, _ := startKubelet(t, dir)
	cfg := n.config(dir)
	cfg.Sharing.TimeSlicing = config.TimeSlicing{RenameByDefault: true, Resources: []config.SharedResource{{Name: resname.GPU, Replicas: 4}}}
	startDaemon(t, cfg, n.lib)

	const shared = resname.GPU + ".shared"
	var all []string
	for _, g := range inv.GPUs {
		for r := range 4 {
			all = append(all, g.UUID+"::"+strconv.Itoa(r))
		}
	}
	k.waitDevices(t, shared, "32 replicas", exactly(all...))
	e := k.waitConnected(t, shared)
	g3 := inv.GPUs[3].UUID
	r := mustAllocate(t, e, g3+"::2", g3+"::0")
	if v := r.Envs[gpu.VisibleDevicesEnv]; v != g3 {
		t.Errorf("%s = %q, want %s once", gpu.VisibleDevicesEnv, v, g3)
	}
	pref, err := e.plugin.API().GetPreferredAllocation(context.Background(), &api.PreferredAllocationRequest{
		ContainerRequests: []*api.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: all, AllocationSize: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := pref.ContainerResponses[0].DeviceIDs; len(got) != 2 || strings.Split(got[0], "::")[0] == strings.Split(got[1], "::")[0] {
		t.Errorf("preferred = %v, want replicas of two GPUs (distributed)", got)
	}

	n.xid(3, 79, -1, -1)
	k.waitDevices(t, shared, "GPU 3's four replicas Unhealthy, nothing else", func(d map[string]*api.Device) bool {
		for id, dev := range d {
			if (dev.Health == api.Unhealthy) != strings.HasPrefix(id, g3+"::") {
				return false
			}
		}
		return true
	})
}

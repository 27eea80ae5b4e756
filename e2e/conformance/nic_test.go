package conformance

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// poolNICs are the dgx-h100 fixture's ConnectX-7s by the example pool
// that takes them, each with its uverbs node.
var poolNICs = map[string]map[string]string{
	rdmaNUMA0: {"0000:18:00.0": "uverbs0", "0000:40:00.0": "uverbs1", "0000:4f:00.0": "uverbs2", "0000:5e:00.0": "uverbs3"},
	rdmaNUMA1: {"0000:9a:00.0": "uverbs4", "0000:c0:00.0": "uverbs5", "0000:ce:00.0": "uverbs6", "0000:dc:00.0": "uverbs7"},
}

// poolNUMA is the NUMA node of each example pool's NICs.
var poolNUMA = map[string]int64{rdmaNUMA0: 0, rdmaNUMA1: 1}

// removeNIC takes 0000:5e:00.0 (rdma_numa0, uverbs3) out of the tree in
// the kernel's order: the bus entry first, then the device's directory.
const removeNIC = `
rm sys/bus/pci/devices/0000:5e:00.0
rm sys/class/net/ibp94s0
rm sys/devices/pci0000:00/0000:5e:00.0
rm dev/infiniband/uverbs3
`

// hotPlugNIC adds a ninth ConnectX-7 at 0000:29:00.0 on NUMA node 0 with
// uverbs8, written like the fixture's own; the bus link comes last, so a
// scan never sees it half written.
const hotPlugNIC = `
file sys/devices/pci0000:00/0000:29:00.0/vendor 0x15b3
file sys/devices/pci0000:00/0000:29:00.0/device 0x1021
file sys/devices/pci0000:00/0000:29:00.0/class 0x020700
file sys/devices/pci0000:00/0000:29:00.0/modalias pci:v000015B3d00001021sv000015B3sd00000000bc02sc07i00
file sys/devices/pci0000:00/0000:29:00.0/numa_node 0
link sys/devices/pci0000:00/0000:29:00.0/driver ../../../bus/pci/drivers/mlx5_core
dir  sys/kernel/iommu_groups/28
link sys/devices/pci0000:00/0000:29:00.0/iommu_group ../../../kernel/iommu_groups/28
file sys/devices/pci0000:00/0000:29:00.0/net/ibp41s0/operstate up
file sys/devices/pci0000:00/0000:29:00.0/net/ibp41s0/carrier 1
file sys/devices/pci0000:00/0000:29:00.0/net/ibp41s0/type 32
file sys/devices/pci0000:00/0000:29:00.0/infiniband/mlx5_8/ports/1/link_layer InfiniBand
file sys/devices/pci0000:00/0000:29:00.0/infiniband/mlx5_8/ports/1/state 4: ACTIVE
dir  sys/devices/pci0000:00/0000:29:00.0/infiniband_verbs/uverbs8
file dev/infiniband/uverbs8
link sys/class/net/ibp41s0 ../../devices/pci0000:00/0000:29:00.0/net/ibp41s0
link sys/bus/pci/devices/0000:29:00.0 ../../../devices/pci0000:00/0000:29:00.0
`

const (
	removedNIC    = "0000:5e:00.0"
	hotPluggedNIC = "0000:29:00.0"
)

// TestNICPools runs the whole serve process, GPUs and the example NIC
// pools, against the kubelet's registration server and ListAndWatch
// client, on the dgx-h100 fixture tree, then changes the tree under it.
func TestNICPools(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	dir := shortPluginDir(t, resname.GPU, rdmaNUMA0, rdmaNUMA1)
	k, _ := startKubelet(t, dir)

	cfg := config.Default()
	cfg.DevicePluginDir = dir
	cfg.SysfsRoot, cfg.ProcRoot, cfg.DevRoot = filepath.Join(root, "sys"), filepath.Join(root, "proc"), filepath.Join(root, "dev")
	cfg.NICResources = exampleNICResources(t)
	// Below the 100ms config validation allows: daemon.Run does not
	// validate, and a short interval keeps the hot-plug waits short.
	cfg.NICRescanInterval = config.Duration{Duration: 50 * time.Millisecond}
	startDaemon(t, cfg, nvmltest.NewDGXA100())

	k.waitConnected(t, resname.GPU)
	k.waitDevices(t, resname.GPU, "8 devices", all8)
	pools := map[string]endpoint{}
	for _, res := range []string{rdmaNUMA0, rdmaNUMA1} {
		pools[res] = k.waitConnected(t, res)
	}
	devRoot := cfg.DevRoot

	t.Run("each pool lists its four NICs on its NUMA node", func(t *testing.T) {
		for res, nics := range poolNICs {
			got := k.waitDevices(t, res, "its 4 NICs", func(d map[string]*api.Device) bool { return len(d) == len(nics) })
			if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(nics))) {
				t.Errorf("%s lists %v, want %v", res, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(nics)))
			}
			for id, d := range got {
				if d.Health != api.Healthy {
					t.Errorf("%s: %s health = %s, want %s", res, id, d.Health, api.Healthy)
				}
				if nodes := d.Topology.GetNodes(); len(nodes) != 1 || nodes[0].ID != poolNUMA[res] {
					t.Errorf("%s: %s topology = %v, want NUMA node %d", res, id, d.Topology, poolNUMA[res])
				}
			}
			if !pools[res].options.GetGetPreferredAllocationAvailable() {
				t.Errorf("%s options at connection = %v, want GetPreferredAllocationAvailable", res, pools[res].options)
			}
		}
	})

	t.Run("Allocate gives the addresses and the RDMA device nodes", func(t *testing.T) {
		// Asked for in reverse: the answer is sorted by address.
		resp, err := allocateOne(pools[rdmaNUMA0], "0000:40:00.0", "0000:18:00.0")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := resp.Envs["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0"], "0000:18:00.0,0000:40:00.0"; got != want {
			t.Errorf("PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0 = %q, want %q (envs %v)", got, want, resp.Envs)
		}
		if _, ok := resp.Envs[gpu.VisibleDevicesEnv]; ok {
			t.Errorf("a NIC allocation sets %s: %v", gpu.VisibleDevicesEnv, resp.Envs)
		}
		nics := poolNICs[rdmaNUMA0]
		checkNodes(t, resp, devRoot, nics["0000:18:00.0"], nics["0000:40:00.0"], "rdma_cm")
		if len(resp.CdiDevices) > 0 {
			t.Errorf("CDI devices %v with only the envvar strategy", resp.CdiDevices)
		}
	})

	t.Run("Allocate refuses another pool's NIC", func(t *testing.T) {
		const other = "0000:9a:00.0"
		_, err := allocateOne(pools[rdmaNUMA0], other)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), other) {
			t.Fatalf("err = %v, want InvalidArgument naming %s", err, other)
		}
	})

	t.Run("preferred allocation of 2 NICs of the pool", func(t *testing.T) {
		available := slices.Sorted(maps.Keys(poolNICs[rdmaNUMA0]))
		for _, must := range [][]string{nil, {removedNIC}} {
			resp, err := pools[rdmaNUMA0].plugin.API().GetPreferredAllocation(context.Background(), &api.PreferredAllocationRequest{
				ContainerRequests: []*api.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs:   available,
					MustIncludeDeviceIDs: must,
					AllocationSize:       2,
				}},
			})
			if err != nil {
				t.Fatalf("must include %v: %v", must, err)
			}
			if len(resp.ContainerResponses) != 1 {
				t.Fatalf("%d container responses for one container", len(resp.ContainerResponses))
			}
			got := resp.ContainerResponses[0].DeviceIDs
			if len(got) != 2 || got[0] == got[1] {
				t.Errorf("must include %v: got %v, want 2 distinct NICs", must, got)
			}
			for _, id := range got {
				if !slices.Contains(available, id) {
					t.Errorf("must include %v: %s is not among the available NICs", must, id)
				}
			}
			for _, id := range must {
				if !slices.Contains(got, id) {
					t.Errorf("%v lacks must-include %s", got, id)
				}
			}
		}
	})

	t.Run("a removed NIC turns unhealthy and is refused", func(t *testing.T) {
		sysfstest.Apply(t, root, removeNIC)
		got := k.waitDevices(t, rdmaNUMA0, removedNIC+" unhealthy", healthOf(removedNIC, api.Unhealthy))
		if len(got) != 4 {
			t.Errorf("rdma_numa0 lists %d NICs after a removal, want 4: the kubelet must still see the one it may have allocated", len(got))
		}
		for id, d := range got {
			if id != removedNIC && d.Health != api.Healthy {
				t.Errorf("%s health = %s; only %s was removed", id, d.Health, removedNIC)
			}
		}
		// Not pinned: the removed NIC's topology. A rescan that lists it
		// just before it goes reads its attributes as they vanish and keeps
		// those half-read facts (NUMA node -1) as its last ones, so the
		// kubelet's copy loses its NUMA node for good. That race is in the
		// plugin's scanner, not here.
		if nodes := got[removedNIC].Topology.GetNodes(); len(nodes) != 1 || nodes[0].ID != 0 {
			t.Logf("removed NIC's topology = %v, not NUMA node 0: a rescan raced the removal", got[removedNIC].Topology)
		}
		_, err := allocateOne(pools[rdmaNUMA0], removedNIC)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), removedNIC) {
			t.Fatalf("err = %v, want InvalidArgument naming %s", err, removedNIC)
		}
		if _, err := allocateOne(pools[rdmaNUMA0], "0000:4f:00.0"); err != nil {
			t.Errorf("healthy NIC refused while another is gone: %v", err)
		}
		numa1 := k.waitDevices(t, rdmaNUMA1, "its 4 NICs", func(d map[string]*api.Device) bool { return len(d) == 4 })
		for id, d := range numa1 {
			if d.Health != api.Healthy {
				t.Errorf("rdma_numa1: %s health = %s after a rdma_numa0 NIC left", id, d.Health)
			}
		}
	})

	t.Run("a hot-plugged NIC joins its pool", func(t *testing.T) {
		sysfstest.Apply(t, root, hotPlugNIC)
		got := k.waitDevices(t, rdmaNUMA0, hotPluggedNIC+" healthy", healthOf(hotPluggedNIC, api.Healthy))
		if nodes := got[hotPluggedNIC].Topology.GetNodes(); len(nodes) != 1 || nodes[0].ID != 0 {
			t.Errorf("hot-plugged NIC's topology = %v, want NUMA node 0", got[hotPluggedNIC].Topology)
		}
		// Later rescans keep the removed NIC listed, still unhealthy.
		if d := got[removedNIC]; d == nil || d.Health != api.Unhealthy {
			t.Errorf("removed NIC after more rescans = %v, want listed and unhealthy", d)
		}
		want := append(slices.Collect(maps.Keys(poolNICs[rdmaNUMA0])), hotPluggedNIC)
		if ids := slices.Sorted(maps.Keys(got)); !slices.Equal(ids, slices.Sorted(slices.Values(want))) {
			t.Errorf("rdma_numa0 lists %v, want %v", ids, slices.Sorted(slices.Values(want)))
		}
		resp, err := allocateOne(pools[rdmaNUMA0], hotPluggedNIC)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Envs["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0"]; got != hotPluggedNIC {
			t.Errorf("PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0 = %q, want %q", got, hotPluggedNIC)
		}
		checkNodes(t, resp, devRoot, "uverbs8", "rdma_cm")
		numa1 := k.waitDevices(t, rdmaNUMA1, "its 4 NICs", func(d map[string]*api.Device) bool { return len(d) == 4 })
		if _, ok := numa1[hotPluggedNIC]; ok {
			t.Errorf("a NUMA node 0 NIC joined rdma_numa1")
		}
	})

	connects, rejected, _ := k.snapshot()
	if len(rejected) > 0 {
		t.Errorf("kubelet refused connections: %v", rejected)
	}
	if len(connects) != 3 {
		t.Errorf("kubelet accepted %d connections, want 3 (one per resource)", len(connects))
	}
}

// allocateOne asks e for ids in one container through the kubelet's
// client.
func allocateOne(e endpoint, ids ...string) (*api.ContainerAllocateResponse, error) {
	resp, err := e.plugin.API().Allocate(context.Background(), &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, status.Errorf(codes.Internal, "%d container responses for one container", n)
	}
	return resp.ContainerResponses[0], nil
}

// checkNodes checks that resp carries exactly the /dev/infiniband nodes
// named, each from devRoot, read-write.
func checkNodes(t *testing.T, resp *api.ContainerAllocateResponse, devRoot string, names ...string) {
	t.Helper()
	want := map[string]string{}
	for _, n := range names {
		want["/dev/infiniband/"+n] = filepath.Join(devRoot, "infiniband", n)
	}
	got := map[string]string{}
	for _, d := range resp.Devices {
		got[d.ContainerPath] = d.HostPath
		if d.Permissions != "rw" {
			t.Errorf("%s permissions = %q, want rw", d.ContainerPath, d.Permissions)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("device nodes = %v, want %v", got, want)
	}
}

package nic

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

var (
	cx7NUMA0 = []string{"0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0"}
	cx7NUMA1 = []string{"0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0"}
)

// examplePools loads the documented example config.
func examplePools(t *testing.T) []config.NICResource {
	t.Helper()
	c, err := config.Load("../../config/testdata/example-nics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c.NICResources
}

func newPools(t *testing.T, res []config.NICResource, f *fixture) *Pools {
	t.Helper()
	ps, err := NewPools(res, Options{DevRoot: f.devRoot()})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func pool(name string, sel config.NICSelectors) config.NICResource {
	return config.NICResource{Name: name, Selectors: sel}
}

func ids(devs []device.Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.ID
	}
	return out
}

func TestExamplePoolsOnDGX(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, examplePools(t), f)
	updates := ps.Rescan(f.scan(t))
	if len(updates) != 2 {
		t.Fatalf("%d updates, want one per pool", len(updates))
	}
	for i, want := range [][]string{cx7NUMA0, cx7NUMA1} {
		u := updates[i]
		if !u.Changed || !slices.Equal(ids(u.Devices), want) {
			t.Errorf("%s: devices %v (changed %t), want %v", u.Pool.Resource(), ids(u.Devices), u.Changed, want)
		}
		for _, d := range u.Devices {
			if d.NUMANode != i || !d.Healthy {
				t.Errorf("%s: %+v, want healthy on NUMA node %d", u.Pool.Resource(), d, i)
			}
		}
	}
	if got := ps.All()[0].EnvName(); got != "PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0" {
		t.Errorf("EnvName = %s", got)
	}
	if again := ps.Rescan(f.scan(t)); again[0].Changed || again[1].Changed {
		t.Error("a rescan of an unchanged node reported a change")
	}
}

func TestFirstPoolWins(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, []config.NICResource{
		pool("example.com/numa1", config.NICSelectors{NUMANodes: []int{1}, RDMA: ptr(true)}),
		pool("example.com/all", config.NICSelectors{Vendors: []string{"15b3"}}),
	}, f)
	u := ps.Rescan(f.scan(t))
	if !slices.Equal(ids(u[0].Devices), cx7NUMA1) || !slices.Equal(ids(u[1].Devices), cx7NUMA0) {
		t.Errorf("pools = %v / %v; a NIC must join only the first pool that selects it", ids(u[0].Devices), ids(u[1].Devices))
	}
}

func TestNUMAUnknownDevicesHaveNoTopology(t *testing.T) {
	f := load(t, "numa-unknown")
	ps := newPools(t, []config.NICResource{pool("example.com/roce", config.NICSelectors{Vendors: []string{"15b3"}})}, f)
	u := ps.Rescan(f.scan(t))[0]
	if len(u.Devices) != 1 || u.Devices[0].NUMANode != device.NoNUMANode {
		t.Errorf("devices = %+v, want the non-default-route port with no NUMA node", u.Devices)
	}
	got, err := u.Pool.Preferred([]string{"0000:01:00.0"}, nil, 1)
	if err != nil || !slices.Equal(got, []string{"0000:01:00.0"}) {
		t.Errorf("Preferred = %v, %v", got, err)
	}
}

func TestAllocate(t *testing.T) {
	dev := func(root, rel string) device.Node {
		return device.Node{ContainerPath: "/dev/" + rel, HostPath: filepath.Join(root, "dev", rel), Permissions: "rw"}
	}
	t.Run("RDMA NICs", func(t *testing.T) {
		f := load(t, "dgx-h100")
		ps := newPools(t, examplePools(t), f)
		ps.Rescan(f.scan(t))
		resp, err := ps.All()[0].Allocate([]string{"0000:4f:00.0", "0000:18:00.0"})
		if err != nil {
			t.Fatal(err)
		}
		want := &device.Answer{
			Env:   map[string]string{"PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0": "0000:18:00.0,0000:4f:00.0"},
			Nodes: []device.Node{dev(f.root, "infiniband/uverbs0"), dev(f.root, "infiniband/uverbs2"), dev(f.root, "infiniband/rdma_cm")},
		}
		if !reflect.DeepEqual(resp, want) {
			t.Errorf("Allocate =\n%v\nwant\n%v", resp, want)
		}
	})
	t.Run("no rdma_cm on the host", func(t *testing.T) {
		f := load(t, "dgx-h100")
		f.apply(t, "rm dev/infiniband/rdma_cm")
		ps := newPools(t, examplePools(t), f)
		ps.Rescan(f.scan(t))
		resp, err := ps.All()[1].Allocate([]string{"0000:dc:00.0"})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Nodes) != 1 || resp.Nodes[0].ContainerPath != "/dev/infiniband/uverbs7" {
			t.Errorf("devices = %v, want uverbs7 alone", resp.Nodes)
		}
	})
	t.Run("vfio-pci NIC", func(t *testing.T) {
		f := load(t, "vfio")
		ps := newPools(t, []config.NICResource{pool("example.com/dpdk", config.NICSelectors{Drivers: []string{"vfio-pci"}})}, f)
		ps.Rescan(f.scan(t))
		resp, err := ps.All()[0].Allocate([]string{"0000:af:00.0"})
		if err != nil {
			t.Fatal(err)
		}
		want := &device.Answer{
			Env:   map[string]string{"PCIDEVICE_EXAMPLE_COM_DPDK": "0000:af:00.0"},
			Nodes: []device.Node{dev(f.root, "vfio/42"), dev(f.root, "vfio/vfio")},
		}
		if !reflect.DeepEqual(resp, want) {
			t.Errorf("Allocate =\n%v\nwant\n%v", resp, want)
		}
	})
	t.Run("vfio-pci NIC in no-IOMMU mode", func(t *testing.T) {
		f := load(t, "vfio")
		f.apply(t, "rm dev/vfio/42\nfile dev/vfio/noiommu-42")
		ps := newPools(t, []config.NICResource{pool("example.com/dpdk", config.NICSelectors{Drivers: []string{"vfio-pci"}})}, f)
		ps.Rescan(f.scan(t))
		resp, err := ps.All()[0].Allocate([]string{"0000:af:00.0"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Nodes[0].ContainerPath != "/dev/vfio/noiommu-42" {
			t.Errorf("devices = %v", resp.Nodes)
		}
	})
	t.Run("vfio-pci NIC without IOMMU group", func(t *testing.T) {
		f := load(t, "vfio")
		f.apply(t, "rm sys/devices/pci0000:00/0000:af:00.0/iommu_group")
		ps := newPools(t, []config.NICResource{pool("example.com/dpdk", config.NICSelectors{Drivers: []string{"vfio-pci"}})}, f)
		ps.Rescan(f.scan(t))
		if _, err := ps.All()[0].Allocate([]string{"0000:af:00.0"}); err == nil || !strings.Contains(err.Error(), "IOMMU group") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("unknown NIC", func(t *testing.T) {
		f := load(t, "dgx-h100")
		ps := newPools(t, examplePools(t), f)
		ps.Rescan(f.scan(t))
		if _, err := ps.All()[0].Allocate([]string{"0000:9a:00.0"}); !errors.Is(err, ErrUnknownNIC) {
			t.Errorf("allocating another pool's NIC: %v", err)
		}
	})
}

func TestPreferredPacksOneNUMANode(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, []config.NICResource{pool("example.com/rdma", config.NICSelectors{Vendors: []string{"15b3"}})}, f)
	p := ps.Rescan(f.scan(t))[0].Pool
	all := append(slices.Clone(cx7NUMA0), cx7NUMA1...)
	numa := map[string]int{}
	for _, a := range cx7NUMA1 {
		numa[a] = 1
	}
	oneNode := func(got []string) bool {
		for _, a := range got {
			if numa[a] != numa[got[0]] {
				return false
			}
		}
		return true
	}
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
		wantNode  int // -1: any, as long as it is one node
	}{
		{name: "four of eight", available: all, size: 4, wantNode: -1},
		{name: "two follow a must-include on node 1", available: all, must: []string{"0000:ce:00.0"}, size: 2, wantNode: 1},
		{name: "four where only node 1 has four free", available: append(slices.Clone(cx7NUMA0[:3]), cx7NUMA1...), size: 4, wantNode: 1},
		{name: "one goes to the tighter node", available: append(slices.Clone(cx7NUMA0[:1]), cx7NUMA1...), size: 1, wantNode: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.Preferred(tt.available, tt.must, tt.size)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.size || !oneNode(got) || (tt.wantNode >= 0 && numa[got[0]] != tt.wantNode) {
				t.Errorf("Preferred = %v, want %d NICs on one node (node %d)", got, tt.size, tt.wantNode)
			}
			for _, m := range tt.must {
				if !slices.Contains(got, m) {
					t.Errorf("Preferred = %v lacks must-include %s", got, m)
				}
			}
		})
	}
	if _, err := p.Preferred(all, nil, 9); err == nil {
		t.Error("Preferred of more than available succeeded")
	}
}

func TestHealthTransitions(t *testing.T) {
	const (
		addr = "0000:18:00.0"
		dir  = "sys/devices/pci0000:00/0000:18:00.0"
		nd   = dir + "/net/ibp24s0"
		port = dir + "/infiniband/mlx5_0/ports/1"
	)
	steps := []struct {
		name       string
		linkCheck  string // the pool's linkCheck; "" is the default
		directives string
		healthy    bool
		reason     string
	}{
		// An RDMA NIC is judged by its RDMA port by default.
		{name: "RDMA port down", directives: "file " + port + "/state 1: DOWN\nfile " + port + "/phys_state 2: Polling", reason: "RDMA port down: mlx5_0/1: DOWN (Polling)"},
		{name: "RDMA port back", directives: "file " + port + "/state 4: ACTIVE\nfile " + port + "/phys_state 5: LinkUp", healthy: true},
		// Compute nodes often leave IPoIB unconfigured: verbs users do
		// not need it.
		{name: "IPoIB netdev down, port ACTIVE", directives: "file " + nd + "/operstate down\nfile " + nd + "/carrier 0\nfile " + nd + "/flags 0x1002", healthy: true},
		{name: "port physically down", directives: "file " + port + "/phys_state 3: Disabled", reason: "RDMA port down: mlx5_0/1: ACTIVE (Disabled)"},
		{name: "port back again", directives: "file " + port + "/phys_state 5: LinkUp", healthy: true},
		// linkCheck: netdev judges netdevs that are administratively up.
		{name: "netdev check: admin-down netdev is unused", linkCheck: "netdev", healthy: true},
		{name: "netdev check: admin up without carrier", linkCheck: "netdev", directives: "file " + nd + "/flags 0x1003", reason: "link down: ibp24s0"},
		{name: "netdev check: link back up", linkCheck: "netdev", directives: "file " + nd + "/operstate up\nfile " + nd + "/carrier 1", healthy: true},
		{name: "netdev check: RDMA port ignored", linkCheck: "netdev", directives: "file " + port + "/state 1: DOWN", healthy: true},
		{name: "off: nothing judged", linkCheck: "off", directives: "file " + nd + "/operstate down", healthy: true},
		{name: "default: port down again", directives: "file " + nd + "/operstate up", reason: "RDMA port down: mlx5_0/1: DOWN (LinkUp)"},
		{name: "default: port up", directives: "file " + port + "/state 4: ACTIVE", healthy: true},
		// The netdev left for a pod's namespace: its link state is the
		// pod's business, not a fault of the NIC.
		{name: "netdev moved into a pod", linkCheck: "netdev", directives: "file " + nd + "/operstate down\nrm " + dir + "/net\nrm sys/class/net/ibp24s0", healthy: true},
		{name: "netdev back, link up", linkCheck: "netdev", directives: "file " + nd + "/operstate up\nfile " + nd + "/type 32\nlink sys/class/net/ibp24s0 ../../devices/pci0000:00/0000:18:00.0/net/ibp24s0", healthy: true},
		{name: "fell off the bus", directives: "file " + dir + `/config "\xff\xff\xff\xff"`, reason: "PCI device failed: config space reads all ones (fell off the bus)"},
		{name: "recovered", directives: "rm " + dir + "/config", healthy: true},
		{name: "removed", directives: "rm sys/bus/pci/devices/" + addr + "\nrm " + dir, reason: "removed: gone from sysfs"},
	}
	f := load(t, "dgx-h100")
	// One Pools per link check, each seeing every step.
	pools := map[string]*Pools{}
	for _, lc := range []string{"", "netdev", "off"} {
		res := examplePools(t)
		for i := range res {
			res[i].LinkCheck = lc
		}
		pools[lc] = newPools(t, res, f)
		pools[lc].Rescan(f.scan(t))
	}
	was := map[string]device.Device{}
	for lc := range pools {
		was[lc] = device.Device{ID: addr, NUMANode: 0, Healthy: true}
	}
	for _, st := range steps {
		f.apply(t, st.directives)
		scan := f.scan(t)
		for lc, ps := range pools {
			u := ps.Rescan(scan)[0]
			prev := was[lc]
			was[lc] = u.Devices[0]
			if lc != st.linkCheck {
				continue
			}
			if changed := prev.Healthy != st.healthy || prev.Reason != st.reason; u.Changed != changed {
				t.Errorf("%s: Rescan reported Changed=%t, want %t", st.name, u.Changed, changed)
			}
			if !slices.Equal(ids(u.Devices), cx7NUMA0) {
				t.Fatalf("%s: devices %v; a NIC must stay listed whatever its state", st.name, ids(u.Devices))
			}
			d := u.Devices[0]
			if d.Healthy != st.healthy || d.Reason != st.reason {
				t.Errorf("%s: %s healthy=%t reason=%q, want healthy=%t reason=%q", st.name, addr, d.Healthy, d.Reason, st.healthy, st.reason)
			}
			for _, other := range u.Devices[1:] {
				if !other.Healthy {
					t.Errorf("%s: %s became unhealthy too: %s", st.name, other.ID, other.Reason)
				}
			}
		}
	}
	// A removed NIC keeps its last facts, so it keeps its NUMA node.
	if d := pools[""].All()[0].Devices()[0]; d.NUMANode != 0 {
		t.Errorf("removed NIC lost its NUMA node: %+v", d)
	}
}

func TestHotPlug(t *testing.T) {
	f := load(t, "sriov")
	ps := newPools(t, []config.NICResource{pool("example.com/vf", config.NICSelectors{Devices: []string{"101e"}})}, f)
	if u := ps.Rescan(f.scan(t))[0]; !slices.Equal(ids(u.Devices), []string{"0000:3b:00.2", "0000:3b:00.3"}) {
		t.Fatalf("devices before = %v", ids(u.Devices))
	}
	// The operator raises sriov_numvfs from 2 to 3: a VF appears.
	const vf = "sys/devices/pci0000:00/0000:3b:00.4"
	f.apply(t, `
file sys/devices/pci0000:00/0000:3b:00.0/sriov_numvfs 3
link sys/devices/pci0000:00/0000:3b:00.0/virtfn2 ../0000:3b:00.4
file `+vf+`/vendor 0x15b3
file `+vf+`/device 0x101e
file `+vf+`/class 0x020000
file `+vf+`/modalias pci:v000015B3d0000101Esv000015B3sd00000000bc02sc00i00
file `+vf+`/numa_node 0
link `+vf+`/driver ../../../bus/pci/drivers/mlx5_core
link `+vf+`/physfn ../0000:3b:00.0
file `+vf+`/net/ens2f0v2/operstate up
file `+vf+`/net/ens2f0v2/type 1
file `+vf+`/infiniband/mlx5_4/ports/1/link_layer Ethernet
dir  `+vf+`/infiniband_verbs/uverbs4
link sys/bus/pci/devices/0000:3b:00.4 ../../../devices/pci0000:00/0000:3b:00.4
file dev/infiniband/uverbs4
`)
	u := ps.Rescan(f.scan(t))[0]
	if !u.Changed || !slices.Equal(ids(u.Devices), []string{"0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.4"}) {
		t.Fatalf("devices after hot-plug = %v (changed %t)", ids(u.Devices), u.Changed)
	}
	if !u.Devices[2].Healthy || u.Devices[2].NUMANode != 0 {
		t.Errorf("new VF = %+v", u.Devices[2])
	}
	resp, err := u.Pool.Allocate([]string{"0000:3b:00.4"})
	if err != nil || resp.Nodes[0].ContainerPath != "/dev/infiniband/uverbs4" {
		t.Fatalf("Allocate of the new VF = %v, %v", resp, err)
	}
	if got, err := u.Pool.Preferred(ids(u.Devices), []string{"0000:3b:00.4"}, 2); err != nil || len(got) != 2 {
		t.Errorf("Preferred with the new VF = %v, %v", got, err)
	}
}

func TestMembershipSticks(t *testing.T) {
	const dir = "sys/devices/pci0000:00/0000:18:00.0"
	f := load(t, "dgx-h100")
	ps := newPools(t, []config.NICResource{
		pool("example.com/by_netdev", config.NICSelectors{Netdevs: []string{"ibp24s0"}, Drivers: []string{"mlx5_core"}}),
		pool("example.com/rest", config.NICSelectors{Vendors: []string{"15b3"}}),
	}, f)
	ps.Rescan(f.scan(t))

	// The netdev is in a pod now; the netdevs selector no longer matches
	// but the NIC must neither leave its pool nor join the next one.
	f.apply(t, "rm "+dir+"/net\nrm sys/class/net/ibp24s0")
	u := ps.Rescan(f.scan(t))
	if !slices.Equal(ids(u[0].Devices), []string{"0000:18:00.0"}) || !u[0].Devices[0].Healthy || slices.Contains(ids(u[1].Devices), "0000:18:00.0") {
		t.Fatalf("after the netdev moved: %v / %v", u[0].Devices, ids(u[1].Devices))
	}

	// Rebound to vfio-pci: what a pod holding it sees has changed, so no
	// new pod may get it.
	f.apply(t, "link "+dir+"/driver ../../../bus/pci/drivers/vfio-pci\ndir sys/bus/pci/drivers/vfio-pci")
	u = ps.Rescan(f.scan(t))
	if d := u[0].Devices[0]; d.Healthy || !strings.Contains(d.Reason, "no longer matches") || !strings.Contains(d.Reason, "vfio-pci") {
		t.Errorf("after rebinding: %+v", d)
	}
	if slices.Contains(ids(u[1].Devices), "0000:18:00.0") {
		t.Error("a NIC moved to another pool")
	}
}

func TestNICTakesOverDefaultRoute(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, examplePools(t), f)
	ps.Rescan(f.scan(t))
	f.apply(t, "file proc/net/route <<EOF\nIface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\nibp64s0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\nEOF")
	u := ps.Rescan(f.scan(t))[0]
	if d := u.Devices[1]; d.ID != "0000:40:00.0" || d.Healthy || !strings.Contains(d.Reason, "default route") {
		t.Errorf("NIC that took the default route = %+v", d)
	}
}

func TestCheck(t *testing.T) {
	up := sysfs.NIC{Address: "0000:18:00.0", Netdevs: []string{"ib0"}, LinkUp: map[string]bool{"ib0": true}, AdminUp: map[string]bool{"ib0": true}}
	down := sysfs.NIC{Address: "0000:18:00.0", Netdevs: []string{"ib0", "ib1"}, LinkUp: map[string]bool{"ib0": false, "ib1": true}, AdminUp: map[string]bool{"ib0": true, "ib1": true}}
	adminDown := sysfs.NIC{Address: "0000:18:00.0", Netdevs: []string{"eth0"}, LinkUp: map[string]bool{"eth0": false}, AdminUp: map[string]bool{"eth0": false}}
	active := []sysfs.RDMAPort{{Device: "mlx5_0", Port: "1", State: "ACTIVE", PhysState: "LinkUp"}}
	ipoibDown := sysfs.NIC{Address: "0000:18:00.0", Netdevs: []string{"ib0"}, LinkUp: map[string]bool{"ib0": false}, AdminUp: map[string]bool{"ib0": true},
		RDMADevices: []string{"uverbs0"}, RDMAPorts: active}
	portDown := sysfs.NIC{Address: "0000:18:00.0", Netdevs: []string{"ib0"}, LinkUp: map[string]bool{"ib0": true}, AdminUp: map[string]bool{"ib0": true},
		RDMADevices: []string{"uverbs0"}, RDMAPorts: []sysfs.RDMAPort{{Device: "mlx5_0", Port: "1", State: "INIT", PhysState: "LinkUp"}}}
	portUnknown := sysfs.NIC{Address: "0000:18:00.0", RDMADevices: []string{"uverbs0"}, RDMAPorts: []sysfs.RDMAPort{{Device: "mlx5_0", Port: "1"}}}
	tests := []struct {
		name    string
		n       sysfs.NIC
		present bool
		want    Health
	}{
		{name: "healthy", n: up, present: true, want: Health{Healthy: true}},
		{name: "link down", n: down, present: true, want: Health{Reason: "link down: ib0"}},
		{name: "admin-down netdev is unused, not broken", n: adminDown, present: true, want: Health{Healthy: true}},
		{name: "RDMA NIC with ACTIVE port and its IPoIB down", n: ipoibDown, present: true, want: Health{Healthy: true}},
		{name: "RDMA port not ACTIVE", n: portDown, present: true, want: Health{Reason: "RDMA port down: mlx5_0/1: INIT (LinkUp)"}},
		{name: "RDMA port state unreadable is not judged", n: portUnknown, present: true, want: Health{Healthy: true}},
		{name: "no netdev in the host namespace", n: sysfs.NIC{Address: "0000:18:00.0"}, present: true, want: Health{Healthy: true}},
		{name: "gone", n: up, present: false, want: Health{Reason: "removed: gone from sysfs"}},
		{name: "failed wins over link", n: sysfs.NIC{Failed: "x", Netdevs: []string{"ib0"}}, present: true, want: Health{Reason: "PCI device failed: x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Check(tt.n, tt.present); got != tt.want {
				t.Errorf("Check = %+v, want %+v", got, tt.want)
			}
		})
	}
	got := HealthOf([]string{"0000:18:00.0", "0000:99:00.0"}, []sysfs.NIC{up})
	if !got["0000:18:00.0"].Healthy || got["0000:99:00.0"].Healthy {
		t.Errorf("HealthOf = %+v", got)
	}
}

func TestNewPoolsRefusesEnvCollision(t *testing.T) {
	_, err := NewPools([]config.NICResource{
		pool("example.com/a-b", config.NICSelectors{Vendors: []string{"15b3"}}),
		pool("example.com/a_b", config.NICSelectors{Vendors: []string{"8086"}}),
	}, Options{})
	if err == nil || !strings.Contains(err.Error(), "PCIDEVICE_EXAMPLE_COM_A_B") {
		t.Fatalf("err = %v", err)
	}
}

// The server checks IDs against its list while Rescan swaps the pool's
// state; -race must find nothing.
func TestRescanWhileAllocating(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, examplePools(t), f)
	ps.Rescan(f.scan(t))
	scan := f.scan(t)
	p := ps.All()[0]
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				if _, err := p.Allocate(cx7NUMA0[:2]); err != nil {
					t.Error(err)
					return
				}
				if _, err := p.Preferred(cx7NUMA0, nil, 2); err != nil {
					t.Error(err)
					return
				}
				_ = p.Devices()
			}
		})
	}
	for range 50 {
		ps.Rescan(scan)
	}
	wg.Wait()
}

// A pool is served by the device plugin as it is; the package itself does
// not import it, so the check lives here.
var (
	_ deviceplugin.Backend            = (*Pool)(nil)
	_ deviceplugin.PreferredAllocator = (*Pool)(nil)
)

// TestServedByDevicePlugin runs a pool behind the real deviceplugin.Server
// and asks it over gRPC, as the kubelet would.
func TestServedByDevicePlugin(t *testing.T) {
	f := load(t, "dgx-h100")
	ps := newPools(t, examplePools(t), f)
	u := ps.Rescan(f.scan(t))[1]
	dir := t.TempDir()
	srv, err := deviceplugin.New(deviceplugin.Options{ResourceName: u.Pool.Resource(), SocketDir: dir, Backend: u.Pool})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetDevices(u.Devices)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	conn, err := grpc.NewClient("passthrough:///"+srv.SocketPath(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()

	opts, err := client.GetDevicePluginOptions(rctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options = %v, %v", opts, err)
	}
	stream, err := client.ListAndWatch(rctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy || d.Topology == nil || d.Topology.Nodes[0].ID != 1 {
			t.Errorf("advertised %v", d)
		}
	}
	pref, err := client.GetPreferredAllocation(rctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: cx7NUMA1, MustIncludeDeviceIDs: []string{"0000:dc:00.0"}, AllocationSize: 2},
	}})
	if err != nil || len(pref.ContainerResponses[0].DeviceIDs) != 2 {
		t.Fatalf("GetPreferredAllocation = %v, %v", pref, err)
	}
	resp, err := client.Allocate(rctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:dc:00.0", "0000:9a:00.0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerResponses[0]
	if got := c.Envs["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA1"]; got != "0000:9a:00.0,0000:dc:00.0" {
		t.Errorf("env = %q", got)
	}
	var paths []string
	for _, d := range c.Devices {
		paths = append(paths, d.ContainerPath)
	}
	if want := []string{"/dev/infiniband/uverbs4", "/dev/infiniband/uverbs7", "/dev/infiniband/rdma_cm"}; !slices.Equal(paths, want) {
		t.Errorf("device nodes = %v, want %v", paths, want)
	}

	// A port going down reaches the kubelet's stream after a rescan.
	f.apply(t, "file sys/devices/pci0000:00/0000:9a:00.0/infiniband/mlx5_4/ports/1/state 1: DOWN")
	for _, up := range ps.Rescan(f.scan(t)) {
		if up.Pool == u.Pool && up.Changed {
			srv.SetDevices(up.Devices)
		}
	}
	list, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	health := map[string]string{}
	for _, d := range list.Devices {
		health[d.ID] = d.Health
	}
	if health["0000:9a:00.0"] != pluginapi.Unhealthy || health["0000:c0:00.0"] != pluginapi.Healthy {
		t.Errorf("after link down: %v", health)
	}
	if _, err := client.Allocate(rctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:9a:00.0"}}}}); err == nil {
		t.Error("the server allocated a NIC whose link is down")
	}
}

func TestCDI(t *testing.T) {
	f := load(t, "dgx-h100")
	ps, err := NewPools(examplePools(t), Options{DevRoot: f.devRoot(), Strategies: []string{"cdi-cri", "cdi-annotations"}})
	if err != nil {
		t.Fatal(err)
	}
	ps.Rescan(f.scan(t))
	p := ps.All()[0]
	resp, err := p.Allocate([]string{"0000:4f:00.0", "0000:18:00.0"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"example.com/rdma_numa0=0000:18:00.0", "example.com/rdma_numa0=0000:4f:00.0"}
	if !slices.Equal(resp.CDIDevices, want) {
		t.Errorf("CDI devices = %v, want %v", resp.CDIDevices, want)
	}
	if resp.Nodes != nil {
		t.Errorf("CDI-only answer carries device nodes %v", resp.Nodes)
	}
	if resp.Env["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0"] != "0000:18:00.0,0000:4f:00.0" {
		t.Errorf("env = %v", resp.Env)
	}
	if got := resp.Annotations["cdi.k8s.io/gpu-device-plugin_example.com_rdma_numa0"]; got != strings.Join(want, ",") {
		t.Errorf("annotations = %v", resp.Annotations)
	}

	spec, err := p.CDISpec()
	if err != nil {
		t.Fatal(err)
	}
	if spec.Kind != "example.com/rdma_numa0" || len(spec.Devices) != 4 {
		t.Fatalf("spec kind %q with %d devices", spec.Kind, len(spec.Devices))
	}
	// Pinned: runtimes vendoring the CDI library v0.5.x (containerd 1.7)
	// read at most 0.5.0, and a PCI address as a device name needs it.
	if spec.Version != "0.5.0" {
		t.Errorf("cdiVersion %s, want 0.5.0 (internal/model/cdi/ondisk/compat_test.go)", spec.Version)
	}
	for _, d := range spec.Devices {
		if len(d.ContainerEdits.DeviceNodes) != 1 || !strings.HasPrefix(d.ContainerEdits.DeviceNodes[0].Path, "/dev/infiniband/uverbs") {
			t.Errorf("device %s edits %+v", d.Name, d.ContainerEdits)
		}
	}
	// A removed NIC stays listed, unhealthy, but leaves the spec.
	f.apply(t, "rm sys/bus/pci/devices/0000:18:00.0\nrm sys/devices/pci0000:00/0000:18:00.0")
	ps.Rescan(f.scan(t))
	if spec, err = p.CDISpec(); err != nil || len(spec.Devices) != 3 {
		t.Fatalf("after removal: spec %v, %v; want 3 devices", spec, err)
	}
	if _, err := NewPools(examplePools(t), Options{Strategies: []string{"magic"}}); err == nil {
		t.Error("unknown strategy accepted")
	}
}

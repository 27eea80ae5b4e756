package sysfs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
)

func scanner(t *testing.T, root string) (*NICScanner, *logtest.Buffer) {
	t.Helper()
	var logs logtest.Buffer
	s := NewNICScanner(NICOptions{
		SysfsRoot: filepath.Join(root, "sys"),
		ProcRoot:  filepath.Join(root, "proc"),
		HostRoot:  root,
		Log:       slog.New(slog.NewTextHandler(&logs, nil)),
	})
	return s, &logs
}

func scanFixture(t *testing.T, name string) ([]NIC, *logtest.Buffer) {
	t.Helper()
	s, logs := scanner(t, sysfstest.Load(t, name))
	nics, err := s.Scan()
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return nics, logs
}

func addresses(nics []NIC) []string {
	out := make([]string, len(nics))
	for i, n := range nics {
		out[i] = n.Address
	}
	return out
}

func byAddress(t *testing.T, nics []NIC, addr string) NIC {
	t.Helper()
	for _, n := range nics {
		if n.Address == addr {
			return n
		}
	}
	t.Fatalf("no NIC %s in %v", addr, addresses(nics))
	return NIC{}
}

func TestScanDGXH100(t *testing.T) {
	nics, logs := scanFixture(t, "dgx-h100")
	cx7 := []struct {
		addr, netdev string
		numa         int
	}{
		{"0000:18:00.0", "ibp24s0", 0}, {"0000:40:00.0", "ibp64s0", 0}, {"0000:4f:00.0", "ibp79s0", 0}, {"0000:5e:00.0", "ibp94s0", 0},
		{"0000:9a:00.0", "ibp154s0", 1}, {"0000:c0:00.0", "ibp192s0", 1}, {"0000:ce:00.0", "ibp206s0", 1}, {"0000:dc:00.0", "ibp220s0", 1},
	}
	want := []string{"0000:03:00.0"}
	for _, c := range cx7 {
		want = append(want, c.addr)
	}
	if got := addresses(nics); !reflect.DeepEqual(got, want) {
		t.Fatalf("NICs = %v, want %v (the GPU, NVMe drive and root port are not NICs)", got, want)
	}
	for i, c := range cx7 {
		t.Run(c.addr, func(t *testing.T) {
			got := byAddress(t, nics, c.addr)
			w := NIC{
				Address: c.addr, Vendor: "15b3", Device: "1021",
				VendorName: "Mellanox Technologies", DeviceName: "MT2910 Family [ConnectX-7]",
				Class: 0x020700, Driver: "mlx5_core", NUMANode: c.numa,
				Netdevs: []string{c.netdev}, LinkUp: map[string]bool{c.netdev: true}, AdminUp: map[string]bool{c.netdev: true}, LinkType: LinkInfiniBand,
				IBDevices: []string{fmt.Sprintf("mlx5_%d", i)}, RDMADevices: []string{fmt.Sprintf("uverbs%d", i)},
				RDMAPorts:  []RDMAPort{{Device: fmt.Sprintf("mlx5_%d", i), Port: "1", State: "ACTIVE", LinkLayer: "InfiniBand"}},
				IOMMUGroup: fmt.Sprint(20 + i),
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("got  %+v\nwant %+v", got, w)
			}
		})
	}
	mgmt := byAddress(t, nics, "0000:03:00.0")
	if !mgmt.DefaultRoute || mgmt.Driver != "igb" || mgmt.Vendor != "8086" || mgmt.Device != "1533" || mgmt.LinkType != LinkEther || mgmt.IsRDMA() {
		t.Errorf("management NIC = %+v, want igb 8086:1533 ether carrying the default route", mgmt)
	}
	if strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a clean node logged warnings:\n%s", logs)
	}
}

func TestScanNUMAUnknown(t *testing.T) {
	nics, _ := scanFixture(t, "numa-unknown")
	if got := addresses(nics); !reflect.DeepEqual(got, []string{"0000:01:00.0", "0000:01:00.1"}) {
		t.Fatalf("NICs = %v", got)
	}
	for _, n := range nics {
		if n.NUMANode != -1 {
			t.Errorf("%s: NUMANode = %d, want -1", n.Address, n.NUMANode)
		}
		if n.VendorName != "" || n.DeviceName != "" {
			t.Errorf("%s: names %q %q without a pci.ids", n.Address, n.VendorName, n.DeviceName)
		}
		if n.LinkType != LinkEther || !n.IsRDMA() || len(n.Problems) != 0 {
			t.Errorf("%s: %+v, want RoCE (ether with RDMA) and no problems", n.Address, n)
		}
	}
	if nics[0].DefaultRoute || !nics[1].DefaultRoute {
		t.Errorf("DefaultRoute = %t, %t; want only the bond0 slave 0000:01:00.1", nics[0].DefaultRoute, nics[1].DefaultRoute)
	}
}

func TestScanMalformed(t *testing.T) {
	nics, logs := scanFixture(t, "malformed")
	if got := addresses(nics); !reflect.DeepEqual(got, []string{"0000:01:00.0", "0000:03:00.0", "0000:04:00.0"}) {
		t.Fatalf("NICs = %v; want the odd devices skipped and the rest kept", got)
	}
	garbage := nics[0]
	if garbage.NUMANode != -1 || len(garbage.Problems) != 1 || !strings.Contains(garbage.Problems[0], "numa_node") {
		t.Errorf("garbage numa_node: NUMANode %d, Problems %q", garbage.NUMANode, garbage.Problems)
	}
	if garbage.Failed != "" {
		t.Errorf("garbage numa_node made the NIC failed: %q", garbage.Failed)
	}
	noModalias := nics[1]
	if noModalias.Driver != "igb" || noModalias.Vendor != "8086" || noModalias.Class != 0x020000 || noModalias.NUMANode != 0 {
		t.Errorf("device without modalias read from sysfs = %+v", noModalias)
	}
	if !strings.Contains(nics[2].Failed, "all ones") {
		t.Errorf("dead device: Failed = %q", nics[2].Failed)
	}
	for _, want := range []string{"0000:02:00.0", "0000:05:00.0", "numa_node"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not mention %s:\n%s", want, logs)
		}
	}
}

func TestScanSRIOV(t *testing.T) {
	nics, _ := scanFixture(t, "sriov")
	if got := addresses(nics); !reflect.DeepEqual(got, []string{"0000:3b:00.0", "0000:3b:00.2", "0000:3b:00.3"}) {
		t.Fatalf("NICs = %v", got)
	}
	pf := nics[0]
	if pf.PF != "" || !reflect.DeepEqual(pf.VFs, []string{"0000:3b:00.2", "0000:3b:00.3"}) || pf.NumVFs != 2 || pf.Device != "101d" {
		t.Errorf("PF = %+v", pf)
	}
	for _, vf := range nics[1:] {
		if vf.PF != "0000:3b:00.0" || vf.VFs != nil || vf.Device != "101e" || !vf.IsRDMA() {
			t.Errorf("VF = %+v", vf)
		}
	}
	for _, n := range nics {
		if n.DefaultRoute {
			t.Errorf("%s carries a default route; the fixture has none", n.Address)
		}
	}
}

func TestScanVFIO(t *testing.T) {
	nics, _ := scanFixture(t, "vfio")
	vfio, ice := byAddress(t, nics, "0000:af:00.0"), byAddress(t, nics, "0000:af:00.1")
	if vfio.Driver != DriverVFIO || vfio.IOMMUGroup != "42" || vfio.Netdevs != nil || vfio.NUMANode != 1 || vfio.DefaultRoute {
		t.Errorf("vfio-bound NIC = %+v", vfio)
	}
	if ice.Driver != "ice" || ice.IOMMUGroup != "43" || !ice.DefaultRoute {
		t.Errorf("ice NIC = %+v", ice)
	}
}

// ghw drops every device whose modalias it cannot parse; with none left
// the scan must not come back empty.
func TestScanFallsBackWhenGHWSeesNothing(t *testing.T) {
	want, _ := scanFixture(t, "dgx-h100")

	t.Run("no modalias anywhere", func(t *testing.T) {
		root := sysfstest.Load(t, "dgx-h100")
		matches, _ := filepath.Glob(filepath.Join(root, "sys", "devices", "*", "*", "modalias"))
		if len(matches) == 0 {
			t.Fatal("fixture has no modalias files")
		}
		for _, m := range matches {
			os.Remove(m)
		}
		s, logs := scanner(t, root)
		got, err := s.Scan()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("fallback scan differs:\ngot  %+v\nwant %+v", got, want)
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "pure sysfs scan") {
			t.Errorf("the fallback was not logged loudly:\n%s", logs)
		}
	})
	t.Run("inventory fails", func(t *testing.T) {
		s, logs := scanner(t, sysfstest.Load(t, "dgx-h100"))
		s.inventory = func() (map[string]pciDevice, error) { return nil, errors.New("boom") }
		got, err := s.Scan()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("fallback scan differs:\ngot  %+v\nwant %+v", got, want)
		}
		if !strings.Contains(logs.String(), "boom") {
			t.Errorf("inventory error not logged:\n%s", logs)
		}
	})
}

func TestScanLogsOnce(t *testing.T) {
	s, logs := scanner(t, sysfstest.Load(t, "malformed"))
	for range 3 {
		if _, err := s.Scan(); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "device=0000:05:00.0"); n != 1 {
		t.Errorf("a skipped device was logged %d times over three scans:\n%s", n, logs)
	}
}

func TestScanNoPCIDirectory(t *testing.T) {
	s, _ := scanner(t, t.TempDir())
	if _, err := s.Scan(); err == nil || !strings.Contains(err.Error(), "PCI devices") {
		t.Fatalf("Scan of an empty root: %v", err)
	}
}

func TestLinkState(t *testing.T) {
	const nd = "sys/devices/pci0000:00/0000:18:00.0/net/ibp24s0"
	tests := []struct {
		name       string
		directives string
		up         bool
	}{
		{name: "operstate up", directives: "file " + nd + "/operstate up", up: true},
		{name: "operstate down", directives: "file " + nd + "/operstate down\nfile " + nd + "/carrier 0", up: false},
		{name: "lower layer down", directives: "file " + nd + "/operstate lowerlayerdown", up: false},
		{name: "unknown with carrier", directives: "file " + nd + "/operstate unknown\nfile " + nd + "/carrier 1", up: true},
		{name: "unknown without carrier", directives: "file " + nd + "/operstate unknown\nrm " + nd + "/carrier", up: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sysfstest.Load(t, "dgx-h100")
			sysfstest.Apply(t, root, tt.directives)
			s, _ := scanner(t, root)
			nics, err := s.Scan()
			if err != nil {
				t.Fatal(err)
			}
			n := byAddress(t, nics, "0000:18:00.0")
			if n.LinkUp["ibp24s0"] != tt.up {
				t.Errorf("LinkUp = %v, want %t", n.LinkUp, tt.up)
			}
			if down := n.LinksDown(); (len(down) == 0) != tt.up {
				t.Errorf("LinksDown = %v", down)
			}
		})
	}
}

// A netdev moved into a pod's namespace vanishes from the host's sysfs;
// the RDMA port still tells the link type.
func TestScanNetdevMovedAway(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	sysfstest.Apply(t, root, "rm sys/devices/pci0000:00/0000:18:00.0/net\nrm sys/class/net/ibp24s0")
	s, _ := scanner(t, root)
	nics, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	n := byAddress(t, nics, "0000:18:00.0")
	if n.Netdevs != nil || len(n.LinkUp) != 0 || n.LinkType != LinkInfiniBand || !n.IsRDMA() {
		t.Errorf("NIC with its netdev in a pod = %+v", n)
	}
}

func TestScanSeesHotPlug(t *testing.T) {
	root := sysfstest.Load(t, "sriov")
	s, _ := scanner(t, root)
	before, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	sysfstest.Apply(t, root, `
file sys/devices/pci0000:00/0000:86:00.0/vendor 0x15b3
file sys/devices/pci0000:00/0000:86:00.0/device 0x1021
file sys/devices/pci0000:00/0000:86:00.0/class 0x020000
file sys/devices/pci0000:00/0000:86:00.0/modalias pci:v000015B3d00001021sv000015B3sd00000000bc02sc00i00
file sys/devices/pci0000:00/0000:86:00.0/numa_node 1
link sys/bus/pci/devices/0000:86:00.0 ../../../devices/pci0000:00/0000:86:00.0
rm sys/bus/pci/devices/0000:3b:00.3
`)
	after, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addresses(after), []string{"0000:3b:00.0", "0000:3b:00.2", "0000:86:00.0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after hot-plug: %v (before %v), want %v", got, addresses(before), want)
	}
}

func TestPCIIDs(t *testing.T) {
	t.Run("explicit path", func(t *testing.T) {
		root := sysfstest.Load(t, "sriov")
		ids := filepath.Join(t.TempDir(), "pci.ids")
		os.WriteFile(ids, []byte("15b3  Mellanox Technologies\n\t101d  MT2892 Family [ConnectX-6 Dx]\n"), 0o644)
		nics, err := DiscoverNICs(NICOptions{SysfsRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), HostRoot: root, PCIIDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		if nics[0].VendorName != "Mellanox Technologies" || nics[0].DeviceName != "MT2892 Family [ConnectX-6 Dx]" || nics[1].DeviceName != "" {
			t.Errorf("names = %q %q / %q", nics[0].VendorName, nics[0].DeviceName, nics[1].DeviceName)
		}
	})
	t.Run("truncated file does not panic", func(t *testing.T) {
		root := sysfstest.Load(t, "dgx-h100")
		sysfstest.Apply(t, root, "file usr/share/misc/pci.ids C")
		var logs logtest.Buffer
		nics, err := DiscoverNICs(NICOptions{SysfsRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), HostRoot: root,
			Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil || len(nics) != 9 || nics[1].VendorName != "" {
			t.Fatalf("DiscoverNICs = %d NICs, %v", len(nics), err)
		}
		if !strings.Contains(logs.String(), "cannot load pci.ids") {
			t.Errorf("bad pci.ids not logged:\n%s", logs.String())
		}
	})
	t.Run("none and network fetch asked for by the environment", func(t *testing.T) {
		home := t.TempDir()
		t.Setenv("HOME", home)
		t.Setenv("PCIDB_ENABLE_NETWORK_FETCH", "1")
		t.Setenv("GHW_SNAPSHOT_PATH", filepath.Join(home, "no-such-snapshot.tar.gz"))
		root := sysfstest.Load(t, "sriov")
		nics, err := DiscoverNICs(NICOptions{SysfsRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), HostRoot: root})
		if err != nil || len(nics) != 3 || nics[0].VendorName != "" || nics[0].Vendor != "15b3" {
			t.Fatalf("DiscoverNICs = %+v, %v", nics, err)
		}
		if _, err := os.Stat(filepath.Join(home, ".cache", "pci.ids")); err == nil {
			t.Error("pcidb fetched pci.ids into the cache")
		}
	})
}

func TestIsNICClass(t *testing.T) {
	for class, want := range map[uint32]bool{
		0x020000: true, 0x020700: true, 0x028000: true, 0x0c0600: true,
		0x030200: false, 0x010802: false, 0x060400: false, 0x0c0330: false, 0x120000: false,
	} {
		if got := IsNICClass(class); got != want {
			t.Errorf("IsNICClass(%#06x) = %t, want %t", class, got, want)
		}
	}
}

// BenchmarkScanDGX is one rescan of a DGX-H100-like tree: what the daemon
// pays at every rescan interval.
func BenchmarkScanDGX(b *testing.B) {
	root := sysfstest.Load(b, "dgx-h100")
	s := NewNICScanner(NICOptions{SysfsRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), HostRoot: root})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Scan(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestScanHostSysfs scans this machine's own /sys, whatever it holds: it
// must not fail or go to the network.
func TestScanHostSysfs(t *testing.T) {
	if _, err := os.Stat("/sys/bus/pci/devices"); err != nil {
		t.Skip("no /sys/bus/pci/devices here")
	}
	var logs logtest.Buffer
	nics, err := DiscoverNICs(NICOptions{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nics {
		t.Logf("%s %s:%s %q class %#06x driver %q numa %d netdevs %v rdma %v default-route %t", n.Address, n.Vendor, n.Device, n.DeviceName, n.Class, n.Driver, n.NUMANode, n.Netdevs, n.RDMADevices, n.DefaultRoute)
	}
}

// virtio-net hangs its netdev off the virtio child device, not the PCI
// function.
func TestScanVirtioNetdev(t *testing.T) {
	root := sysfstest.Load(t, "vfio")
	const dev = "sys/devices/pci0000:00/0000:00:03.0"
	sysfstest.Apply(t, root, `
file `+dev+`/vendor 0x1af4
file `+dev+`/device 0x1041
file `+dev+`/class 0x020000
file `+dev+`/modalias pci:v00001AF4d00001041sv00001AF4sd00001100bc02sc00i00
link `+dev+`/driver ../../../bus/pci/drivers/virtio-pci
file `+dev+`/virtio0/net/eth0/operstate up
file `+dev+`/virtio0/net/eth0/type 1
link sys/bus/pci/devices/0000:00:03.0 ../../../devices/pci0000:00/0000:00:03.0
`)
	s, _ := scanner(t, root)
	nics, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	n := byAddress(t, nics, "0000:00:03.0")
	if !reflect.DeepEqual(n.Netdevs, []string{"eth0"}) || !n.LinkUp["eth0"] || n.LinkType != LinkEther || n.NUMANode != -1 {
		t.Errorf("virtio NIC = %+v", n)
	}
}

package sysfs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
)

func TestScanRDMAPorts(t *testing.T) {
	const port = "sys/devices/pci0000:00/0000:18:00.0/infiniband/mlx5_0/ports/1"
	tests := []struct {
		name       string
		directives string
		want       RDMAPort
		active     bool
		problem    string // a substring of the one Problem; "" for none
	}{
		{name: "ACTIVE and LinkUp", directives: "file " + port + "/phys_state 5: LinkUp", want: RDMAPort{State: "ACTIVE", PhysState: "LinkUp"}, active: true},
		{name: "ACTIVE without phys_state", want: RDMAPort{State: "ACTIVE"}, active: true},
		{name: "DOWN and Polling", directives: "file " + port + "/state 1: DOWN\nfile " + port + "/phys_state 2: Polling", want: RDMAPort{State: "DOWN", PhysState: "Polling"}},
		{name: "ACTIVE but physically Disabled", directives: "file " + port + "/phys_state 3: Disabled", want: RDMAPort{State: "ACTIVE", PhysState: "Disabled"}},
		{name: "garbled state is not judged", directives: "file " + port + "/state garbage", want: RDMAPort{}, problem: `"garbage" is not "<number>: <state>"`},
		{name: "missing state is not judged", directives: "rm " + port + "/state", want: RDMAPort{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sysfstest.Load(t, "dgx-h100")
			sysfstest.Apply(t, root, tt.directives)
			s, logs := scanner(t, root)
			nics, err := s.Scan()
			if err != nil {
				t.Fatal(err)
			}
			// A second scan must not log the same problem again.
			if _, err := s.Scan(); err != nil {
				t.Fatal(err)
			}
			n := byAddress(t, nics, "0000:18:00.0")
			tt.want.Device, tt.want.Port, tt.want.LinkLayer = "mlx5_0", "1", "InfiniBand"
			if !reflect.DeepEqual(n.RDMAPorts, []RDMAPort{tt.want}) {
				t.Errorf("RDMAPorts = %+v, want %+v", n.RDMAPorts, tt.want)
			}
			if got := n.RDMAPorts[0].Active(); got != tt.active {
				t.Errorf("Active = %t, want %t", got, tt.active)
			}
			if down := n.PortsDown(); (len(down) == 0) != (tt.active || tt.want.State == "") {
				t.Errorf("PortsDown = %v", down)
			}
			switch {
			case tt.problem == "" && len(n.Problems) > 0:
				t.Errorf("Problems = %v, want none", n.Problems)
			case tt.problem != "":
				if len(n.Problems) != 1 || !strings.Contains(n.Problems[0], tt.problem) || !strings.Contains(n.Problems[0], "mlx5_0/1") {
					t.Errorf("Problems = %v, want one naming the port and %q", n.Problems, tt.problem)
				}
				if c := strings.Count(logs.String(), "odd sysfs entry"); c != 1 {
					t.Errorf("problem logged %d times over two scans, want once:\n%s", c, logs)
				}
			}
			if len(nics) != 9 {
				t.Errorf("%d NICs; an odd port file must not drop any", len(nics))
			}
		})
	}
}

// The host-device CNI hands a netdev back to the host admin-down when its
// pod exits; an interface nobody configured is admin-down too. Neither is
// a link fault.
func TestScanAdminState(t *testing.T) {
	const nd = "sys/devices/pci0000:00/0000:18:00.0/net/ibp24s0"
	tests := []struct {
		name       string
		directives string
		adminUp    bool
		linksDown  []string
		problem    bool
	}{
		{name: "up with carrier", directives: "file " + nd + "/flags 0x1003", adminUp: true},
		{name: "up without carrier", directives: "file " + nd + "/flags 0x1003\nfile " + nd + "/operstate down\nfile " + nd + "/carrier 0", adminUp: true, linksDown: []string{"ibp24s0"}},
		{name: "admin down, handed back by the CNI", directives: "file " + nd + "/flags 0x1002\nfile " + nd + "/operstate down\nrm " + nd + "/carrier"},
		{name: "no flags file counts as up", directives: "file " + nd + "/operstate down", adminUp: true, linksDown: []string{"ibp24s0"}},
		{name: "garbled flags are not judged", directives: "file " + nd + "/flags up\nfile " + nd + "/operstate down", problem: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sysfstest.Load(t, "dgx-h100")
			if !strings.Contains(tt.directives, "/flags") {
				sysfstest.Apply(t, root, "rm "+nd+"/flags")
			}
			sysfstest.Apply(t, root, tt.directives)
			s, _ := scanner(t, root)
			nics, err := s.Scan()
			if err != nil {
				t.Fatal(err)
			}
			n := byAddress(t, nics, "0000:18:00.0")
			if n.AdminUp["ibp24s0"] != tt.adminUp || !reflect.DeepEqual(n.LinksDown(), tt.linksDown) {
				t.Errorf("AdminUp = %v, LinksDown = %v; want %t, %v", n.AdminUp, n.LinksDown(), tt.adminUp, tt.linksDown)
			}
			if got := len(n.Problems) > 0; got != tt.problem || (tt.problem && !strings.Contains(n.Problems[0], "flags")) {
				t.Errorf("Problems = %v", n.Problems)
			}
		})
	}
}

// In a pod without hostNetwork /proc/net/route is the pod's: it names the
// pod's eth0, which the host's sysfs lacks (or has under another ifindex).
// The scan must say it cannot tell, not silently protect nothing.
func TestScanDefaultRouteUnknown(t *testing.T) {
	const podRoute = "file proc/net/route <<EOF\nIface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\neth0\t00000000\t0100580A\t0003\t0\t0\t0\t00000000\t0\t0\t0\nEOF"
	tests := []struct {
		name       string
		fixture    string
		directives string
		unknown    string // a substring of DefaultRouteUnknown; "" when known
		mgmt       string // the NIC carrying the default route, when known
	}{
		{name: "host's route table", fixture: "dgx-h100", mgmt: "0000:03:00.0"},
		{name: "host's route table, ifindex agrees", fixture: "vmd", mgmt: "0000:3d:00.0"},
		{name: "pod's eth0 is not in the host's sysfs", fixture: "dgx-h100", directives: podRoute, unknown: "default-route interface eth0"},
		{name: "pod's eth0 shares a name with a host interface", fixture: "vmd",
			directives: "file proc/net/route <<EOF\nIface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\neno1\t00000000\t0100580A\t0003\t0\t0\t0\t00000000\t0\t0\t0\nEOF\nfile proc/net/if_inet6 <<EOF\nfe80000000000000020c29fffe654321 1b 40 20 80     eno1\nEOF",
			unknown:    "ifindex 27"},
		{name: "no route table", fixture: "dgx-h100", directives: "rm proc/net/route", unknown: "reading default route"},
		{name: "no default route at all is known", fixture: "sriov"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sysfstest.Load(t, tt.fixture)
			sysfstest.Apply(t, root, tt.directives)
			s, _ := scanner(t, root)
			nics, err := s.Scan()
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nics {
				if tt.unknown == "" && n.DefaultRouteUnknown != "" || !strings.Contains(n.DefaultRouteUnknown, tt.unknown) {
					t.Errorf("%s: DefaultRouteUnknown = %q, want %q", n.Address, n.DefaultRouteUnknown, tt.unknown)
				}
				if want := n.Address == tt.mgmt; n.DefaultRoute != want {
					t.Errorf("%s: DefaultRoute = %t, want %t", n.Address, n.DefaultRoute, want)
				}
			}
		})
	}
}

// VMD puts devices in PCI domains 10000 and up, which the kernel prints
// with five hex digits.
func TestScanVMDDomain(t *testing.T) {
	nics, logs := scanFixture(t, "vmd")
	if got, want := addresses(nics), []string{"0000:3d:00.0", "10000:01:00.0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("NICs = %v, want %v", got, want)
	}
	n := byAddress(t, nics, "10000:01:00.0")
	if n.Vendor != "15b3" || n.Device != "101d" || n.Driver != "mlx5_core" || n.NUMANode != 0 || !n.IsRDMA() ||
		!reflect.DeepEqual(n.Netdevs, []string{"ens1np0"}) || n.IOMMUGroup != "60" || len(n.Problems) > 0 {
		t.Errorf("NIC behind VMD = %+v", n)
	}
	if c, err := PCIAddress("10000:01:00.0"); err != nil || c != "10000:01:00.0" {
		t.Errorf("PCIAddress = %q, %v", c, err)
	}
	if strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a clean VMD node logged warnings:\n%s", logs)
	}
}

// A rescan reads the 4 bytes of config space it needs (vendor and
// device ID), not the whole file: with a pipe for config, a reader that
// wants the whole file waits for an end that never comes.
func TestScanReadsFourBytesOfConfigSpace(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	for _, tt := range []struct {
		name   string
		bytes  string
		failed bool
	}{
		{name: "healthy device", bytes: "\xb3\x15\x21\x10"},
		{name: "fell off the bus", bytes: "\xff\xff\xff\xff", failed: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := filepath.Join(root, "sys/devices/pci0000:00/0000:18:00.0/config")
			_ = os.Remove(cfg)
			if err := syscall.Mkfifo(cfg, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			release := make(chan struct{})
			writer := make(chan error, 1)
			go func() {
				// Opening for writing waits for the scanner to open it.
				w, err := os.OpenFile(cfg, os.O_WRONLY, 0)
				if err != nil {
					writer <- err
					return
				}
				defer w.Close()
				_, err = w.Write([]byte(tt.bytes))
				writer <- err
				<-release // hold the pipe open: no EOF
			}()
			defer close(release)
			s, _ := scanner(t, root)
			done := make(chan []NIC, 1)
			go func() {
				nics, err := s.Scan()
				if err != nil {
					t.Error(err)
				}
				done <- nics
			}()
			select {
			case nics := <-done:
				if n := byAddress(t, nics, "0000:18:00.0"); (n.Failed != "") != tt.failed {
					t.Errorf("Failed = %q, want failed %t", n.Failed, tt.failed)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Scan still reading config space after 20s: it reads past the first 4 bytes")
			}
			if err := <-writer; err != nil {
				t.Fatal(err)
			}
		})
	}
}

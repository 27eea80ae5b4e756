package nic

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
)

// clock is a manual clock for the removal grace period.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func duration(d time.Duration) *config.Duration { return &config.Duration{Duration: d} }

// Removing VFs (sriov_numvfs lowered) must not leave capacity inflated:
// a NIC gone for longer than the grace period leaves its pool.
func TestRemovedNICLeavesAfterGracePeriod(t *testing.T) {
	const vf1 = "0000:3b:00.3"
	removeVF1 := "file sys/devices/pci0000:00/0000:3b:00.0/sriov_numvfs 1\nrm sys/devices/pci0000:00/0000:3b:00.0/virtfn1\nrm sys/bus/pci/devices/" + vf1 + "\nrm sys/devices/pci0000:00/" + vf1
	tests := []struct {
		name  string
		grace *config.Duration
		steps []struct {
			after time.Duration // since the VF went
			want  []string
		}
	}{
		{name: "default 5m", steps: []struct {
			after time.Duration
			want  []string
		}{{0, []string{"0000:3b:00.2", vf1}}, {4*time.Minute + 59*time.Second, []string{"0000:3b:00.2", vf1}}, {5 * time.Minute, []string{"0000:3b:00.2"}}}},
		{name: "per-pool 30s", grace: duration(30 * time.Second), steps: []struct {
			after time.Duration
			want  []string
		}{{0, []string{"0000:3b:00.2", vf1}}, {31 * time.Second, []string{"0000:3b:00.2"}}}},
		{name: "0s drops it at once", grace: duration(0), steps: []struct {
			after time.Duration
			want  []string
		}{{0, []string{"0000:3b:00.2"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := load(t, "sriov")
			clk := &clock{now: time.Unix(1_700_000_000, 0)}
			ps, err := NewPools([]config.NICResource{{Name: "example.com/vf", Selectors: config.NICSelectors{VFOnly: true}, RemovalGracePeriod: tt.grace}},
				Options{DevRoot: f.devRoot(), Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			ps.Rescan(f.scan(t))
			f.apply(t, removeVF1)
			start := clk.Now()
			for _, st := range tt.steps {
				clk.now = start.Add(st.after)
				u := ps.Rescan(f.scan(t))[0]
				if got := ids(u.Devices); !slices.Equal(got, st.want) {
					t.Fatalf("%s after removal: devices %v, want %v", st.after, got, st.want)
				}
				for _, d := range u.Devices {
					if d.ID == vf1 && (d.Healthy || d.Reason != "removed: gone from sysfs") {
						t.Errorf("%s after removal: %+v, want unhealthy (removed)", st.after, d)
					}
				}
			}
		})
	}
	t.Run("back within the grace period", func(t *testing.T) {
		f := load(t, "sriov")
		clk := &clock{now: time.Unix(1_700_000_000, 0)}
		ps, err := NewPools([]config.NICResource{{Name: "example.com/vf", Selectors: config.NICSelectors{VFOnly: true}}}, Options{DevRoot: f.devRoot(), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		ps.Rescan(f.scan(t))
		f.apply(t, "rm sys/bus/pci/devices/"+vf1)
		ps.Rescan(f.scan(t))
		clk.advance(4 * time.Minute)
		f.apply(t, "link sys/bus/pci/devices/"+vf1+" ../../../devices/pci0000:00/"+vf1)
		ps.Rescan(f.scan(t))
		// Gone again: the grace period starts over.
		f.apply(t, "rm sys/bus/pci/devices/"+vf1)
		ps.Rescan(f.scan(t))
		clk.advance(4 * time.Minute)
		if u := ps.Rescan(f.scan(t))[0]; !slices.Contains(ids(u.Devices), vf1) {
			t.Errorf("devices %v: a NIC that came back must get a fresh grace period", ids(u.Devices))
		}
	})
}

// A PF that has VFs enabled after it joined is shared with the pods holding
// them: no new pod may get it.
func TestPFGainsVFs(t *testing.T) {
	f := load(t, "sriov")
	f.apply(t, "file sys/devices/pci0000:00/0000:3b:00.0/sriov_numvfs 0\nrm sys/devices/pci0000:00/0000:3b:00.0/virtfn0\nrm sys/devices/pci0000:00/0000:3b:00.0/virtfn1\nrm sys/bus/pci/devices/0000:3b:00.2\nrm sys/bus/pci/devices/0000:3b:00.3")
	ps := newPools(t, []config.NICResource{
		pool("example.com/pf", config.NICSelectors{Vendors: []string{"15b3"}, PFOnly: true}),
		pool("example.com/named_pf", config.NICSelectors{PCIAddresses: []string{"0000:3b:00.0"}}),
	}, f)
	if u := ps.Rescan(f.scan(t))[0]; !slices.Equal(ids(u.Devices), []string{"0000:3b:00.0"}) || !u.Devices[0].Healthy {
		t.Fatalf("PF without VFs: %+v", u.Devices)
	}
	f.apply(t, "file sys/devices/pci0000:00/0000:3b:00.0/sriov_numvfs 2\nlink sys/devices/pci0000:00/0000:3b:00.0/virtfn0 ../0000:3b:00.2\nlink sys/devices/pci0000:00/0000:3b:00.0/virtfn1 ../0000:3b:00.3")
	u := ps.Rescan(f.scan(t))[0]
	if d := u.Devices[0]; d.Healthy || !strings.Contains(d.Reason, "2 VFs enabled") || !strings.Contains(d.Reason, "pciAddresses") {
		t.Errorf("PF after VFs were enabled = %+v, want unhealthy naming the VFs and the fix", d)
	}

	// A pool that names the PF keeps it healthy.
	g := load(t, "sriov")
	named := newPools(t, []config.NICResource{pool("example.com/named_pf", config.NICSelectors{PCIAddresses: []string{"0000:3b:00.0"}})}, g)
	if u := named.Rescan(g.scan(t))[0]; !slices.Equal(ids(u.Devices), []string{"0000:3b:00.0"}) || !u.Devices[0].Healthy {
		t.Errorf("named PF with VFs = %+v", u.Devices)
	}
}

// In the DaemonSet without hostNetwork or --proc-root the route table is
// the pod's: the plugin cannot tell which NIC is the management NIC, so a
// pool that does not name its NICs takes none, with one clear error.
func TestManagementNICUnknown(t *testing.T) {
	const podRoute = "file proc/net/route <<EOF\nIface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\neth0\t00000000\t0100580A\t0003\t0\t0\t0\t00000000\t0\t0\t0\nEOF"
	f := load(t, "dgx-h100")
	f.apply(t, podRoute)
	var logs logtest.Buffer
	ps, err := NewPools([]config.NICResource{
		pool("example.com/named", config.NICSelectors{PCIAddresses: []string{"0000:18:00.0"}}),
		pool("example.com/by_netdev", config.NICSelectors{Netdevs: []string{"ibp64s0"}}),
		pool("example.com/mellanox", config.NICSelectors{Vendors: []string{"15b3"}}),
		pool("example.com/intel", config.NICSelectors{Vendors: []string{"8086"}}),
	}, Options{DevRoot: f.devRoot(), Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		u := ps.Rescan(f.scan(t))
		got := [][]string{ids(u[0].Devices), ids(u[1].Devices), ids(u[2].Devices), ids(u[3].Devices)}
		want := [][]string{{"0000:18:00.0"}, {"0000:40:00.0"}, nil, nil}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("pools = %v, want %v: only NICs a pool names may join while the management NIC is unknown", got, want)
		}
	}
	out := logs.String()
	if c := strings.Count(out, "level=ERROR"); c != 1 {
		t.Errorf("%d errors over three rescans, want one:\n%s", c, out)
	}
	for _, w := range []string{"management NIC", "default-route interface eth0", "hostNetwork", "--proc-root", "example.com/mellanox=0000:4f:00.0", "example.com/intel=0000:03:00.0"} {
		if !strings.Contains(out, w) {
			t.Errorf("error does not mention %q:\n%s", w, out)
		}
	}

	// Fixed (the host's route table): the held-back NICs join, except the
	// management NIC.
	f.apply(t, "file proc/net/route <<EOF\nIface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\nenp3s0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\nEOF")
	u := ps.Rescan(f.scan(t))
	if got := ids(u[2].Devices); !slices.Equal(got, []string{"0000:4f:00.0", "0000:5e:00.0", "0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0"}) || len(u[3].Devices) != 0 {
		t.Errorf("after the fix: mellanox %v, intel %v", got, ids(u[3].Devices))
	}

	// vfio-pci NICs carry no host traffic: they are not held back.
	v := load(t, "vfio")
	v.apply(t, podRoute)
	vp := newPools(t, []config.NICResource{pool("example.com/dpdk", config.NICSelectors{Vendors: []string{"8086"}})}, v)
	if got := ids(vp.Rescan(v.scan(t))[0].Devices); !slices.Equal(got, []string{"0000:af:00.0"}) {
		t.Errorf("vfio pool = %v, want the vfio-pci port only", got)
	}
}

// The host-device CNI returns a netdev admin-down when its pod exits, and
// an RDMA NIC's port can be ACTIVE with its netdev down: neither may leave
// the NIC unhealthy. The fixture's NIC sits in a VMD domain.
func TestHandedBackNICStaysHealthy(t *testing.T) {
	const (
		addr = "10000:01:00.0"
		dev  = "sys/devices/pci0000:00/0000:00:0e.0/pci10000:00/" + addr
		nd   = dev + "/net/ens1np0"
	)
	tests := []struct {
		name       string
		linkCheck  string
		directives string
		healthy    bool
		reason     string
	}{
		{name: "RoCE NIC, port ACTIVE, netdev admin-down", healthy: true},
		{name: "RoCE NIC judged by netdev, admin-down", linkCheck: "netdev", healthy: true},
		{name: "Ethernet NIC, netdev admin-down", directives: "rm " + dev + "/infiniband\nrm " + dev + "/infiniband_verbs", healthy: true},
		{name: "Ethernet NIC, admin up without carrier", directives: "rm " + dev + "/infiniband\nrm " + dev + "/infiniband_verbs\nfile " + nd + "/flags 0x1003\nfile " + nd + "/carrier 0", reason: "link down: ens1np0"},
		{name: "Ethernet NIC, admin up with carrier", directives: "rm " + dev + "/infiniband\nrm " + dev + "/infiniband_verbs\nfile " + nd + "/flags 0x1003\nfile " + nd + "/carrier 1\nfile " + nd + "/operstate up", healthy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := load(t, "vmd")
			f.apply(t, tt.directives)
			ps := newPools(t, []config.NICResource{{Name: "example.com/vmd", Selectors: config.NICSelectors{PCIAddresses: []string{addr}}, LinkCheck: tt.linkCheck}}, f)
			u := ps.Rescan(f.scan(t))[0]
			if len(u.Devices) != 1 || u.Devices[0].ID != addr {
				t.Fatalf("devices %+v, want the NIC behind VMD", u.Devices)
			}
			if d := u.Devices[0]; d.Healthy != tt.healthy || d.Reason != tt.reason {
				t.Errorf("%+v, want healthy=%t reason=%q", d, tt.healthy, tt.reason)
			}
		})
	}
}

func TestNewPoolsRefusesNonCDIKind(t *testing.T) {
	for _, name := range []string{"example.com/x", "example.com/1g"} {
		_, err := NewPools([]config.NICResource{pool(name, config.NICSelectors{Vendors: []string{"15b3"}})}, Options{Strategies: []string{"cdi-cri"}})
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "rename") {
			t.Errorf("%s under cdi-cri: err = %v", name, err)
		}
		if _, err := NewPools([]config.NICResource{pool(name, config.NICSelectors{Vendors: []string{"15b3"}})}, Options{Strategies: []string{"envvar"}}); err != nil {
			t.Errorf("%s under envvar: %v", name, err)
		}
	}
}

package wholebinary

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// reregisterLimit bounds re-registration after a kubelet restart. The
// target is tens of milliseconds; the limit is loose so that a loaded
// machine does not flake, and the figures are logged. About a second means
// the kubelet's dial hit gRPC's reconnect backoff.
const reregisterLimit = 2 * time.Second

// TestRegistration: the binary serves nvidia.com_gpu.sock in the
// kubelet's directory, registers nvidia.com/gpu, offers preferred
// allocation, and the kubelet accepts it once.
func TestRegistration(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		want := filepath.Join(n.k.Dir(), harness.SocketName)
		if got := n.e.Plugin.SocketPath(); got != want {
			t.Errorf("kubelet dialled %s, want %s", got, want)
		}
		if fi, err := os.Stat(want); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("%s is not a socket: %v", want, err)
		}
		if !n.e.Options.GetGetPreferredAllocationAvailable() {
			t.Errorf("options at connection = %v, want GetPreferredAllocationAvailable", n.e.Options)
		}
		if s := n.k.Stats(); len(s.Connects) != 1 || len(s.Rejected) != 0 {
			t.Errorf("kubelet accepted %d connections and refused %v; want one, none refused", len(s.Connects), s.Rejected)
		}
		t.Logf("process start → registered %v, → first device list %v",
			n.e.ConnectedAt.Sub(n.p.Started), n.first.ReceivedAt.Sub(n.p.Started))
	})
}

// TestDevicesMatchProfile: every GPU of the profile is advertised by UUID,
// healthy, on the NUMA node the profile (through sysfs) puts it, and
// nothing else is.
func TestDevicesMatchProfile(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		got := n.first.Devices
		if ids := slices.Sorted(maps.Keys(got)); !slices.Equal(ids, slices.Sorted(slices.Values(n.all()))) {
			t.Errorf("advertised %v, want the profile's %v", ids, n.all())
		}
		for _, g := range n.profile.GPUs {
			d := got[g.UUID]
			if d == nil {
				continue
			}
			if d.Health != api.Healthy {
				t.Errorf("GPU %d health = %s, want %s", g.Index, d.Health, api.Healthy)
			}
			nodes := d.GetTopology().GetNodes()
			switch {
			case g.NUMANode < 0 && len(nodes) != 0:
				t.Errorf("GPU %d topology = %v; the profile gives no NUMA node", g.Index, nodes)
			case g.NUMANode >= 0 && (len(nodes) != 1 || nodes[0].GetID() != int64(g.NUMANode)):
				t.Errorf("GPU %d topology = %v, want NUMA node %d", g.Index, nodes, g.NUMANode)
			}
		}
	})
}

// TestAllocate: two GPUs get NVIDIA_VISIBLE_DEVICES with their UUIDs, their
// /dev/nvidia<minor> nodes and the control nodes; an unknown ID is refused.
func TestAllocate(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		last := len(n.profile.GPUs) - 1
		t.Run("two GPUs", func(t *testing.T) {
			ids := n.uuids(last, 1) // out of index order on purpose
			resp, err := n.e.Allocate(ctx(t), ids...)
			if err != nil {
				t.Fatal(err)
			}
			visible := strings.Split(resp.Envs[harness.VisibleDevicesEnv], ",")
			if !slices.Equal(slices.Sorted(slices.Values(visible)), slices.Sorted(slices.Values(ids))) {
				t.Errorf("%s = %q, want the UUIDs %v", harness.VisibleDevicesEnv, resp.Envs[harness.VisibleDevicesEnv], ids)
			}
			want := map[string]string{}
			for _, name := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
				want["/dev/"+name] = filepath.Join(n.p.DevRoot, name)
			}
			for _, id := range ids {
				name := fmt.Sprintf("nvidia%d", n.gpu(t, id).Minor)
				want["/dev/"+name] = filepath.Join(n.p.DevRoot, name)
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
		})
		t.Run("unknown ID is InvalidArgument naming it", func(t *testing.T) {
			const bogus = "GPU-00000000-dead-beef-0000-000000000000"
			_, err := n.e.Allocate(ctx(t), n.uuid(0), bogus)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bogus) {
				t.Errorf("err = %v, want InvalidArgument naming %s", err, bogus)
			}
		})
	})
}

// TestPreferredAllocation: every answer has the asked size, no duplicates,
// only available devices and every must-include one; half the GPUs of a
// two-node machine land on one NUMA node.
func TestPreferredAllocation(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		type request struct {
			name        string
			available   []string
			mustInclude []string
			size        int
			oneNUMA     bool
		}
		count := len(n.profile.GPUs)
		reqs := []request{
			{name: fmt.Sprintf("%d of %d on one NUMA node", count/2, count), available: n.all(), size: count / 2, oneNUMA: true},
			{name: "must-include gets a NUMA-local partner", available: n.all(), mustInclude: n.uuids(count - 1), size: 2, oneNUMA: true},
			{name: "all", available: n.all(), size: count},
			{name: "one of two", available: n.uuids(0, count-1), size: 1},
		}
		// Sizes 1 to count from random available sets, with up to two
		// must-includes; the seed is fixed so a failure repeats.
		rng := rand.New(rand.NewPCG(1, uint64(count)))
		for size := 1; size <= count; size++ {
			avail := n.all()
			rng.Shuffle(len(avail), func(i, j int) { avail[i], avail[j] = avail[j], avail[i] })
			avail = avail[:size+rng.IntN(count-size+1)]
			must := avail[:rng.IntN(min(size, 2)+1)]
			reqs = append(reqs, request{
				name:        fmt.Sprintf("%d of %d available with %d must-include", size, len(avail), len(must)),
				available:   slices.Clone(avail),
				mustInclude: slices.Clone(must),
				size:        size,
			})
		}
		for _, r := range reqs {
			t.Run(r.name, func(t *testing.T) {
				got, err := n.e.GetPreferredAllocation(ctx(t), r.available, r.mustInclude, r.size)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != r.size {
					t.Errorf("got %d IDs %v, want %d", len(got), got, r.size)
				}
				if sorted := slices.Sorted(slices.Values(got)); len(slices.Compact(sorted)) != len(got) {
					t.Errorf("duplicate IDs in %v", got)
				}
				for _, id := range r.mustInclude {
					if !slices.Contains(got, id) {
						t.Errorf("%v lacks must-include %s", got, id)
					}
				}
				nodes := map[int]bool{}
				for _, id := range got {
					if !slices.Contains(r.available, id) {
						t.Errorf("%s is not among the available IDs", id)
						continue
					}
					nodes[n.gpu(t, id).NUMANode] = true
				}
				if r.oneNUMA && len(nodes) != 1 {
					t.Errorf("%v spans NUMA nodes %v, want one", got, slices.Sorted(maps.Keys(nodes)))
				}
			})
		}
	})
}

// TestKubeletRestart: each kubelet restart wipes the plugin's socket; the
// plugin serves and registers again, with every GPU and the health it
// knew.
func TestKubeletRestart(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		sick := n.uuid(0)
		if err := n.p.Inject("xid 0 79"); err != nil {
			t.Fatal(err)
		}
		if _, err := n.k.WaitDevices(ctx(t), harness.ResourceName, "GPU 0 unhealthy", harness.DeviceHealth(sick, api.Unhealthy)); err != nil {
			t.Fatal(err)
		}
		var took []time.Duration
		for round := range 2 {
			if err := n.k.Restart(); err != nil {
				t.Fatal(err)
			}
			if removed := n.k.RemovedSockets(); !slices.Contains(removed, harness.SocketName) {
				t.Fatalf("round %d: the new kubelet found no %s to remove (removed %v): not a realistic restart", round, harness.SocketName, removed)
			}
			e, err := n.k.WaitConnected(ctx(t), harness.ResourceName)
			if err != nil {
				t.Fatal(err)
			}
			took = append(took, e.ConnectedAt.Sub(n.k.Started()))
			l, err := n.k.WaitDevices(ctx(t), harness.ResourceName, "every GPU", harness.DeviceCount(len(n.profile.GPUs)))
			if err != nil {
				t.Fatal(err)
			}
			for id, d := range l.Devices {
				want := api.Healthy
				if id == sick {
					want = api.Unhealthy
				}
				if d.Health != want {
					t.Errorf("round %d: %s health = %s after restart, want %s", round, id, d.Health, want)
				}
			}
			if _, err := e.Allocate(ctx(t), n.uuid(1)); err != nil {
				t.Errorf("round %d: Allocate through the new connection: %v", round, err)
			}
			if s := n.k.Stats(); len(s.Rejected) > 0 {
				t.Errorf("round %d: the new kubelet refused %v", round, s.Rejected)
			}
		}
		t.Logf("re-registration after kubelet restart (Start returned → connected): %v", took)
		for round, d := range took {
			if d > reregisterLimit {
				t.Errorf("round %d: re-registered %v after the kubelet started, want under %v", round, d, reregisterLimit)
			}
		}
	})
}

// TestXID79: an XID 79 (fallen off the bus) injected on one GPU turns that
// GPU, and only it, Unhealthy, and Allocate refuses it.
func TestXID79(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		i := len(n.profile.GPUs) / 2
		sick := n.uuid(i)
		injected := time.Now()
		if err := n.p.Inject(fmt.Sprintf("xid %d 79", i)); err != nil {
			t.Fatal(err)
		}
		l, err := n.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU %d unhealthy", i), harness.DeviceHealth(sick, api.Unhealthy))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("XID 79 on GPU %d seen by the kubelet after %v", i, l.ReceivedAt.Sub(injected))
		onlyUnhealthy(t, l, sick)
		loggedOnce(t, n, sick, api.Unhealthy, "79")
		if _, err := n.e.Allocate(ctx(t), sick); status.Code(err) != codes.InvalidArgument || !strings.Contains(fmt.Sprint(err), sick) {
			t.Errorf("Allocate of the unhealthy GPU: err = %v, want InvalidArgument naming %s", err, sick)
		}
	})
}

// TestThermal: a GPU at its slowdown temperature turns Unhealthy on the
// next poll, alone; cooled well below it, it turns Healthy again.
func TestThermal(t *testing.T) {
	forEachProfile(t, func(t *testing.T, n *node) {
		i := 1
		hot := n.uuid(i)
		if err := n.p.Inject(fmt.Sprintf("temp %d 95", i)); err != nil {
			t.Fatal(err)
		}
		l, err := n.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU %d unhealthy", i), harness.DeviceHealth(hot, api.Unhealthy))
		if err != nil {
			t.Fatal(err)
		}
		onlyUnhealthy(t, l, hot)
		loggedOnce(t, n, hot, api.Unhealthy, "95")
		cooled := time.Now()
		if err := n.p.Inject(fmt.Sprintf("temp %d 40", i)); err != nil {
			t.Fatal(err)
		}
		if l, err = n.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU %d healthy again", i), harness.DeviceHealth(hot, api.Healthy)); err != nil {
			t.Fatal(err)
		}
		t.Logf("GPU %d healthy %v after cooling (poll %v)", i, l.ReceivedAt.Sub(cooled), pollInterval)
		onlyUnhealthy(t, l)
		loggedOnce(t, n, hot, api.Healthy, "")
	})
}

// loggedOnce checks that the plugin logged the device's transition to
// health exactly once, with a reason that mentions why ("" when healthy).
func loggedOnce(t *testing.T, n *node, id, health, why string) {
	t.Helper()
	transition := func(e harness.LogEntry) bool { return e.String("device") == id && e.String("new") == health }
	e, err := n.p.WaitLog(ctx(t), fmt.Sprintf("log of %s turning %s", id, health), transition)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.String("reason"), why) {
		t.Errorf("logged %v: reason %q does not mention %q", e, e.String("reason"), why)
	}
	var count int
	for _, e := range n.p.LogEntries() {
		if transition(e) {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%s turning %s logged %d times, want once", id, health, count)
	}
}

// onlyUnhealthy checks that exactly the sick devices are Unhealthy in l.
func onlyUnhealthy(t *testing.T, l harness.List, sick ...string) {
	t.Helper()
	for id, d := range l.Devices {
		want := api.Healthy
		if slices.Contains(sick, id) {
			want = api.Unhealthy
		}
		if d.Health != want {
			t.Errorf("%s health = %s, want %s", id, d.Health, want)
		}
	}
}

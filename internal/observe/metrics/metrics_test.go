package metrics

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

const (
	healthyHead = `
# HELP gpu_device_plugin_device_healthy 1 when the device is healthy, 0 when it is not; reason says why not (empty when healthy).
# TYPE gpu_device_plugin_device_healthy gauge
`
	transitionsHead = `
# HELP gpu_device_plugin_health_transitions_total Health transitions per device, by the state entered and the reason (empty when Healthy).
# TYPE gpu_device_plugin_health_transitions_total counter
`
	infoHead = `
# HELP gpu_device_plugin_device_info 1 for every device served: its UUID, index and model (a GPU's product name, a NIC's vendor:device), PCI bus ID and NUMA node.
# TYPE gpu_device_plugin_device_info gauge
`
	allocatedHead = `
# HELP gpu_device_plugin_device_allocated 1 for every container holding a device, as the kubelet's PodResources API says at scrape time.
# TYPE gpu_device_plugin_device_allocated gauge
`
)

func newMetrics(t *testing.T) (*Metrics, *exposition.Registry) {
	t.Helper()
	reg := exposition.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// scrape is what /metrics would say: reg's exposition, only the families
// named when any are.
func scrape(t *testing.T, reg *exposition.Registry, names ...string) string {
	t.Helper()
	var b strings.Builder
	if _, err := reg.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		return b.String()
	}
	var out strings.Builder
	for line := range strings.Lines(b.String()) {
		name := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = rest
		}
		name = name[:strings.IndexAny(name, "{ ")]
		for _, n := range names {
			if name == n || name == n+"_bucket" || name == n+"_sum" || name == n+"_count" {
				out.WriteString(line)
			}
		}
	}
	return out.String()
}

// compare checks the families named against want, whose blank lines do
// not count.
func compare(t *testing.T, reg *exposition.Registry, want string, names ...string) {
	t.Helper()
	var w strings.Builder
	for line := range strings.Lines(want) {
		if strings.TrimSpace(line) != "" {
			w.WriteString(line)
		}
	}
	if got := scrape(t, reg, names...); got != w.String() {
		t.Errorf("scrape of %v:\n%s\nwant:\n%s", names, got, w.String())
	}
}

// collect is c's exposition alone.
func collect(t *testing.T, c exposition.Collector) string {
	t.Helper()
	reg := exposition.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return scrape(t, reg)
}

// series counts the samples in an exposition.
func series(exposition string) int {
	n := 0
	for line := range strings.Lines(exposition) {
		if !strings.HasPrefix(line, "#") {
			n++
		}
	}
	return n
}

// The healthy gauge and the transition counter carry the reason; a
// device whose reason changes keeps one gauge series. (When the health
// watcher calls Health and Transition is pinned in package health.)
func TestMetricsReason(t *testing.T) {
	m, reg := newMetrics(t)
	rec := m.For("nvidia.com/gpu")
	rec.Health("GPU-0", true, "")
	rec.Health("GPU-1", true, "")
	compare(t, reg, healthyHead+`
gpu_device_plugin_device_healthy{device="GPU-0",reason="",resource="nvidia.com/gpu"} 1
gpu_device_plugin_device_healthy{device="GPU-1",reason="",resource="nvidia.com/gpu"} 1
`, "gpu_device_plugin_device_healthy", "gpu_device_plugin_health_transitions_total")

	rec.Health("GPU-1", false, "xid=79")
	rec.Transition("GPU-1", false, "xid=79")
	compare(t, reg, healthyHead+`
gpu_device_plugin_device_healthy{device="GPU-0",reason="",resource="nvidia.com/gpu"} 1
gpu_device_plugin_device_healthy{device="GPU-1",reason="xid=79",resource="nvidia.com/gpu"} 0
`+transitionsHead+`
gpu_device_plugin_health_transitions_total{device="GPU-1",reason="xid=79",resource="nvidia.com/gpu",to="Unhealthy"} 1
`, "gpu_device_plugin_device_healthy", "gpu_device_plugin_health_transitions_total")

	rec.Health("GPU-1", false, "xid=79, thermal=95C>=slowdown 90C")
	compare(t, reg, healthyHead+`
gpu_device_plugin_device_healthy{device="GPU-0",reason="",resource="nvidia.com/gpu"} 1
gpu_device_plugin_device_healthy{device="GPU-1",reason="xid=79, thermal=95C>=slowdown 90C",resource="nvidia.com/gpu"} 0
`+transitionsHead+`
gpu_device_plugin_health_transitions_total{device="GPU-1",reason="xid=79",resource="nvidia.com/gpu",to="Unhealthy"} 1
`, "gpu_device_plugin_device_healthy", "gpu_device_plugin_health_transitions_total")
}

// Back to healthy: the reason is gone from the gauge, and the transition
// is counted without one.
func TestMetricsRecovery(t *testing.T) {
	m, reg := newMetrics(t)
	rec := m.For("example.com/rdma")
	rec.Health("0000:18:00.0", false, "link down")
	rec.Transition("0000:18:00.0", false, "link down")
	rec.Health("0000:18:00.0", true, "")
	rec.Transition("0000:18:00.0", true, "ignored when healthy")
	compare(t, reg, healthyHead+`
gpu_device_plugin_device_healthy{device="0000:18:00.0",reason="",resource="example.com/rdma"} 1
`+transitionsHead+`
gpu_device_plugin_health_transitions_total{device="0000:18:00.0",reason="",resource="example.com/rdma",to="Healthy"} 1
gpu_device_plugin_health_transitions_total{device="0000:18:00.0",reason="link down",resource="example.com/rdma",to="Unhealthy"} 1
`, "gpu_device_plugin_device_healthy", "gpu_device_plugin_health_transitions_total")
}

func TestInfoMetric(t *testing.T) {
	m, reg := newMetrics(t)
	m.SetInfo("nvidia.com/gpu", "GPU-0", DeviceInfo{UUID: "GPU-0", Index: "0", Model: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:07:00.0", NUMANode: 0, DRAName: "gpu-0"})
	m.SetInfo("example.com/rdma", "0000:18:00.0", DeviceInfo{Model: "15b3:1021", PCIBusID: "0000:18:00.0", NUMANode: -1})
	// Set again with new facts: still one series.
	m.SetInfo("example.com/rdma", "0000:18:00.0", DeviceInfo{Model: "15b3:1021", PCIBusID: "0000:18:00.0", NUMANode: 1})
	compare(t, reg, infoHead+`
gpu_device_plugin_device_info{device="0000:18:00.0",index="",model="15b3:1021",numa_node="1",pci_bus_id="0000:18:00.0",resource="example.com/rdma",uuid=""} 1
gpu_device_plugin_device_info{device="GPU-0",index="0",model="NVIDIA H100 80GB HBM3",numa_node="0",pci_bus_id="0000:07:00.0",resource="nvidia.com/gpu",uuid="GPU-0"} 1
`, "gpu_device_plugin_device_info")
	m.SetInfo("nvidia.com/gpu", "GPU-0", DeviceInfo{UUID: "GPU-0", Index: "0", NUMANode: -1})
	compare(t, reg, infoHead+`
gpu_device_plugin_device_info{device="0000:18:00.0",index="",model="15b3:1021",numa_node="1",pci_bus_id="0000:18:00.0",resource="example.com/rdma",uuid=""} 1
gpu_device_plugin_device_info{device="GPU-0",index="0",model="",numa_node="",pci_bus_id="",resource="nvidia.com/gpu",uuid="GPU-0"} 1
`, "gpu_device_plugin_device_info")
}

func TestSharingMetrics(t *testing.T) {
	m, reg := newMetrics(t)
	m.SetInfo("nvidia.com/gpu.mps", "GPU-0", DeviceInfo{UUID: "GPU-0", Sharing: SharingMPS, Replicas: 4})
	m.SetInfo("nvidia.com/gpu.shared", "GPU-1", DeviceInfo{UUID: "GPU-1", Sharing: SharingTimeSlicing, Replicas: 2})
	m.SetInfo("nvidia.com/gpu", "GPU-2", DeviceInfo{UUID: "GPU-2"})
	up := map[string]bool{"GPU-0": false}
	m.SetMPSDaemons(func() map[string]bool { return up })
	compare(t, reg, `
# HELP gpu_device_plugin_device_sharing 1 for every shared device: how it is shared (mode: time-slicing or mps) and how many replicas it is served as.
# TYPE gpu_device_plugin_device_sharing gauge
gpu_device_plugin_device_sharing{device="GPU-0",mode="mps",replicas="4",resource="nvidia.com/gpu.mps"} 1
gpu_device_plugin_device_sharing{device="GPU-1",mode="time-slicing",replicas="2",resource="nvidia.com/gpu.shared"} 1
# HELP gpu_device_plugin_mps_daemon_up 1 while the MPS control daemon of a GPU shared through MPS answers, 0 while it is down (its shares are then withheld).
# TYPE gpu_device_plugin_mps_daemon_up gauge
gpu_device_plugin_mps_daemon_up{device="GPU-0"} 0
`, "gpu_device_plugin_device_sharing", "gpu_device_plugin_mps_daemon_up")
	up["GPU-0"] = true
	compare(t, reg, `
# HELP gpu_device_plugin_mps_daemon_up 1 while the MPS control daemon of a GPU shared through MPS answers, 0 while it is down (its shares are then withheld).
# TYPE gpu_device_plugin_mps_daemon_up gauge
gpu_device_plugin_mps_daemon_up{device="GPU-0"} 1
`, "gpu_device_plugin_mps_daemon_up")
}

func TestAllocationCollector(t *testing.T) {
	const driver, pool = "gpu-device-plugin.github.io", "node-1"
	srv := prt.Start(t,
		prt.Pod("ml", "train", prt.Container("main", prt.Devices("nvidia.com/gpu", "GPU-0"), prt.Devices("example.com/rdma", "0000:18:00.0"))),
		// GPU-1 through DRA, by two containers sharing a claim, one of
		// them holding it through the device plugin too.
		prt.Pod("ml", "serve", prt.ClaimContainer("a", prt.Claim("ml", "c", driver, pool, "gpu-1"))),
		prt.Pod("ml", "serve", prt.ClaimContainer("b", prt.Claim("ml", "c", driver, pool, "gpu-1")), prt.Container("b", prt.Devices("nvidia.com/gpu", "GPU-1"))),
		// Not ours: another pool's gpu-2, a device without facts, another
		// resource with our NIC's address.
		prt.Pod("ml", "x", prt.ClaimContainer("c", prt.Claim("ml", "c", driver, "node-2", "gpu-2"))),
		prt.Pod("ml", "y", prt.Container("c", prt.Devices("nvidia.com/gpu", "GPU-9"), prt.Devices("example.com/other", "0000:18:00.0"))),
	)
	m, _ := newMetrics(t)
	for i, id := range []string{"GPU-0", "GPU-1", "GPU-2"} {
		m.SetInfo("nvidia.com/gpu", id, DeviceInfo{UUID: id, DRAName: "gpu-" + string(rune('0'+i))})
	}
	m.SetInfo("example.com/rdma", "0000:18:00.0", DeviceInfo{PCIBusID: "0000:18:00.0", DRAName: "nic-0000-18-00-0"})
	// The health gauge alone does not make a device known: only facts do.
	m.For("nvidia.com/gpu").Health("GPU-9", true, "")

	var socket atomic.Value
	socket.Store(srv.Socket + ".missing")
	var logs bytes.Buffer
	c := m.Allocations(AllocationOptions{
		Holders: func(ctx context.Context) (podresources.Holders, error) {
			return podresources.Client{Socket: socket.Load().(string)}.Holders(ctx)
		},
		Driver: driver, Pool: pool, Source: "the socket",
		Log: slog.New(slog.NewTextHandler(&logs, nil)),
	})

	// Unavailable: no series, one warning however many scrapes.
	for range 3 {
		if n := series(collect(t, c)); n != 0 {
			t.Errorf("%d series without the kubelet, want none", n)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "source=\"the socket\"") || !strings.Contains(logs.String(), ".missing") {
		t.Errorf("want one warning naming the source and the error, got:\n%s", logs.String())
	}

	socket.Store(srv.Socket)
	if got, want := collect(t, c), strings.TrimPrefix(allocatedHead, "\n")+`gpu_device_plugin_device_allocated{container="a",device="GPU-1",namespace="ml",pod="serve",resource="nvidia.com/gpu"} 1
gpu_device_plugin_device_allocated{container="b",device="GPU-1",namespace="ml",pod="serve",resource="nvidia.com/gpu"} 1
gpu_device_plugin_device_allocated{container="main",device="0000:18:00.0",namespace="ml",pod="train",resource="example.com/rdma"} 1
gpu_device_plugin_device_allocated{container="main",device="GPU-0",namespace="ml",pod="train",resource="nvidia.com/gpu"} 1
`; got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(logs.String(), "level=INFO") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}

	// The kubelet answering with an error is a failure like any other.
	logs.Reset()
	srv.Fail(context.DeadlineExceeded)
	for range 2 {
		if n := series(collect(t, c)); n != 0 {
			t.Errorf("%d series from a failing kubelet, want none", n)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("want one warning for a failing kubelet, got:\n%s", logs.String())
	}
}

// The API request counter, as package kubeapi tells it.
func TestAPIRequests(t *testing.T) {
	m, reg := newMetrics(t)
	m.ObserveRequest("patch", "nodes/status", "200")
	m.ObserveRequest("create", "events", "429")
	m.ObserveRequest("create", "events", "429")
	m.ObserveRequest("get", "nodes", "error")
	compare(t, reg, `
# HELP gpu_device_plugin_api_requests_total Requests to the Kubernetes API server by Events, the Node condition and Node labels, by API verb, resource and HTTP status code (error: no answer). DRA's ResourceClaim and ResourceSlice requests are not counted here.
# TYPE gpu_device_plugin_api_requests_total counter
gpu_device_plugin_api_requests_total{code="200",resource="nodes/status",verb="patch"} 1
gpu_device_plugin_api_requests_total{code="429",resource="events",verb="create"} 2
gpu_device_plugin_api_requests_total{code="error",resource="nodes",verb="get"} 1
`, "gpu_device_plugin_api_requests_total")
}

// The door gauge has no series until the runtime configs are read, then
// one, which a later reading replaces.
func TestRuntimeDoorMetric(t *testing.T) {
	const head = `
# HELP gpu_device_plugin_runtime_envvar_door_open 1 when any pod, even one that asks for no GPU, can see every GPU by setting NVIDIA_VISIBLE_DEVICES, as the node's container runtime configs say at start; 0 when not, or when unknown (reason unreadableConfig).
# TYPE gpu_device_plugin_runtime_envvar_door_open gauge
`
	tests := []struct {
		name            string
		open            bool
		runtime, reason string
		want            string
	}{
		{name: "open", open: true, runtime: "containerd", reason: "envvarAccepted",
			want: head + `gpu_device_plugin_runtime_envvar_door_open{reason="envvarAccepted",runtime="containerd"} 1` + "\n"},
		{name: "closed by the toolkit", open: false, runtime: "cri-o", reason: "envvarRefused",
			want: head + `gpu_device_plugin_runtime_envvar_door_open{reason="envvarRefused",runtime="cri-o"} 0` + "\n"},
		{name: "no NVIDIA runtime", open: false, runtime: "", reason: "noNVIDIARuntime",
			want: head + `gpu_device_plugin_runtime_envvar_door_open{reason="noNVIDIARuntime",runtime=""} 0` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, reg := newMetrics(t)
			compare(t, reg, "", "gpu_device_plugin_runtime_envvar_door_open")
			m.SetRuntimeDoor(!tt.open, "other", "before")
			m.SetRuntimeDoor(tt.open, tt.runtime, tt.reason)
			compare(t, reg, tt.want, "gpu_device_plugin_runtime_envvar_door_open")
		})
	}
}

func TestRemediationMetrics(t *testing.T) {
	reg := exposition.NewRegistry()
	r, err := NewRemediation(reg)
	if err != nil {
		t.Fatal(err)
	}
	// There from the start, as client_golang's plain counter and
	// histogram were.
	if got := scrape(t, reg, "gpu_device_plugin_remediation_recoveries_total", "gpu_device_plugin_remediation_recovery_seconds"); !strings.Contains(got, "gpu_device_plugin_remediation_recoveries_total 0\n") ||
		!strings.Contains(got, "gpu_device_plugin_remediation_recovery_seconds_count 0\n") {
		t.Errorf("before any recovery:\n%s", got)
	}
	r.State("GPU-0", "serving")
	r.State("GPU-0", "draining")
	r.State("GPU-1", "serving")
	r.Reset("success")
	r.Recovered(90 * time.Second)
	compare(t, reg, `
# HELP gpu_device_plugin_remediation_recoveries_total GPUs given back after their remediation (reset or drain, then probe), or released by a human.
# TYPE gpu_device_plugin_remediation_recoveries_total counter
gpu_device_plugin_remediation_recoveries_total 1
# HELP gpu_device_plugin_remediation_resets_total GPU resets the remediation made, by result (success, failure); a reset of NVLink peers together counts once.
# TYPE gpu_device_plugin_remediation_resets_total counter
gpu_device_plugin_remediation_resets_total{result="success"} 1
# HELP gpu_device_plugin_remediation_state 1 for the remediation state each GPU is in: serving, watching, draining, waitingIdle, resetting, probing, needsHuman, needsReboot.
# TYPE gpu_device_plugin_remediation_state gauge
gpu_device_plugin_remediation_state{gpu="GPU-0",state="draining"} 1
gpu_device_plugin_remediation_state{gpu="GPU-1",state="serving"} 1
`, "gpu_device_plugin_remediation_resets_total", "gpu_device_plugin_remediation_recoveries_total", "gpu_device_plugin_remediation_state")
	// 90s is in the 120s bucket and every one above it.
	got := scrape(t, reg, "gpu_device_plugin_remediation_recovery_seconds")
	for _, want := range []string{`_bucket{le="60"} 0` + "\n", `_bucket{le="120"} 1` + "\n", `_bucket{le="+Inf"} 1` + "\n", "_sum 90\n", "_count 1\n"} {
		if !strings.Contains(got, "gpu_device_plugin_remediation_recovery_seconds"+want) {
			t.Errorf("recovery_seconds lacks %q:\n%s", want, got)
		}
	}
}

package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/nicscan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

type apiCall struct {
	method, path string
	body         map[string]any
}

// fakeAPIServer answers the reporter's calls and passes each on.
func fakeAPIServer(t *testing.T) (kubeconfig string, calls <-chan apiCall) {
	t.Helper()
	ch := make(chan apiCall, 256)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := apiCall{method: r.Method, path: r.URL.Path}
		if b, _ := io.ReadAll(r.Body); len(b) > 0 {
			if err := json.Unmarshal(b, &c.body); err != nil {
				t.Errorf("%s %s: body not JSON: %s", r.Method, r.URL.Path, b)
			}
		}
		if r.Header.Get("Authorization") != "Bearer t0ken" {
			t.Errorf("%s %s without the token", r.Method, r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "GET" && r.URL.Path == "/api/v1/nodes/n1":
			io.WriteString(w, `{"metadata":{"name":"n1","uid":"node-uid"}}`)
		case strings.Contains(r.URL.Path, "/pods"):
			// RBAC grants no pods access: the plugin must not ask.
			t.Errorf("%s %s: the plugin read a pod", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusForbidden)
		case r.Method == "POST":
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "{}")
		default:
			io.WriteString(w, "{}")
		}
		select {
		case ch <- c:
		default:
			t.Errorf("too many API calls; dropped %s %s", r.Method, r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	body := "apiVersion: v1\nkind: Config\ncurrent-context: test\n" +
		"clusters:\n- name: test\n  cluster:\n    server: " + srv.URL + "\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString(ca) + "\n" +
		"contexts:\n- name: test\n  context: {cluster: test, user: test}\n" +
		"users:\n- name: test\n  user:\n    token: t0ken\n"
	if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, ch
}

// waitFor returns the first call ok accepts, failing the test after a
// generous limit.
func waitFor(t *testing.T, calls <-chan apiCall, what string, ok func(apiCall) bool) apiCall {
	t.Helper()
	limit := time.After(20 * time.Second)
	for {
		select {
		case c := <-calls:
			if ok(c) {
				return c
			}
		case <-limit:
			t.Fatalf("no %s reached the API server", what)
		}
	}
}

func condition(c apiCall) map[string]any {
	st, _ := c.body["status"].(map[string]any)
	conds, _ := st["conditions"].([]any)
	if len(conds) != 1 {
		return nil
	}
	m, _ := conds[0].(map[string]any)
	return m
}

// An XID reaches the API server as Events on the Node and on the pod
// holding the GPU, and as the GPUHealthy condition, which was set True at
// start; /metrics counts those requests. XID 54 (auxiliary power, a
// transient XID) is one the remediation leaves to health (it only
// watches), so health's own word is what the cluster hears.
func TestHealthReachesTheAPIServer(t *testing.T) {
	kubeconfig, calls := fakeAPIServer(t)
	kubelet := podresourcestest.Start(t)
	cfg := testConfig(t)
	cfg.Events, cfg.NodeCondition = true, true
	cfg.Kubeconfig, cfg.NodeName, cfg.PodResourcesSocket = kubeconfig, "n1", kubelet.Socket
	cfg.MetricsAddress = "127.0.0.1:0"
	openDoor(t, cfg.RuntimeConfigRoot)
	addr := make(chan string, 1)
	lib := nvmltest.NewDGXA100()
	events := nvmltest.WithEvents(lib)
	uuid, ret := lib.Devices[5].GetUUID()
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	kubelet.Set(podresourcestest.Pod("ml", "trainer", podresourcestest.Container("main", podresourcestest.Devices(resname.GPU, uuid))))
	// The pod's UID comes from the kubelet's device checkpoint, not the API server.
	checkpoint := `{"Data":{"PodDeviceEntries":[{"PodUID":"pod-uid","ContainerName":"main","ResourceName":"` + resname.GPU +
		`","DeviceIDs":{"0":["` + uuid + `"]},"AllocResp":"CgA="}],"RegisteredDevices":{}},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(cfg.DevicePluginDir, podresources.CheckpointFile), []byte(checkpoint), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, slog.New(addressHandler{addr}))
	}()

	isCondition := func(status string) func(apiCall) bool {
		return func(c apiCall) bool {
			return c.method == "PATCH" && c.path == "/api/v1/nodes/n1/status" && condition(c)["status"] == status
		}
	}
	c := condition(waitFor(t, calls, "start-up condition", isCondition("True")))
	// The runtime's open door is said, and the condition stays True.
	if msg, _ := c["message"].(string); c["type"] != "GPUHealthy" || c["reason"] != "AllGPUsHealthy" ||
		!strings.HasPrefix(msg, "all 8 GPUs are healthy; any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES") {
		t.Fatalf("start-up condition %v", c)
	}

	events <- gonvml.EventData{Device: lib.Devices[5], EventType: gonvml.EventTypeXidCriticalError, EventData: 54}
	label := uuid + " (index 5)"
	var onNode, onPod bool
	for !onNode || !onPod {
		e := waitFor(t, calls, "Event", func(c apiCall) bool { return c.method == "POST" }).body
		obj, _ := e["involvedObject"].(map[string]any)
		if e["reason"] != "GPUUnhealthy" || e["type"] != "Warning" || e["message"] != label+": xid=54: auxiliary power not connected" {
			t.Fatalf("Event %v", e)
		}
		switch {
		case obj["kind"] == "Node" && obj["name"] == "n1" && obj["uid"] == "node-uid":
			onNode = true
		case obj["kind"] == "Pod" && obj["namespace"] == "ml" && obj["name"] == "trainer" && obj["uid"] == "pod-uid":
			onPod = true
		default:
			t.Fatalf("Event about %v", obj)
		}
	}
	c = condition(waitFor(t, calls, "unhealthy condition", isCondition("False")))
	if msg, _ := c["message"].(string); c["reason"] != "GPUUnhealthy" || !strings.HasPrefix(msg, label+": xid=54: auxiliary power not connected; any pod can see every GPU") {
		t.Fatalf("unhealthy condition %v", c)
	}
	resp, err := http.Get("http://" + <-addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The reporter sends in order: the Events were answered before the
	// condition's PATCH went out, whose own answer may still be on its way.
	for _, want := range []string{
		`gpu_device_plugin_api_requests_total{code="200",resource="nodes/status",verb="patch"} `,
		`gpu_device_plugin_api_requests_total{code="201",resource="events",verb="create"} 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(body), `resource="pods"`) {
		t.Errorf("/metrics counts requests about pods: the plugin may not read them")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Reporting that cannot reach the API server's configuration fails the
// start, saying what to set.
func TestReportingNeedsAPIAccess(t *testing.T) {
	cfg := testConfig(t)
	cfg.Events = true
	cfg.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	err := Run(context.Background(), cfg, func(string) (nvml.Library, error) { return nil, nvml.ErrNoDriver }, nil)
	if err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("err = %v", err)
	}
}

// chanAPI is a report.API that passes on what it is sent.
type chanAPI struct {
	events chan kubeapi.Event
	conds  chan kubeapi.NodeCondition
}

func (a chanAPI) CreateEvent(_ context.Context, e kubeapi.Event) error {
	a.events <- e
	return nil
}

func (a chanAPI) PatchEvent(context.Context, string, string, int32, kubeapi.Time) error { return nil }

func (a chanAPI) GetNode(context.Context, string) (kubeapi.Node, error) { return kubeapi.Node{}, nil }

func (a chanAPI) PatchNodeCondition(_ context.Context, _ string, c kubeapi.NodeCondition) error {
	a.conds <- c
	return nil
}

// A NIC gone from sysfs is an Event and makes NICHealthy False.
func TestNICHealthIsReported(t *testing.T) {
	root, cfg := nicConfig(t)
	api := chanAPI{events: make(chan kubeapi.Event, 64), conds: make(chan kubeapi.NodeCondition, 64)}
	rep, err := report.New(api, report.Options{Node: "n1", Events: true, NodeCondition: true, NICs: true})
	if err != nil {
		t.Fatal(err)
	}
	r := &reporting{rep: rep, nicIDs: map[*nic.Pool]map[string]bool{}}
	pools, err := NICPools(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := NICScan(cfg)
	o.Front, o.Info, o.Scanned = noFront{}, devinfo.NewLocked(cfg.DeviceInfoDir), r.nicScan
	s := nicscan.New(pools, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rep.Run(ctx)

	s.Rescan(true)
	waitCond := func(status string) kubeapi.NodeCondition {
		t.Helper()
		limit := time.After(20 * time.Second)
		for {
			select {
			case c := <-api.conds:
				if c.Type == report.ConditionNICHealthy && c.Status == status {
					return c
				}
			case <-limit:
				t.Fatalf("no NICHealthy=%s", status)
			}
		}
	}
	if c := waitCond("True"); c.Reason != report.ReasonAllNICsHealthy {
		t.Fatalf("start-up condition %+v", c)
	}
	for _, dir := range []string{filepath.Join("bus", "pci", "devices"), filepath.Join("devices", "pci0000:00")} {
		if err := os.RemoveAll(filepath.Join(root, "sys", dir, "0000:40:00.0")); err != nil {
			t.Fatal(err)
		}
	}
	s.Rescan(false)
	const msg = "0000:40:00.0 (example.com/rdma_numa0): removed: gone from sysfs"
	if c := waitCond("False"); c.Reason != report.ReasonNICUnhealthy || c.Message != msg {
		t.Fatalf("condition %+v", c)
	}
	select {
	case e := <-api.events:
		if e.Reason != report.ReasonNICUnhealthy || e.Message != msg {
			t.Fatalf("Event %+v", e)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no Event")
	}
}

// noFront serves nothing: the test looks at what reporting is told.
type noFront struct{}

func (noFront) SetNICDevices(*nic.Pool, []device.Device, bool) {}
func (noFront) ServeNICs(context.Context) error                { return nil }

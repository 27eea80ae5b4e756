package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// The DRA lane: the same node served through Dynamic Resource Allocation.
const (
	draDriver   = "gpu-device-plugin.github.io"
	gpuClass    = "gpu.gpu-device-plugin.github.io"
	draPodClaim = "dra-claim"    // a pod with a ResourceClaimTemplate for one GPU
	draPodExt   = "dra-extended" // an unchanged pod asking nvidia.com/gpu: 1
	draPodPair  = "dra-aligned"  // two GPUs and an RDMA NIC on one NUMA node
	oneGPU      = "one-gpu"
	alignedTmpl = "two-gpus-one-nic"
)

var draPods = []string{draPodClaim, draPodExt, draPodPair}

// TestDRANode runs the plugin's life on the node in DRA mode, in order.
func TestDRANode(t *testing.T) {
	ctx := t.Context()
	s := &draScenario{}
	steps := []step{
		{"install in DRA mode", s.install},
		{"ResourceSlice lists every GPU and NIC with their attributes", s.slice},
		{"readiness probe passes once the slices are published", s.ready},
		{"pod with a ResourceClaimTemplate gets a GPU through CDI", s.claimPod},
		{"the pod's container reads its GPU's attributes in the device metadata file (KEP-5304)", s.deviceMetadata},
		{"pod asking nvidia.com/gpu is served through DRA", s.extendedPod},
		{"two GPUs and an RDMA NIC on one NUMA node in one claim", s.alignedClaim},
		{"XID 79 reaches the pod status and taints the device until it recovers", s.xid},
		{"plugin restart keeps prepared claims", s.pluginRestart},
		{"a corrupt checkpoint: the claims are rebuilt from the kubelet and the API server", s.corruptCheckpoint},
		{"deleting the pods unprepares their claims", s.unprepare},
		{"uninstall removes the slices; the documented step the CDI specs", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, draPods...)
	runSteps(t, ctx, steps)
}

type draScenario struct {
	release *release
	plugin  string
	// claimGPU is the device (gpu-N) the claim pod holds, and its UUID.
	claimGPU, claimUUID string
	// claimName is that pod's ResourceClaim.
	claimName string
	// claims are the pods' ResourceClaim UIDs, by pod.
	claims map[string][]string
}

// draValues are chartValues in DRA mode.
func draValues() (map[string]any, error) {
	v, err := chartValues("envvar")
	if err != nil {
		return nil, err
	}
	v["kubeletAPI"] = "dra"
	return v, nil
}

// apiHostPort is the API server's address as the plugin's pod, on the
// node's network, reaches it: E2E_NODE_API_SERVER (kind: the node's own
// port, which the host sees forwarded elsewhere), else the suite's own.
func apiHostPort() (host, port string, err error) {
	if hp := env.NodeAPIServer; hp != "" {
		host, port, err = net.SplitHostPort(hp)
		if err != nil {
			return "", "", fmt.Errorf("E2E_NODE_API_SERVER %q: want host:port: %w", hp, err)
		}
		return host, port, nil
	}
	u, err := url.Parse(k8s.config.Host)
	if err != nil {
		return "", "", fmt.Errorf("API server address %q: %w", k8s.config.Host, err)
	}
	return u.Hostname(), u.Port(), nil
}

// draPluginDir is the kubelet's directory of our DRA driver, as this
// process sees it.
func draPluginDir() string {
	return filepath.Join(filepath.Dir(env.DevicePluginDir), "plugins", draDriver)
}

// checkpointClaims are the claim UIDs in the plugin's DRA checkpoint.
func checkpointClaims() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(draPluginDir(), "checkpoint.json"))
	if err != nil {
		return nil, err
	}
	var c struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return sortedKeys(c.Claims), nil
}

// nodeSlices are our driver's ResourceSlices of this node, and their
// devices by name.
func nodeSlices(ctx context.Context) ([]resourceapi.ResourceSlice, map[string]resourceapi.Device, error) {
	l, err := k8s.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + draDriver + ",spec.nodeName=" + env.Node,
	})
	if err != nil {
		return nil, nil, err
	}
	devs := map[string]resourceapi.Device{}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			devs[d.Name] = d
		}
	}
	return l.Items, devs, nil
}

// waitSlices polls the slices until ok holds.
func waitSlices(ctx context.Context, what string, ok func(map[string]resourceapi.Device) bool) (map[string]resourceapi.Device, error) {
	var last map[string]resourceapi.Device
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, devs, err := nodeSlices(ctx)
		if err != nil {
			return false, nil
		}
		last = devs
		return ok(devs), nil
	})
	if err != nil {
		b, _ := json.MarshalIndent(last, "", "  ")
		return last, fmt.Errorf("ResourceSlices not %s: %w\n%s", what, err, b)
	}
	return last, nil
}

func strAttr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	a := d.Attributes[name]
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	}
	return ""
}

func (s *draScenario) install(t *testing.T, ctx context.Context) {
	values, err := draValues()
	if err != nil {
		t.Fatal(err)
	}
	healthRulesOnly(values)
	s.release = installDRA(t, ctx, values, draPods...)
	t.Logf("installed %s", s.release)
	if s.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *draScenario) ready(t *testing.T, ctx context.Context) {
	if err := waitPluginReady(ctx, s.plugin); err != nil {
		t.Fatal(err)
	}
}

// installDRA readies the node, deletes the lane's pods left from an
// earlier run and applies the release of values (draValues, changed as
// the lane needs).
func installDRA(t *testing.T, ctx context.Context, values map[string]any, pods ...string) *release {
	t.Helper()
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deletePods(ctx, pods...); err != nil {
		t.Fatal(err)
	}
	r, err := renderValues(values)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *draScenario) slice(t *testing.T, ctx context.Context) {
	nics, err := fixtureNICs()
	if err != nil {
		t.Fatal(err)
	}
	want := len(env.Profile.GPUs) + len(nics)
	devs, err := waitSlices(ctx, fmt.Sprintf("holding %d devices", want), func(d map[string]resourceapi.Device) bool { return len(d) == want })
	if err != nil {
		t.Fatal(err)
	}
	// Time from the plugin's container start to the slice, for the report.
	if pod, err := k8s.kube.CoreV1().Pods(releaseNamespace).Get(ctx, s.plugin, metav1.GetOptions{}); err == nil {
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil {
				sl, _, _ := nodeSlices(ctx)
				for _, x := range sl {
					t.Logf("first ResourceSlice %s created %s after the plugin container started", x.Name, x.CreationTimestamp.Sub(cs.State.Running.StartedAt.Time))
				}
			}
		}
	}
	for _, g := range env.Profile.GPUs {
		d, ok := devs[fmt.Sprintf("gpu-%d", g.Index)]
		if !ok {
			t.Errorf("no device gpu-%d", g.Index)
			continue
		}
		for name, want := range map[resourceapi.QualifiedName]string{
			"type": "gpu", "uuid": g.UUID, "index": fmt.Sprint(g.Index), "minor": fmt.Sprint(g.Minor),
			"resource.kubernetes.io/pciBusID": g.BusID, "resource.kubernetes.io/numaNode": fmt.Sprint(g.NUMANode),
		} {
			if got := strAttr(d, name); got != want {
				t.Errorf("gpu-%d %s = %q, want %q", g.Index, name, got, want)
			}
		}
		for _, name := range []resourceapi.QualifiedName{"productName", "driverVersion", "cudaComputeCapability", "nvlinkClique"} {
			if strAttr(d, name) == "" {
				t.Errorf("gpu-%d has no %s", g.Index, name)
			}
		}
		if q, ok := d.Capacity["memory"]; !ok || q.Value.IsZero() {
			t.Errorf("gpu-%d memory capacity = %v", g.Index, d.Capacity)
		}
	}
	for _, n := range nics {
		name := "nic-" + strings.NewReplacer(":", "-", ".", "-").Replace(n.Address)
		d, ok := devs[name]
		if !ok {
			t.Errorf("no device %s", name)
			continue
		}
		for attr, want := range map[resourceapi.QualifiedName]string{
			"type": "nic", "pool": string(nicPool(n.NUMA)), "rdma": "true",
			"resource.kubernetes.io/pciBusID": n.Address, "resource.kubernetes.io/numaNode": fmt.Sprint(n.NUMA),
		} {
			if got := strAttr(d, attr); got != want {
				t.Errorf("%s %s = %q, want %q", name, attr, got, want)
			}
		}
		if strAttr(d, "resource.kubernetes.io/pcieRoot") == "" {
			t.Errorf("%s has no pcieRoot", name)
		}
	}
}

// claimProbePod is cudaProbePod taking its GPUs from a ResourceClaim made
// from template.
func claimProbePod(name, template string) *corev1.Pod {
	p := cudaProbePod(name, 0)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "devices"}}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimTemplateName: &template}}
	return p
}

func createTemplate(ctx context.Context, name string, spec resourceapi.DeviceClaim) error {
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}},
	}
	err := k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	_, err = k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Create(ctx, tmpl, metav1.CreateOptions{})
	return err
}

// podClaims are the allocation results of pod's ResourceClaims.
func podClaims(ctx context.Context, pod *corev1.Pod) ([]resourceapi.ResourceClaim, error) {
	var out []resourceapi.ResourceClaim
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		c, err := k8s.kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, *c)
	}
	if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
		c, err := k8s.kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, ext.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, *c)
	}
	return out, nil
}

// ourDevices are the devices of claims that our driver allocated.
func ourDevices(claims []resourceapi.ResourceClaim) []string {
	var out []string
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == draDriver {
				out = append(out, r.Device)
			}
		}
	}
	slices.Sort(out)
	return out
}

func (s *draScenario) record(pod string, claims []resourceapi.ResourceClaim) {
	if s.claims == nil {
		s.claims = map[string][]string{}
	}
	for _, c := range claims {
		s.claims[pod] = append(s.claims[pod], string(c.UID))
	}
}

// uuidOf is the UUID of device gpu-N.
func uuidOf(dev string) string {
	for _, g := range env.Profile.GPUs {
		if dev == fmt.Sprintf("gpu-%d", g.Index) {
			return g.UUID
		}
	}
	return ""
}

func (s *draScenario) claimPod(t *testing.T, ctx context.Context) {
	if err := createTemplate(ctx, oneGPU, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass},
	}}}); err != nil {
		t.Fatal(err)
	}
	p := claimProbePod(draPodClaim, oneGPU)
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "-cat="+claimMetadataPath())
	pod, err := createPod(ctx, p, true)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := podClaims(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	devs := ourDevices(claims)
	if len(devs) != 1 {
		t.Fatalf("claim devices = %v, want one GPU", devs)
	}
	s.claimGPU, s.claimUUID = devs[0], uuidOf(devs[0])
	s.claimName = claims[0].Name
	s.record(draPodClaim, claims)
	rep, err := probeOutput(ctx, draPodClaim)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, []string{s.claimUUID})
	checkCUDA(t, rep)
}

func (s *draScenario) extendedPod(t *testing.T, ctx context.Context) {
	pod, err := createPod(ctx, probePod(draPodExt, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("pod %s runs, but not through DRA: no extendedResourceClaimStatus%s", draPodExt, describePod(ctx, pod))
	}
	claims, err := podClaims(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	devs := ourDevices(claims)
	if len(devs) != 1 || devs[0] == s.claimGPU {
		t.Fatalf("extended-resource claim devices = %v, want one GPU other than %s", devs, s.claimGPU)
	}
	s.record(draPodExt, claims)
	rep, err := probeOutput(ctx, draPodExt)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, []string{uuidOf(devs[0])})
}

// nicClass is the DeviceClass r makes for the NIC pool of NUMA node numa.
func (r *release) nicClass(numa int) (string, error) {
	for _, u := range r.objects {
		if u.GetKind() == "DeviceClass" && u.GetName() != gpuClass && strings.Contains(u.GetName(), fmt.Sprintf("numa%d", numa)) {
			return u.GetName(), nil
		}
	}
	return "", fmt.Errorf("the chart made no DeviceClass for the NUMA %d NIC pool: %s", numa, r)
}

// alignedClaimSpec asks for two GPUs and an RDMA NIC of nicClass on one
// NUMA node.
func alignedClaimSpec(nicClass string) resourceapi.DeviceClaim {
	numa := resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode")
	return resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{
			{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2}},
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicClass}},
		},
		Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"gpus", "nic"}, MatchAttribute: &numa}},
	}
}

func (s *draScenario) alignedClaim(t *testing.T, ctx context.Context) {
	nicClass, err := s.release.nicClass(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := createTemplate(ctx, alignedTmpl, alignedClaimSpec(nicClass)); err != nil {
		t.Fatal(err)
	}
	pod := claimProbePod(draPodPair, alignedTmpl)
	pod, err = createPod(ctx, pod, true)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := podClaims(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	s.record(draPodPair, claims)
	_, devs, err := nodeSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := ourDevices(claims)
	nodes := map[string]bool{}
	var gpus, nics int
	for _, name := range got {
		d := devs[name]
		nodes[strAttr(d, "resource.kubernetes.io/numaNode")] = true
		switch strAttr(d, "type") {
		case "gpu":
			gpus++
		case "nic":
			nics++
		}
	}
	if gpus != 2 || nics != 1 || len(nodes) != 1 || nodes["0"] != true {
		t.Fatalf("claim got %v (NUMA nodes %v), want two GPUs and a NIC on NUMA node 0", got, nodes)
	}
	t.Logf("aligned claim: %v on NUMA node 0", got)
	// Written before Prepare returned, so there by the time the pod runs.
	if err := checkClaimStatus(claims, devs); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if n, mean, err := statusApplyLatency(ctx); err != nil {
		t.Logf("the API server's latency of claim status applies: %v", err)
	} else {
		t.Logf("claim status applies so far: %d, %.1f ms each on average (apiserver_request_duration_seconds)", n, mean*1000)
	}
}

// checkClaimStatus checks the claims' status.devices entries of our
// devices (a share's by its shareID): Ready, the identifying data, and for
// a NIC its networkData as the fixture's sysfs has it (interface, hardware
// address).
func checkClaimStatus(claims []resourceapi.ResourceClaim, devs map[string]resourceapi.Device) error {
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != draDriver {
				continue
			}
			i := slices.IndexFunc(c.Status.Devices, func(e resourceapi.AllocatedDeviceStatus) bool {
				return e.Driver == r.Driver && e.Pool == r.Pool && e.Device == r.Device &&
					(e.ShareID == nil) == (r.ShareID == nil) && (e.ShareID == nil || *e.ShareID == string(*r.ShareID))
			})
			if i < 0 {
				return fmt.Errorf("claim %s: no status entry for %s; status.devices %+v", c.Name, r.Device, c.Status.Devices)
			}
			e := c.Status.Devices[i]
			if !slices.ContainsFunc(e.Conditions, func(c metav1.Condition) bool {
				return c.Type == "Ready" && c.Status == metav1.ConditionTrue && c.Reason == "Prepared"
			}) {
				return fmt.Errorf("claim %s, %s: conditions %+v, want Ready True (Prepared)", c.Name, r.Device, e.Conditions)
			}
			d := devs[r.Device]
			var data map[string]string
			if e.Data == nil || json.Unmarshal(e.Data.Raw, &data) != nil {
				return fmt.Errorf("claim %s, %s: data %v, want a JSON object", c.Name, r.Device, e.Data)
			}
			bus := strAttr(d, "resource.kubernetes.io/pciBusID")
			if data["pciBusID"] != bus {
				return fmt.Errorf("claim %s, %s: data %v, want pciBusID %s", c.Name, r.Device, data, bus)
			}
			if strAttr(d, "type") != "nic" {
				if data["uuid"] != strAttr(d, "uuid") || e.NetworkData != nil {
					return fmt.Errorf("claim %s, %s: data %v, networkData %+v; want uuid %s, no networkData", c.Name, r.Device, data, e.NetworkData, strAttr(d, "uuid"))
				}
				continue
			}
			ifs, err := os.ReadDir(filepath.Join(env.Fixture, "sys", "bus", "pci", "devices", bus, "net"))
			if err != nil || len(ifs) == 0 {
				return fmt.Errorf("the fixture's NIC %s has no interface: %v", bus, err)
			}
			mac, err := os.ReadFile(filepath.Join(env.Fixture, "sys", "class", "net", ifs[0].Name(), "address"))
			if err != nil {
				return err
			}
			want := resourceapi.NetworkDeviceData{InterfaceName: ifs[0].Name(), HardwareAddress: strings.TrimSpace(string(mac))}
			if nd := e.NetworkData; nd == nil || nd.InterfaceName != want.InterfaceName || nd.HardwareAddress != want.HardwareAddress || len(nd.IPs) != 0 {
				return fmt.Errorf("claim %s, NIC %s: networkData %+v, want %+v", c.Name, r.Device, nd, want)
			}
		}
	}
	return nil
}

// statusApplyLatency is how many server-side applies of ResourceClaim
// status the API server has served, and their mean latency in seconds,
// from its request-duration histogram.
func statusApplyLatency(ctx context.Context) (int, float64, error) {
	b, err := k8s.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, 0, err
	}
	var sum, count float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `resource="resourceclaims"`) || !strings.Contains(l, `subresource="status"`) || !strings.Contains(l, `verb="APPLY"`) {
			continue
		}
		f := strings.Fields(l)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, "apiserver_request_duration_seconds_sum{"):
			sum += v
		case strings.HasPrefix(l, "apiserver_request_duration_seconds_count{"):
			count += v
		}
	}
	if count == 0 {
		return 0, 0, errors.New("none counted")
	}
	return int(count), sum / count, nil
}

// claimHealth is what the kubelet reports of the claim pod's devices, by
// resource ID.
func claimHealth(p *corev1.Pod) map[string]corev1.ResourceHealth {
	m := map[string]corev1.ResourceHealth{}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if !strings.HasPrefix(string(rs.Name), "claim:") {
				continue
			}
			for _, h := range rs.Resources {
				m[string(h.ResourceID)] = h
			}
		}
	}
	return m
}

func (s *draScenario) xid(t *testing.T, ctx context.Context) {
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	index := env.uuidIndex()[s.claimUUID]
	cdiID := "gpu-device-plugin.github.io/gpu=" + s.claimUUID
	taintKey := draDriver + "/xid"
	hasTaint := func(d resourceapi.Device) bool {
		return slices.ContainsFunc(d.Taints, func(tt resourceapi.DeviceTaint) bool {
			return tt.Key == taintKey && tt.Value == "79" && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule
		})
	}
	health := func(want corev1.ResourceHealthStatus, msg string) (time.Time, error) {
		_, err := waitPod(ctx, draPodClaim, time.Minute, fmt.Sprintf("reporting %s %s %q", cdiID, want, msg), func(p *corev1.Pod) (bool, error) {
			h, ok := claimHealth(p)[cdiID]
			return ok && h.Health == want && (msg == "" || h.Message != nil && *h.Message == msg), nil
		})
		return time.Now(), err
	}
	if _, err := health("Healthy", ""); err != nil {
		t.Fatal(err)
	}

	injected := time.Now()
	if err := ctl.InjectContext(ctx, fmt.Sprintf("xid %d 79", index)); err != nil {
		t.Fatal(err)
	}
	var tainted, reported time.Time
	done := make(chan error, 1)
	go func() {
		_, err := waitSlices(ctx, "tainting "+s.claimGPU, func(d map[string]resourceapi.Device) bool { return hasTaint(d[s.claimGPU]) })
		tainted = time.Now()
		done <- err
	}()
	if reported, err = health("Unhealthy", "xid=79: fallen off the bus"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("XID 79 on %s: pod status after %s, slice taint after %s", s.claimGPU,
		reported.Sub(injected).Round(time.Millisecond), tainted.Sub(injected).Round(time.Millisecond))
	recordDRA(fmt.Sprintf(`{"step":"xid79","podStatusAfter":%q,"taintAfter":%q}`,
		reported.Sub(injected).Round(time.Millisecond), tainted.Sub(injected).Round(time.Millisecond)))

	// A fatal XID clears once the driver asked for a reset and then says
	// none is needed any more: the GPU was reset.
	for _, cmd := range []string{fmt.Sprintf("recovery %d reset", index), fmt.Sprintf("recovery %d none", index)} {
		if err := ctl.InjectContext(ctx, cmd); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(cmd, "reset") {
			if _, err := waitSlices(ctx, "showing the reset", func(d map[string]resourceapi.Device) bool {
				return slices.ContainsFunc(d[s.claimGPU].Taints, func(tt resourceapi.DeviceTaint) bool { return tt.Key == draDriver+"/recovery-action" })
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := waitSlices(ctx, "untainting "+s.claimGPU, func(d map[string]resourceapi.Device) bool { return len(d[s.claimGPU].Taints) == 0 }); err != nil {
		t.Fatal(err)
	}
	if _, err := health("Healthy", ""); err != nil {
		t.Fatal(err)
	}
	if rss, err := draPeakRSS(); err != nil {
		t.Logf("peak RSS of the DRA plugin: %v", err)
	} else {
		t.Logf("peak RSS of the DRA plugin after three claims and a fault: %s", rss)
		recordDRA(fmt.Sprintf(`{"step":"peakRSS","vmHWM":%q}`, rss))
	}
}

// draPeakRSS is VmHWM of the plugin's process, gpu-device-plugin-dra
// (gpu-device-plugin replaced itself with it).
func draPeakRSS() (string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Base(exe) != "gpu-device-plugin-dra" {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			return "", err
		}
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				return strings.TrimSpace(v), nil
			}
		}
	}
	return "", fmt.Errorf("no gpu-device-plugin-dra process on this node")
}

// recordDRA appends a line to the DRA report.
func recordDRA(line string) {
	if env.ReportDir == "" {
		return
	}
	if err := os.MkdirAll(env.ReportDir, 0o755); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(env.ReportDir, "dra.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString(line + "\n")
}

func (s *draScenario) pluginRestart(t *testing.T, ctx context.Context) {
	before, err := checkpointClaims()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, uids := range s.claims {
		want = append(want, uids...)
	}
	slices.Sort(want)
	if !slices.Equal(before, want) {
		t.Fatalf("checkpoint holds %v, want the pods' claims %v", before, want)
	}
	s.killPlugin(t, ctx)
	after, err := checkpointClaims()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after, want) {
		t.Errorf("after the restart the checkpoint holds %v, want %v", after, want)
	}
	// The pods keep running on their devices.
	draPodsRunning(t, ctx)
}

// corruptCheckpoint overwrites the checkpoint with bytes that do not parse
// while no plugin runs (a running one would set the file aside itself at
// its next Prepare or Unprepare, which the kubelet may send at any time):
// the next plugin sets it aside and rebuilds the claims the pods hold from
// PodResources and a GET of each claim, so the next step's Unprepare
// still finds them.
func (s *draScenario) corruptCheckpoint(t *testing.T, ctx context.Context) {
	want, err := checkpointClaims()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(draPluginDir(), "checkpoint.json")
	os.Remove(path + ".corrupt")
	t.Cleanup(func() { os.Remove(path + ".corrupt") })
	ds := s.release.daemonSetName()
	if err := pausePlugin(ctx, ds, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"version": 1, "claims": {"trunc`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pausePlugin(ctx, ds, false); err != nil {
		t.Fatal(err)
	}
	if s.plugin, err = waitPluginRunning(ctx, s.plugin); err != nil {
		t.Fatal(err)
	}
	line, err := waitLog(ctx, s.plugin, "DRA: rebuilt prepared claims from the kubelet and the API server")
	if err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	t.Logf("rebuilt: %s", line)
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Errorf("the corrupt checkpoint was not set aside: %v", err)
	}
	got, err := checkpointClaims()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("rebuilt checkpoint holds %v, want the pods' claims %v", got, want)
	}
	draPodsRunning(t, ctx)
}

// pausePlugin takes the plugin off the node (a nodeSelector no node has)
// and waits until no plugin pod is left, or puts it back.
func pausePlugin(ctx context.Context, daemonSet string, pause bool) error {
	v := "null"
	if pause {
		v = `"true"`
	}
	patch := `{"spec":{"template":{"spec":{"nodeSelector":{"gpu-device-plugin.github.io/e2e-paused":` + v + `}}}}}`
	if _, err := k8s.kube.AppsV1().DaemonSets(releaseNamespace).Patch(ctx, daemonSet, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("pausing the plugin (%v): %w", pause, err)
	}
	if !pause {
		return nil
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := pluginPods(ctx)
		return err == nil && len(pods) == 0, nil
	})
}

// killPlugin deletes the plugin's pod at once (SIGKILL) and waits for the
// DaemonSet's next one to run.
func (s *draScenario) killPlugin(t *testing.T, ctx context.Context) {
	t.Helper()
	zero := int64(0)
	if err := k8s.kube.CoreV1().Pods(releaseNamespace).Delete(ctx, s.plugin, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	next, err := waitPluginRunning(ctx, s.plugin)
	if err != nil {
		t.Fatal(err)
	}
	s.plugin = next
}

// draPodsRunning wants every pod of the lane running.
func draPodsRunning(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, p := range draPods {
		if _, err := waitPod(ctx, p, 30*time.Second, "running", func(p *corev1.Pod) (bool, error) {
			return p.Status.Phase == corev1.PodRunning, nil
		}); err != nil {
			t.Error(err)
		}
	}
}

func (s *draScenario) unprepare(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, draPods...); err != nil {
		t.Fatal(err)
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		left, err = checkpointClaims()
		return err == nil && len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("checkpoint still holds %v after the pods went: %v", left, err)
	}
	// The freed GPUs serve a new pod.
	pod, err := createPod(ctx, probePodFor(draPodExt, corev1.ResourceList{gpuResource: *resource.NewQuantity(int64(len(env.Profile.GPUs)), resource.DecimalSI)}), true)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := podClaims(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if got := ourDevices(claims); len(got) != len(env.Profile.GPUs) {
		t.Errorf("a pod asking for every GPU got %v", got)
	}
	if err := deletePods(ctx, draPodExt); err != nil {
		t.Fatal(err)
	}
}

func (s *draScenario) uninstall(t *testing.T, ctx context.Context) {
	uninstallDRA(t, ctx, s.release, oneGPU, alignedTmpl)
	s.release = nil
}

// uninstallDRA removes the claim templates and the release, and checks the
// kubelet removed the driver's slices and nothing is left on the node but
// the CDI specs, which the documented step removes.
func uninstallDRA(t *testing.T, ctx context.Context, r *release, templates ...string) {
	for _, n := range templates {
		if err := k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	if err := r.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	// The kubelet removes a driver's slices once the driver is gone.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		sl, _, err := nodeSlices(ctx)
		return err == nil && len(sl) == 0, nil
	})
	if err != nil {
		t.Errorf("ResourceSlices of %s still there after uninstalling: %v", draDriver, err)
	}
	if err := removeSpecs(); err != nil {
		t.Fatal(err)
	}
	if left, err := leftovers(); err != nil || len(left) > 0 {
		t.Errorf("left on the node: %v %v", left, err)
	}
}

// claimMetadataPath is where the claim pod's container finds the device
// metadata of its claim's request "gpu" (KEP-5304): the claim comes from a
// template, so the path names the pod's claim ("devices"), not the
// generated ResourceClaim.
func claimMetadataPath() string {
	return metadata.ResourceClaimTemplateFilePath(draDriver, "devices", "gpu")
}

// deviceMetadata: the claim pod's container has the metadata file, read
// at start by the probe, a metadata.resource.k8s.io/v1beta1 object that
// names the pod's claim and its GPU with the attributes the node's
// ResourceSlice publishes for it. No kubelet feature gate is involved:
// the plugin's helper writes the file and a CDI spec mounting it.
func (s *draScenario) deviceMetadata(t *testing.T, ctx context.Context) {
	if s.claimGPU == "" {
		t.Skip("no claim pod")
	}
	rep, err := probeOutput(ctx, draPodClaim)
	if err != nil {
		t.Fatal(err)
	}
	path := claimMetadataPath()
	data := rep.Contents[path]
	if data == "" {
		t.Fatalf("the container has no %s (files: %v)", path, rep.Contents)
	}
	var md metadata.DeviceMetadata
	var invalid error
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(data)), &md, devicemetadata.DecodeMetadataWithValidationResult(&invalid)); err != nil {
		t.Fatalf("decoding %s: %v\n%s", path, err, data)
	}
	if invalid != nil {
		t.Errorf("%s does not validate: %v", path, invalid)
	}
	if md.Name != s.claimName || md.PodClaimName == nil || *md.PodClaimName != "devices" || len(md.Requests) != 1 || md.Requests[0].Name != "gpu" {
		t.Fatalf("metadata names claim %s (pod claim %v), requests %+v; want %s, devices, [gpu]", md.Name, md.PodClaimName, md.Requests, s.claimName)
	}
	devs := md.Requests[0].Devices
	if len(devs) != 1 || devs[0].Name != s.claimGPU || devs[0].Driver != draDriver {
		t.Fatalf("metadata devices %+v, want %s of %s", devs, s.claimGPU, draDriver)
	}
	_, published, err := nodeSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := published[s.claimGPU].Attributes; !apiequality.Semantic.DeepEqual(devs[0].Attributes, want) {
		t.Errorf("%s metadata attributes\n got %v\nwant %v (the ResourceSlice's)", s.claimGPU, devs[0].Attributes, want)
	}
	recordDRA(fmt.Sprintf(`{"step":"deviceMetadata","path":%q,"attributes":%d,"bytes":%d}`, path, len(devs[0].Attributes), len(data)))
}

package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/dramode"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi/kubeapitest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra"
)

// The DRA contract, as the kubelet and the scheduler see it.
const (
	draDriver    = config.DRADriverName // gpu-device-plugin.github.io
	draNode      = "e2e-node"
	draNamespace = "default"
	draContainer = "cuda"
	// draPodClaim is the pod's name for its claim, and its container's.
	draPodClaim = "gpus"
	draRequest  = "gpus"
	// draXIDTaint is the taint an XID puts on a device.
	draXIDTaint = draDriver + "/xid"
	// draCheckpoint is the plugin's prepared-claims file in DRAPluginDir.
	draCheckpoint = "checkpoint.json"
	// pollEvery is how often a poll loop looks again: the kubelet's DRA
	// manager and the fake API server have no change notification that
	// a test can wait on.
	pollEvery = 10 * time.Millisecond
)

// draSetup is a node in DRA mode: the kubelet's DRA manager and plugin
// manager (harness.DRAKubelet) and our whole serve process, daemon.Run,
// on a mock DGX A100, both talking to one fake API server.
type draSetup struct {
	k      *harness.DRAKubelet
	logger klog.Logger
	cfg    config.Config
	lib    *dgxa100.Server
	events chan<- gonvml.EventData
	stop   func() error
}

// shortDir returns an empty directory outside t.TempDir, whose path
// carries the test name and would overflow sun_path with our sockets.
func shortDir(t *testing.T, sockets ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, s := range sockets {
		if p := filepath.Join(dir, s); len(p) >= maxSocketPath {
			t.Fatalf("socket %s is too long for sun_path; shorten TMPDIR", p)
		}
	}
	return dir
}

// startDRANode starts the kubelet side, then the plugin, and waits for
// the plugin to register and publish its eight GPUs.
func startDRANode(t *testing.T) *draSetup {
	t.Helper()
	return startDRANodeWith(t, nil)
}

// startDRANodeWith is startDRANode with the configuration changed by set.
func startDRANodeWith(t *testing.T, set func(*config.Config)) *draSetup {
	t.Helper()
	featuregatetesting.SetFeatureGatesDuringTest(t, utilfeature.DefaultFeatureGate, featuregatetesting.FeatureOverrides{
		features.ResourceHealthStatus:        true,
		features.ResourceHealthStatusMessage: true,
	})
	logger, _ := ktesting.NewTestContext(t)
	s := &draSetup{logger: logger}
	registry := shortDir(t, draDriver+"-reg.sock")
	s.k = harness.StartDRAKubelet(t, logger, registry, draNode)

	driverRoot, _ := cditest.Tree(t, cditest.Manifest(t))
	cfg := config.Default()
	cfg.KubeletAPI = config.KubeletAPIDRA
	cfg.NodeName = draNode
	cfg.DRAPluginDir = shortDir(t, "dra.sock")
	cfg.PluginRegistryDir = registry
	cfg.CDISpecDir = t.TempDir()
	cfg.StateDir = t.TempDir()
	cfg.SysfsRoot = dgxSysfs(t)
	cfg.DriverRoot, cfg.DevRoot = driverRoot, filepath.Join(driverRoot, "dev")
	if set != nil {
		set(&cfg)
	}
	s.cfg = cfg
	s.lib = nvmltest.NewDGXA100()
	s.events = nvmltest.WithEvents(s.lib)
	s.start(t)
	s.waitSlices(t, "8 GPUs", func(devs map[string]resourceapi.Device) bool { return len(devs) == 8 })
	return s
}

// start runs the plugin (again) on the same directories, NVML and API
// server, and waits for the kubelet to accept its next registration.
func (s *draSetup) start(t *testing.T) harness.Registration {
	t.Helper()
	n := 1
	for _, r := range s.k.Registrations() {
		if r.Err == nil {
			n++
		}
	}
	s.stop = startDaemon(t, s.cfg, s.lib, dramode.With(dra.WithAPIConfig(kubeapitest.Serve(t, s.k.Client, nil))))
	return s.k.WaitRegistered(t, draDriver, n)
}

// ctx is a context for calls into the kubelet's code, logging to the test.
func (s *draSetup) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), s.logger), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// uuid is mock GPU i's UUID, as NVML reports it.
func (s *draSetup) uuid(i int) string { return nvmltest.Device(s.lib, i).UUID }

// slices returns the ResourceSlices of our driver on the node.
func (s *draSetup) slices(t *testing.T) []resourceapi.ResourceSlice {
	t.Helper()
	list, err := s.k.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []resourceapi.ResourceSlice
	for _, sl := range list.Items {
		if sl.Spec.Driver == draDriver && ptr.Deref(sl.Spec.NodeName, "") == draNode {
			out = append(out, sl)
		}
	}
	return out
}

// waitSlices polls the API server until the devices in our driver's
// slices, by name, satisfy ok, and returns them.
func (s *draSetup) waitSlices(t *testing.T, what string, ok func(map[string]resourceapi.Device) bool) map[string]resourceapi.Device {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		devs := map[string]resourceapi.Device{}
		for _, sl := range s.slices(t) {
			for _, d := range sl.Spec.Devices {
				devs[d.Name] = d
			}
		}
		if ok(devs) {
			return devs
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("no ResourceSlices with %s within %v; the API server has %d slices of %s with devices %v",
				what, waitTimeout, len(s.slices(t)), draDriver, slices.Sorted(maps.Keys(devs)))
		}
	}
}

// claimFor creates, in the API server, a claim allocated to devices of
// our pool, reserved for a new pod that uses it in its one container,
// and returns the pod. The names make a claim per pod.
func (s *draSetup) claimFor(t *testing.T, name string, devices ...string) *v1.Pod {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: draNamespace, UID: types.UID("pod-uid-" + name)},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: draPodClaim, ResourceClaimName: ptr.To(name + "-gpus")}},
			Containers: []v1.Container{{
				Name:      draContainer,
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: draPodClaim}}},
			}},
		},
	}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, d := range devices {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: draRequest, Driver: draDriver, Pool: draNode, Device: d})
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus", Namespace: draNamespace, UID: types.UID("claim-uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    draRequest,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpu-device-plugin.github.io", Count: int64(len(devices))},
		}}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
		},
	}
	if _, err := s.k.Client.CoreV1().Pods(draNamespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.k.Client.ResourceV1().ResourceClaims(draNamespace).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.k.Run(pod)
	return pod
}

// cdiIDs returns the CDI device IDs the kubelet would hand the runtime
// for the pod's container, sorted.
func (s *draSetup) cdiIDs(t *testing.T, pod *v1.Pod) []string {
	t.Helper()
	info, err := s.k.Manager.GetResources(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatalf("GetResources: %v", err)
	}
	var ids []string
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
	}
	slices.Sort(ids)
	return ids
}

// checkpointed returns the claim UIDs in the plugin's checkpoint file.
func (s *draSetup) checkpointed(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.cfg.DRAPluginDir, draCheckpoint))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var cp struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		t.Fatalf("%s: %v", draCheckpoint, err)
	}
	var uids []string
	for uid := range cp.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// gpuCDIIDs are the CDI device IDs of mock GPUs idx, sorted.
func (s *draSetup) gpuCDIIDs(idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, cdi.GPUKind+"="+s.uuid(i))
	}
	slices.Sort(out)
	return out
}

// TestDRARegistration: the kubelet's plugin manager finds our
// registration socket and its DRA handler accepts the driver, with the
// v1 DRA and health services; the plugin publishes, through the API
// server, one slice for the node's pool with a device per GPU, named
// gpu-<index>, carrying the attributes DeviceClasses and CEL selectors
// use and the memory capacity.
func TestDRARegistration(t *testing.T) {
	start := time.Now()
	s := startDRANode(t)
	t.Logf("kubelet start → plugin registered and 8 devices published: %v", time.Since(start))

	regs := s.k.Registrations()
	if len(regs) != 1 || regs[0].Err != nil {
		t.Fatalf("registrations = %+v, want one accepted", regs)
	}
	r := regs[0]
	if r.Driver != draDriver {
		t.Errorf("registered driver %q, want %q", r.Driver, draDriver)
	}
	if want := filepath.Join(s.cfg.DRAPluginDir, "dra.sock"); r.Endpoint != want {
		t.Errorf("endpoint = %s, want %s", r.Endpoint, want)
	}
	for _, svc := range []string{drapbv1.DRAPluginService, drahealthv1.DRAResourceHealthService} {
		if !slices.Contains(r.Services, svc) {
			t.Errorf("advertised services %v lack %s", r.Services, svc)
		}
	}

	sl := s.slices(t)
	if len(sl) != 1 {
		t.Fatalf("%d ResourceSlices for the node, want 1", len(sl))
	}
	spec := sl[0].Spec
	if spec.Pool.Name != draNode || spec.Pool.ResourceSliceCount != 1 {
		t.Errorf("pool = %+v, want %s with 1 slice", spec.Pool, draNode)
	}
	if owners := sl[0].OwnerReferences; len(owners) != 1 || owners[0].Kind != "Node" || owners[0].Name != draNode || owners[0].UID != s.k.Node.UID {
		t.Errorf("owner references = %+v, want the Node %s (%s)", owners, draNode, s.k.Node.UID)
	}
	if len(spec.Devices) != 8 {
		t.Fatalf("%d devices, want 8", len(spec.Devices))
	}
	str := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		return ptr.Deref(d.Attributes[name].StringValue, "<none>")
	}
	for i := range 8 {
		mock := nvmltest.Device(s.lib, i)
		d := spec.Devices[i]
		if want := "gpu-" + strconv.Itoa(i); d.Name != want {
			t.Errorf("device %d is %q, want %q (index order)", i, d.Name, want)
			continue
		}
		if got := str(d, "uuid"); got != mock.UUID {
			t.Errorf("%s uuid = %s, want %s", d.Name, got, mock.UUID)
		}
		if got := d.Attributes["index"].IntValue; got == nil || *got != int64(mock.Index) {
			t.Errorf("%s index = %v, want %d", d.Name, got, mock.Index)
		}
		if got := str(d, "productName"); got != mock.Name {
			t.Errorf("%s productName = %s, want %s", d.Name, got, mock.Name)
		}
		if got := ptr.Deref(d.Attributes["driverVersion"].VersionValue, "<none>"); got != s.lib.DriverVersion {
			t.Errorf("%s driverVersion = %s, want version %s", d.Name, got, s.lib.DriverVersion)
		}
		if got := str(d, "resource.kubernetes.io/pciBusID"); got != nvmltest.GPUAddress(i) {
			t.Errorf("%s resource.kubernetes.io/pciBusID = %s, want %s", d.Name, got, nvmltest.GPUAddress(i))
		}
		want := resource.NewQuantity(int64(mock.MemoryInfo.Total), resource.BinarySI)
		if got, ok := d.Capacity["memory"]; !ok || got.Value.Cmp(*want) != 0 {
			t.Errorf("%s memory capacity = %v, want %v", d.Name, got.Value.String(), want)
		}
		if len(d.Taints) > 0 {
			t.Errorf("%s is tainted %v on a healthy node", d.Name, d.Taints)
		}
	}
}

// TestDRAPrepareUnprepare drives a claim for gpu-0 and gpu-1 through the
// kubelet's DRA manager: PrepareResources fetches the claim from the API
// server and calls NodePrepareResources over the plugin's socket; the
// CDI device IDs it records for the container are the GPUs' names in
// our spec, which resolve from the spec directory. A second claim for
// gpu-1 is refused while the first holds it. UnprepareResources releases
// it: the checkpoint no longer holds the claim and gpu-1 can be prepared
// for another pod.
func TestDRAPrepareUnprepare(t *testing.T) {
	s := startDRANode(t)
	ctx := s.ctx(t)
	pod := s.claimFor(t, "train", "gpu-0", "gpu-1")

	start := time.Now()
	if err := s.k.Manager.PrepareResources(ctx, pod); err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	t.Logf("PrepareResources (2 GPUs): %v", time.Since(start))
	ids := s.cdiIDs(t, pod)
	// With the device metadata file (draDeviceMetadata, on by default):
	// the helper's CDI device that mounts it, one per request.
	if want := append(s.gpuCDIIDs(0, 1), draMetadataCDIID("claim-uid-train", draRequest)); !slices.Equal(ids, want) {
		t.Fatalf("CDI devices for %s = %v, want %v", draContainer, ids, want)
	}
	for _, id := range ids[:2] {
		if !strings.HasPrefix(id, draDriver+"/gpu=") {
			t.Errorf("CDI device %s is not of kind %s/gpu", id, draDriver)
		}
	}
	infos, err := s.k.Manager.GetContainerClaimInfos(pod, &pod.Spec.Containers[0])
	if err != nil || len(infos) != 1 {
		t.Fatalf("GetContainerClaimInfos = %v, %v; want one claim", infos, err)
	}
	var devs []string
	for _, d := range infos[0].DriverState[draDriver].Devices {
		devs = append(devs, d.PoolName+"/"+d.DeviceName)
		if !slices.Equal(d.RequestNames, []string{draRequest}) {
			t.Errorf("%s requests = %v, want [%s]", d.DeviceName, d.RequestNames, draRequest)
		}
	}
	slices.Sort(devs)
	if want := []string{draNode + "/gpu-0", draNode + "/gpu-1"}; !slices.Equal(devs, want) {
		t.Errorf("prepared devices = %v, want %v", devs, want)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(s.cfg.CDISpecDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if unresolved, err := cache.InjectDevices(&oci.Spec{}, ids...); err != nil {
		t.Errorf("the runtime could not resolve %v: %v (spec dir has %v)", unresolved, err, cache.ListDevices())
	}
	if got, want := s.checkpointed(t), []string{"claim-uid-train"}; !slices.Equal(got, want) {
		t.Errorf("checkpoint holds %v after prepare, want %v", got, want)
	}

	other := s.claimFor(t, "other", "gpu-1")
	if err := s.k.Manager.PrepareResources(ctx, other); err == nil || !strings.Contains(err.Error(), "gpu-1") || !strings.Contains(err.Error(), "train-gpus") {
		t.Errorf("preparing gpu-1 for a second claim while the first holds it: err = %v, want a refusal naming gpu-1 and its claim", err)
	}

	s.k.Remove(pod)
	start = time.Now()
	if err := s.k.Manager.UnprepareResources(ctx, pod); err != nil {
		t.Fatalf("UnprepareResources: %v", err)
	}
	t.Logf("UnprepareResources: %v", time.Since(start))
	if s.k.Manager.PodMightNeedToUnprepareResources(pod.UID) {
		t.Error("the kubelet still counts the pod's claim as prepared")
	}
	if got := s.checkpointed(t); slices.Contains(got, "claim-uid-train") {
		t.Errorf("checkpoint still holds the unprepared claim: %v", got)
	}
	if err := s.k.Manager.PrepareResources(ctx, other); err != nil {
		t.Fatalf("preparing gpu-1 after its claim was unprepared: %v", err)
	}
	if ids, want := s.cdiIDs(t, other), append(s.gpuCDIIDs(1), draMetadataCDIID("claim-uid-other", draRequest)); !slices.Equal(ids, want) {
		t.Errorf("CDI devices for the second pod = %v, want %v", ids, want)
	}
}

// TestDRAUnprepareAfterPluginRestart: the plugin restarts between a
// claim's prepare and its unprepare. The kubelet's plugin manager sees
// the registration socket go and come back on the same endpoint; the
// restarted plugin still holds the claim from its checkpoint (gpu-0 is
// refused to another claim) and unprepares the claim the earlier process
// prepared, after which gpu-0 can be prepared for the other claim.
func TestDRAUnprepareAfterPluginRestart(t *testing.T) {
	s := startDRANode(t)
	ctx := s.ctx(t)
	pod := s.claimFor(t, "train", "gpu-0", "gpu-1")
	if err := s.k.Manager.PrepareResources(ctx, pod); err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}

	if err := s.stop(); err != nil {
		t.Fatalf("daemon.Run: %v", err)
	}
	start := time.Now()
	r := s.start(t)
	t.Logf("plugin restart → kubelet accepted the new registration: %v", time.Since(start))
	regs := s.k.Registrations()
	if !regs[0].Deregistered {
		t.Errorf("the kubelet never deregistered the stopped plugin: %+v", regs)
	}
	if r.Endpoint != regs[0].Endpoint {
		t.Errorf("restarted plugin registered %s, the first %s", r.Endpoint, regs[0].Endpoint)
	}
	for _, r := range regs {
		if r.Err != nil {
			t.Errorf("the kubelet refused a registration: %v", r.Err)
		}
	}
	if got, want := s.checkpointed(t), []string{"claim-uid-train"}; !slices.Equal(got, want) {
		t.Fatalf("checkpoint after restart holds %v, want %v", got, want)
	}

	// The restarted plugin knows gpu-0 is taken.
	other := s.claimFor(t, "other", "gpu-0")
	if err := s.k.Manager.PrepareResources(ctx, other); err == nil || !strings.Contains(err.Error(), "gpu-0") || !strings.Contains(err.Error(), "train-gpus") {
		t.Errorf("preparing gpu-0 for a second claim after the restart: err = %v, want a refusal naming gpu-0 and its claim", err)
	}

	s.k.Remove(pod)
	if err := s.k.Manager.UnprepareResources(ctx, pod); err != nil {
		t.Fatalf("UnprepareResources after the plugin restart: %v", err)
	}
	if got := s.checkpointed(t); slices.Contains(got, "claim-uid-train") {
		t.Errorf("checkpoint still holds the claim unprepared after the restart: %v", got)
	}
	if err := s.k.Manager.PrepareResources(ctx, other); err != nil {
		t.Errorf("preparing gpu-0 once its claim was unprepared: %v", err)
	}
}

// TestDRAHealth: an XID 79 on a prepared GPU reaches the kubelet through
// the health stream its DRA manager opens at registration (feature gate
// ResourceHealthStatus): the manager signals the pod on its Updates
// channel, and the pod's allocatedResourcesStatus, as the kubelet builds
// it, shows that GPU Unhealthy with the reason spelled out and the other
// GPU of the claim Healthy. The GPU's device in the ResourceSlice gets a
// NoSchedule taint gpu-device-plugin.github.io/xid=79.
func TestDRAHealth(t *testing.T) {
	s := startDRANode(t)
	ctx := s.ctx(t)
	pod := s.claimFor(t, "train", "gpu-0", "gpu-1")
	if err := s.k.Manager.PrepareResources(ctx, pod); err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	sick, well := s.gpuCDIIDs(1)[0], s.gpuCDIIDs(0)[0]
	resourceName := v1.ResourceName("claim:" + draPodClaim)

	// health is the claim's devices' health, by CDI ID, as the kubelet
	// writes it into the pod's status.
	health := func() map[string]v1.ResourceHealth {
		status := v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: draContainer}}}
		s.k.Manager.UpdateAllocatedResourcesStatus(s.logger, pod, &status)
		out := map[string]v1.ResourceHealth{}
		for _, rs := range status.ContainerStatuses[0].AllocatedResourcesStatus {
			if rs.Name != resourceName {
				t.Errorf("allocatedResourcesStatus names %s, want %s", rs.Name, resourceName)
			}
			for _, h := range rs.Resources {
				out[string(h.ResourceID)] = h
			}
		}
		return out
	}
	healthyNow := func(h map[string]v1.ResourceHealth) bool {
		return len(h) == 2 && h[sick].Health == v1.ResourceHealthStatusHealthy && h[well].Health == v1.ResourceHealthStatusHealthy
	}

	// The stream is up once the kubelet knows both GPUs healthy (before
	// the first report they are Unknown).
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for h := health(); !healthyNow(h); h = health() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("the kubelet never had both GPUs Healthy from the plugin's health stream: %+v", h)
		}
	}
	deadline.Reset(waitTimeout)
	// Forget the notifications so far: the next one must be the XID's.
	for drained := false; !drained; {
		select {
		case <-s.k.Manager.Updates():
		default:
			drained = true
		}
	}

	start := time.Now()
	s.events <- gonvml.EventData{Device: s.lib.Devices[1], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	var got map[string]v1.ResourceHealth
	for {
		select {
		case u := <-s.k.Manager.Updates():
			if !slices.Contains(u.PodUIDs, string(pod.UID)) {
				t.Fatalf("health update for pods %v, not the pod using the GPU (%s)", u.PodUIDs, pod.UID)
			}
		case <-deadline.C:
			t.Fatalf("no health update for the pod within %v of XID 79; its status: %+v", waitTimeout, health())
		}
		if got = health(); got[sick].Health == v1.ResourceHealthStatusUnhealthy {
			break
		}
	}
	t.Logf("XID 79 → pod status Unhealthy in the kubelet: %v", time.Since(start))
	if msg := ptr.Deref(got[sick].Message, ""); msg != "xid=79: fallen off the bus" {
		t.Errorf("%s message = %q, want %q", sick, msg, "xid=79: fallen off the bus")
	}
	if h := got[well]; h.Health != v1.ResourceHealthStatusHealthy || h.Message != nil {
		t.Errorf("%s (no fault) = %s %v, want Healthy without a message", well, h.Health, ptr.Deref(h.Message, ""))
	}

	devs := s.waitSlices(t, "gpu-1 tainted", func(d map[string]resourceapi.Device) bool { return len(d["gpu-1"].Taints) > 0 })
	t.Logf("XID 79 → taint in the API server: %v", time.Since(start))
	want := resourceapi.DeviceTaint{Key: draXIDTaint, Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	if ts := devs["gpu-1"].Taints; len(ts) != 1 || ts[0].Key != want.Key || ts[0].Value != want.Value || ts[0].Effect != want.Effect || ts[0].TimeAdded == nil {
		t.Errorf("gpu-1 taints = %+v, want one %s=%s:%s with its time", ts, want.Key, want.Value, want.Effect)
	}
	for name, d := range devs {
		if name != "gpu-1" && len(d.Taints) > 0 {
			t.Errorf("%s is tainted %+v; only gpu-1 had a fault", name, d.Taints)
		}
	}
}

// TestDRATaintKeepsItsTimeAcrossRestart: a GPU kept Unhealthy across a
// plugin restart (its fatal XID restored from the state file) keeps the
// timeAdded its taint was published with: the restarted plugin reads its
// node's slices once (internal/serve/dra pins that LIST's field selector)
// and neither rewrites the slice nor shows operators the restart's time.
func TestDRATaintKeepsItsTimeAcrossRestart(t *testing.T) {
	s := startDRANode(t)
	s.events <- gonvml.EventData{Device: s.lib.Devices[1], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	s.waitSlices(t, "gpu-1 tainted", func(d map[string]resourceapi.Device) bool { return len(d["gpu-1"].Taints) > 0 })
	if err := s.stop(); err != nil {
		t.Fatalf("daemon.Run: %v", err)
	}
	// What an earlier process published, an hour back: a restart within
	// the same second as the XID could not tell a kept time from a new one.
	was := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	for _, sl := range s.slices(t) {
		for i, d := range sl.Spec.Devices {
			if d.Name == "gpu-1" {
				sl.Spec.Devices[i].Taints[0].TimeAdded = &was
				if _, err := s.k.Client.ResourceV1().ResourceSlices().Update(context.Background(), &sl, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	s.start(t)
	// Another XID after the restart: once its taint is in the API server,
	// the restarted plugin's first publication is too.
	s.events <- gonvml.EventData{Device: s.lib.Devices[2], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	devs := s.waitSlices(t, "gpu-2 tainted", func(d map[string]resourceapi.Device) bool { return len(d["gpu-2"].Taints) > 0 })
	if ts := devs["gpu-1"].Taints; len(ts) != 1 || ts[0].Key != draXIDTaint || ts[0].TimeAdded == nil || !ts[0].TimeAdded.Equal(&was) {
		t.Errorf("gpu-1 taints after the restart = %+v, want %s=79 added %v, as published before", ts, draXIDTaint, was)
	}
	if ts := devs["gpu-2"].Taints; len(ts) != 1 || ts[0].TimeAdded == nil || !ts[0].TimeAdded.After(was.Time) {
		t.Errorf("gpu-2 taints (an XID after the restart) = %+v, want one added now", ts)
	}
}

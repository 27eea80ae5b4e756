package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

// The DRA memory-share lane: one GPU published with consumable memory
// (sharing.memoryShares); two pods' claims each take a quarter of its
// memory, share it through the MPS daemon the plugin starts for their
// claims, and get that memory as their MPS limit.
const (
	memShareTmpl  = "gpu-quarter"
	timeSliceTmpl = "gpu-long-slices"
	podShare1     = "dra-share-1"
	podShare2     = "dra-share-2"
	podTimeSlice  = "dra-time-slice"
)

var (
	sharePods    = []string{podShare1, podShare2}
	memSharePods = append(sharePods[:len(sharePods):len(sharePods)], podTimeSlice)
)

// TestDRAMemoryShares: the GPU is published as shareable; two claims for
// a quarter of its memory land on it together; each pod gets the daemon's
// pipe directory and shared memory and a quarter of the threads and
// memory as its limits; the daemon runs while claims hold it and stops
// with the last one, taking its CDI spec device along. A claim asking for
// the Long time-slice interval has it set on its GPU through the driver
// root's nvidia-smi (the stand-in), and Default again when it goes.
func TestDRAMemoryShares(t *testing.T) {
	s := &memShareScenario{}
	steps := []step{
		{"install in DRA mode with one GPU shared by memory", s.install},
		{"the GPU is published with allowMultipleAllocations and a memory request policy", s.slice},
		{"two claims for a quarter of its memory share it through MPS", s.pods},
		{"a plugin pod restart leaves the daemon (in the MPS launcher's pod) and the claims' pods running", s.pluginRestart},
		{"XID 79 on the shared GPU reaches both claims' pods; a reset clears it", s.xid},
		{"the last claim gone, the daemon stops and its spec devices go", s.release_},
		{"a claim's time-slice interval is set on its GPU, and put back when it goes", s.timeSlice},
		{"uninstall leaves the node clean", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, memSharePods...)
	runSteps(t, t.Context(), steps)
}

type memShareScenario struct {
	release *release
	shared  mocknvml.GPU
	root    string
}

func (s *memShareScenario) device() string { return fmt.Sprintf("gpu-%d", s.shared.Index) }

// quarterMiB is the share each claim asks for.
func (s *memShareScenario) quarterMiB() uint64 { return s.shared.MemoryMiB / 4 }

func (s *memShareScenario) install(t *testing.T, ctx context.Context) {
	s.shared = env.Profile.GPUs[0]
	s.root = filepath.Join(env.Fixture, "mps")
	v, err := draValues()
	if err != nil {
		t.Fatal(err)
	}
	healthRulesOnly(v)
	v["mpsRoot"] = s.root
	v["config"].(map[string]any)["sharing"] = map[string]any{"memoryShares": map[string]any{
		"enabled": true, "devices": []any{s.shared.UUID}, "minimum": "256Mi",
	}}
	s.release = installDRA(t, ctx, v, memSharePods...)
	if _, err := waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *memShareScenario) slice(t *testing.T, ctx context.Context) {
	devs, err := waitSlices(ctx, "publishing "+s.device(), func(d map[string]resourceapi.Device) bool { _, ok := d[s.device()]; return ok })
	if err != nil {
		t.Fatal(err)
	}
	d := devs[s.device()]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Fatalf("%s: allowMultipleAllocations %v, want true (is DRAConsumableCapacity on?)", s.device(), d.AllowMultipleAllocations)
	}
	c := d.Capacity["memory"]
	want := fmt.Sprintf("%dMi", s.shared.MemoryMiB)
	if p := c.RequestPolicy; p == nil || p.Default == nil || p.Default.Cmp(c.Value) != 0 || p.ValidRange == nil || p.ValidRange.Min.String() != "256Mi" {
		t.Errorf("%s memory %s: request policy %+v, want default the whole %s and min 256Mi", s.device(), c.Value.String(), p, want)
	}
	for name, other := range devs {
		if name != s.device() && strings.HasPrefix(name, "gpu-") && other.AllowMultipleAllocations != nil {
			t.Errorf("%s is shared too; only %s was selected", name, s.device())
		}
	}
}

func (s *memShareScenario) pods(t *testing.T, ctx context.Context) {
	quarter := resource.MustParse(fmt.Sprintf("%dMi", s.quarterMiB()))
	if err := createTemplate(ctx, memShareTmpl, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: gpuClass,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].uuid == %q`, draDriver, s.shared.UUID),
			}}},
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": quarter}},
		},
	}}}); err != nil {
		t.Fatal(err)
	}
	shares := map[string]bool{}
	start := time.Now()
	for _, name := range sharePods {
		p := probePodFor(name, nil)
		p.Spec.Containers[0].Args = []string{"-look-for=" + sharing.MPSContainerPipeDir + "/control"}
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "devices"}}}
		tmpl := memShareTmpl
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimTemplateName: &tmpl}}
		pod, err := createPod(ctx, p, true)
		if err != nil {
			t.Fatalf("%v%s", err, pluginLogs(ctx))
		}
		claims, err := podClaims(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) != 1 || claims[0].Status.Allocation == nil || len(claims[0].Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("pod %s: claims %+v", name, claims)
		}
		r := claims[0].Status.Allocation.Devices.Results[0]
		consumed := r.ConsumedCapacity["memory"]
		if r.Device != s.device() || r.ShareID == nil || consumed.Cmp(quarter) != 0 {
			t.Fatalf("pod %s: allocated %s share %v consuming %v; want a share of %s consuming %s", name, r.Device, r.ShareID, r.ConsumedCapacity, s.device(), quarter.String())
		}
		// Each share's claim has its own status entry, keyed by its shareID.
		_, devs, err := nodeSlices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkClaimStatus(claims, devs); err != nil {
			t.Fatalf("pod %s: %v%s", name, err, pluginLogs(ctx))
		}
		shares[string(*r.ShareID)] = true
		rep, err := probeOutput(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"CUDA_MPS_PIPE_DIRECTORY":           sharing.MPSContainerPipeDir,
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  fmt.Sprintf("0=%dM", s.quarterMiB()),
		}
		for k, v := range want {
			if rep.Env[k] != v {
				t.Errorf("pod %s: %s=%q, want %q", name, k, rep.Env[k], v)
			}
		}
		if !rep.Files[sharing.MPSContainerPipeDir+"/control"] {
			t.Errorf("pod %s has no %s/control: the daemon's pipe directory is not mounted", name, sharing.MPSContainerPipeDir)
		}
		checkGPUNodes(t, rep, s.shared.Minor)
		t.Logf("pod %s: share %s of %s, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s", name, *r.ShareID, r.Device, rep.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], rep.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	if len(shares) != 2 {
		t.Errorf("share IDs %v, want two", shares)
	}
	recordDRA(fmt.Sprintf("two pods sharing %s by memory running %s after the first was created", s.device(), time.Since(start).Round(time.Millisecond)))
	// Shared by memory: the daemon's defaults are the largest share on
	// the GPU (here both are a quarter), which holds for a client that
	// clears its environment.
	log, err := os.ReadFile(filepath.Join(sharing.MPSDir(s.root, s.shared.UUID, sharing.MPSLog), "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"set_default_active_thread_percentage 25\n", fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM\n", s.quarterMiB())} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the daemon was not held to the largest share (%q); it was told:\n%s", strings.TrimSpace(want), log)
		}
	}
	if strings.Contains(string(log), "set_default_active_thread_percentage 100\n") {
		t.Errorf("the daemon was given the whole GPU; it was told:\n%s", log)
	}
}

func (s *memShareScenario) pluginRestart(t *testing.T, ctx context.Context) {
	restartPluginKeepingMPS(t, ctx, sharing.MPSDir(s.root, s.shared.UUID, sharing.MPSPipe), sharePods...)
}

func (s *memShareScenario) xid(t *testing.T, ctx context.Context) {
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	cdiID := "gpu-device-plugin.github.io/gpu=" + s.shared.UUID
	health := func(want corev1.ResourceHealthStatus) error {
		for _, name := range sharePods {
			if _, err := waitPod(ctx, name, time.Minute, fmt.Sprintf("reporting %s %s", cdiID, want), func(p *corev1.Pod) (bool, error) {
				h, ok := claimHealth(p)[cdiID]
				return ok && h.Health == want, nil
			}); err != nil {
				return err
			}
		}
		return nil
	}
	injected := time.Now()
	if err := ctl.InjectContext(ctx, fmt.Sprintf("xid %d 79", s.shared.Index)); err != nil {
		t.Fatal(err)
	}
	if err := health("Unhealthy"); err != nil {
		t.Fatal(err)
	}
	t.Logf("XID 79 on the shared %s: both claims' pods Unhealthy %s after", s.device(), time.Since(injected).Round(time.Millisecond))
	for _, cmd := range []string{fmt.Sprintf("recovery %d reset", s.shared.Index), fmt.Sprintf("recovery %d none", s.shared.Index)} {
		if err := ctl.InjectContext(ctx, cmd); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(cmd, "reset") {
			if _, err := waitSlices(ctx, "showing the reset", func(d map[string]resourceapi.Device) bool {
				return slices.ContainsFunc(d[s.device()].Taints, func(tt resourceapi.DeviceTaint) bool { return tt.Key == draDriver+"/recovery-action" })
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := health("Healthy"); err != nil {
		t.Fatalf("after the reset: %v%s", err, pluginLogs(ctx))
	}
}

func (s *memShareScenario) release_(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, sharePods...); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(env.CDIDir, "gpu-device-plugin_gpu-device-plugin.github.io-mps.json")
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, derr := os.Stat(filepath.Join(s.root, s.shared.UUID))
		_, serr := os.Stat(spec)
		return os.IsNotExist(derr) && os.IsNotExist(serr), nil
	})
	if err != nil {
		t.Fatalf("the daemon's directory or %s still there after the last claim went: %v%s", spec, err, pluginLogs(ctx))
	}
}

func (s *memShareScenario) timeSlice(t *testing.T, ctx context.Context) {
	other := env.Profile.GPUs[1]
	params := `{"apiVersion":"gpu-device-plugin.github.io/v1alpha1","kind":"GPUConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: timeSliceTmpl, Namespace: testNamespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: gpuClass,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes[%q].uuid == %q`, draDriver, other.UUID),
				}}},
			}}},
			Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: draDriver, Parameters: runtime.RawExtension{Raw: []byte(params)}},
			}}},
		}}},
	}
	if err := k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Delete(ctx, timeSliceTmpl, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The stand-in nvidia-smi says what it set, and the plugin logs it.
	said := func(level int) string {
		return fmt.Sprintf("Set compute time slice to %d for GPU %s (mock).", level, other.UUID)
	}
	if _, err := createPod(ctx, claimProbePod(podTimeSlice, timeSliceTmpl), true); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if logs := pluginLogs(ctx); !strings.Contains(logs, said(3)) {
		t.Errorf("the plugin's log has no %q%s", said(3), logs)
	}
	if err := deletePods(ctx, podTimeSlice); err != nil {
		t.Fatal(err)
	}
	var logs string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		logs = pluginLogs(ctx)
		return strings.Contains(logs, said(0)), nil
	})
	if err != nil {
		t.Errorf("after the claim went, no %q in the plugin's log: %v%s", said(0), err, logs)
	}
}

func (s *memShareScenario) uninstall(t *testing.T, ctx context.Context) {
	uninstallDRA(t, ctx, s.release, memShareTmpl, timeSliceTmpl)
	s.release = nil
	if err := os.RemoveAll(s.root); err != nil {
		t.Error(err)
	}
}

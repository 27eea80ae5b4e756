package suite

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// Pod names. Each step leaves the cluster as the next one expects, so the
// steps run in order and the first failure stops the rest.
const (
	podA     = "two-gpus"              // holds two GPUs through every fault and restart
	podNinth = "ninth-gpu"             // asks for one GPU more than the node has left
	podB     = "after-kubelet-restart" // two more GPUs from the restarted kubelet
	podC     = "after-plugin-restart"  // two more from the restarted plugin
	podCDI   = "cdi"                   // the last two, through CDI
	podNIC   = "rdma-nic"              // one RDMA NIC from the NUMA 0 pool
)

// allPods are every pod the suite makes.
var allPods = []string{podA, podNinth, podB, podC, podCDI, podNIC}

// TestGPUNode runs the plugin's life on a real node, in order.
func TestGPUNode(t *testing.T) {
	ctx := t.Context()
	s := &scenario{}
	steps := []step{
		{"install", s.install},
		{"node advertises every GPU", s.nodeAdvertises},
		{"readiness probe passes once registered", s.ready},
		{"NIC pools", s.nicPools},
		{"pod gets two GPUs", s.podGetsTwoGPUs},
		{"ninth GPU stays pending", s.ninthGPUPending},
		{"XID and thermal faults reach the pod status", s.faultsReachPodStatus},
		{"operators see the holder and the reason: events, node condition, list, metrics", s.operatorView},
		{"kubelet restart keeps devices and re-registers", s.kubeletRestart},
		{"plugin restart keeps devices and re-registers", s.pluginRestart},
		{"pod gets two GPUs through CDI", s.podThroughCDI},
		{"GPU container restarts while the plugin is down", s.restartWithoutPlugin},
		{"uninstall leaves only the CDI specs, which the documented step removes", s.uninstall},
	}
	// The node's /proc says which boot this is, as a real node's does, so
	// the plugin keeps the fatal XID across its restart (internal/state).
	bootID, err := fixtureBootID()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(bootID); os.Remove(healthStateFile()) })
	cleanUpOnFailure(t, func() *release { return s.release }, false, allPods...)
	runSteps(t, ctx, steps)
}

// step is one step of a lane; each leaves the node as the next expects.
type step struct {
	name string
	run  func(*testing.T, context.Context)
}

// runSteps runs steps in order, timing each; the first failure stops the
// rest.
// cleanUpOnFailure leaves the node clean for the next lane when t fails,
// whatever failed: it logs the plugin's output, deletes pods, uninstalls
// the release rel returns (nil before install) and, with specs, removes
// the CDI specs the plugin left.
func cleanUpOnFailure(t *testing.T, rel func() *release, specs bool, pods ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		t.Logf("plugin logs at failure:%s", pluginLogs(ctx))
		deletePods(ctx, pods...)
		if r := rel(); r != nil {
			r.uninstall(ctx)
		}
		if specs {
			removeSpecs()
		}
	})
}

func runSteps(t *testing.T, ctx context.Context, steps []step) {
	t.Helper()
	for _, st := range steps {
		start := time.Now()
		ok := t.Run(st.name, func(t *testing.T) { st.run(t, ctx) })
		t.Logf("%s: %s", st.name, time.Since(start).Round(time.Millisecond))
		if !ok {
			t.Fatalf("stopping at %q", st.name)
		}
	}
}

// scenario is what the steps hand on to each other.
type scenario struct {
	release *release
	// gpusA are pod A's device IDs (UUIDs), sorted.
	gpusA []string
	// held are the GPUs every running pod holds, by pod.
	held map[string][]string
	// containerA is pod A's container ID, which must survive restarts.
	containerA string
	plugin     string
}

func (s *scenario) install(t *testing.T, ctx context.Context) {
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	// A pod from an earlier, interrupted run would hold GPUs.
	if err := deletePods(ctx, allPods...); err != nil {
		t.Fatal(err)
	}
	// With Helm itself, from the packaged chart, as an operator installs.
	values, err := chartValues("envvar")
	if err != nil {
		t.Fatal(err)
	}
	operatorValues(values)
	healthRulesOnly(values)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r, err := helmInstall(ctx, filepath.Join(root, "deploy", "helm", "gpu-device-plugin"), values)
	if err != nil {
		t.Fatal(err)
	}
	s.release = r
	t.Logf("installed %s", r)
	if s.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *scenario) ready(t *testing.T, ctx context.Context) {
	if err := waitPluginReady(ctx, s.plugin); err != nil {
		t.Fatal(err)
	}
	// serve handed over to the image's gpu-device-plugin-dp, whose memory
	// figures docs/architecture.md gives.
	if got := pluginLogLines(ctx, s.plugin, "serving through the device-plugin API"); len(got) != 1 || got[0]["executable"] != "gpu-device-plugin-dp" {
		t.Errorf("the plugin pod's log has %v, want one line from gpu-device-plugin-dp serving%s", got, pluginLogs(ctx))
	}
}

func (s *scenario) nodeAdvertises(t *testing.T, ctx context.Context) {
	want := int64(len(env.Profile.GPUs))
	if err := waitAllocatable(ctx, want, 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	c, a, _ := nodeGPUs(ctx)
	if c != want {
		t.Errorf("capacity nvidia.com/gpu = %d, want %d", c, want)
	}
	t.Logf("node %s: nvidia.com/gpu capacity %d, allocatable %d", env.Node, c, a)
}

func (s *scenario) podGetsTwoGPUs(t *testing.T, ctx context.Context) {
	pod, err := createPod(ctx, probePod(podA, 2), true)
	if err != nil {
		t.Fatal(err)
	}
	s.containerA = pod.Status.ContainerStatuses[0].ContainerID
	rep, err := probeOutput(ctx, podA)
	if err != nil {
		t.Fatal(err)
	}
	visible := strings.Split(rep.Env["NVIDIA_VISIBLE_DEVICES"], ",")
	slices.Sort(visible)
	if len(visible) != 2 {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q, want two GPUs", rep.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	checkGPUDevices(t, rep, visible)
	// The kubelet's view must agree with the container's.
	got := sortedKeys(allocatedGPUs(pod))
	if !slices.Equal(got, visible) {
		t.Errorf("allocatedResourcesStatus lists %v, the container sees %v", got, visible)
	}
	s.gpusA = visible
	s.held = map[string][]string{podA: visible}
	if rep.Files[libraryInContainer] {
		t.Errorf("%s is in the container without CDI: the probe's check means nothing", libraryInContainer)
	}
	t.Logf("pod %s: NVIDIA_VISIBLE_DEVICES=%s devices=%v", podA, rep.Env["NVIDIA_VISIBLE_DEVICES"], rep.devicePaths())
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), 10*time.Second); err != nil {
		t.Error(err) // allocatable counts healthy devices, used or not
	}
}

func (s *scenario) ninthGPUPending(t *testing.T, ctx context.Context) {
	left := int64(len(env.Profile.GPUs) - len(s.gpusA))
	if _, err := createPod(ctx, probePod(podNinth, left+1), false); err != nil {
		t.Fatal(err)
	}
	pod, err := waitPod(ctx, podNinth, time.Minute, "unschedulable", func(p *corev1.Pod) (bool, error) {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var msg string
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			msg = c.Message
		}
	}
	if !strings.Contains(msg, "Insufficient nvidia.com/gpu") {
		t.Errorf("unschedulable for another reason: %s", msg)
	}
	// It stays pending, not merely late: nothing signals "still not
	// scheduled", so look again after a few scheduling retries' time.
	time.Sleep(3 * time.Second)
	if p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podNinth, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("pod asking for %d GPUs with %d free: phase %s on %q (%v)", left+1, left, p.Status.Phase, p.Spec.NodeName, err)
	}
	t.Logf("pod %s (%d GPUs, %d free): Pending: %s", podNinth, left+1, left, msg)
	if err := deletePods(ctx, podNinth); err != nil {
		t.Fatal(err)
	}
}

func (s *scenario) faultsReachPodStatus(t *testing.T, ctx context.Context) {
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	index := env.uuidIndex()
	xidGPU, hotGPU := s.gpusA[0], s.gpusA[1]
	total := int64(len(env.Profile.GPUs))
	const report = "allocated-resources-status.jsonl"
	if env.ReportDir != "" {
		os.Remove(filepath.Join(env.ReportDir, report))
	}

	var injected time.Time
	expect := func(step string, want map[string]corev1.ResourceHealthStatus, allocatable int64) {
		t.Helper()
		pod, err := waitPod(ctx, podA, time.Minute, fmt.Sprintf("showing %v", want), func(p *corev1.Pod) (bool, error) {
			return maps.Equal(allocatedGPUs(p), want), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := statusRecord{Step: step}
		if !injected.IsZero() {
			rec.PodStatusAfter = time.Since(injected).Round(time.Millisecond).String()
		}
		if err := waitAllocatable(ctx, allocatable, time.Minute); err != nil {
			t.Fatal(err)
		}
		if !injected.IsZero() {
			rec.AllocatableAfter = time.Since(injected).Round(time.Millisecond).String()
		}
		t.Logf("%s: pod %s:\n%s", step, podA, record(ctx, report, rec, pod))
	}
	inject := func(cmd string) {
		t.Helper()
		injected = time.Now()
		if err := ctl.InjectContext(ctx, cmd); err != nil {
			t.Fatalf("injecting %q: %v", cmd, err)
		}
		t.Logf("injected %q (applied in %s)", cmd, time.Since(injected).Round(time.Millisecond))
	}

	expect("before any fault", map[string]corev1.ResourceHealthStatus{xidGPU: "Healthy", hotGPU: "Healthy"}, total)
	inject(fmt.Sprintf("xid %d 79", index[xidGPU]))
	expect("after XID 79 on GPU "+xidGPU, map[string]corev1.ResourceHealthStatus{xidGPU: "Unhealthy", hotGPU: "Healthy"}, total-1)
	inject(fmt.Sprintf("temp %d 95", index[hotGPU]))
	expect("at 95C on GPU "+hotGPU, map[string]corev1.ResourceHealthStatus{xidGPU: "Unhealthy", hotGPU: "Unhealthy"}, total-2)
	inject(fmt.Sprintf("temp %d 40", index[hotGPU]))
	expect("cooled to 40C", map[string]corev1.ResourceHealthStatus{xidGPU: "Unhealthy", hotGPU: "Healthy"}, total-1)
}

// podAIntact checks that pod A still runs the same container with the
// same GPUs.
func (s *scenario) podAIntact(t *testing.T, ctx context.Context) {
	t.Helper()
	pod, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs := pod.Status.ContainerStatuses
	if pod.Status.Phase != corev1.PodRunning || len(cs) != 1 || cs[0].State.Running == nil {
		t.Fatalf("pod %s no longer running:%s", podA, describePod(ctx, pod))
	}
	if cs[0].ContainerID != s.containerA || cs[0].RestartCount != 0 {
		t.Errorf("pod %s's container changed: %s (restarts %d), was %s", podA, cs[0].ContainerID, cs[0].RestartCount, s.containerA)
	}
	if got := sortedKeys(allocatedGPUs(pod)); !slices.Equal(got, s.gpusA) {
		t.Errorf("pod %s's GPUs are %v, were %v", podA, got, s.gpusA)
	}
}

func (s *scenario) kubeletRestart(t *testing.T, ctx context.Context) {
	restarted, err := restartKubelet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The new kubelet wipes the plugin's socket; the plugin serves and
	// registers again, keeping the health it knew (the XID is fatal).
	if err := socketNewerThan(ctx, restarted); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs))-1, 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	s.podAIntact(t, ctx)
	// Only a kubelet that reached the plugin again can admit a GPU pod;
	// only one that kept its checkpoint gives it GPUs other than A's.
	s.newPodGetsFreeGPUs(t, ctx, podB)
}

func (s *scenario) pluginRestart(t *testing.T, ctx context.Context) {
	deleted := time.Now()
	if err := k8s.kube.CoreV1().Pods(releaseNamespace).Delete(ctx, s.plugin, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next, err := waitPluginRunning(ctx, s.plugin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plugin pod %s replaced by %s", s.plugin, next)
	s.plugin = next
	if err := socketNewerThan(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	// The new process keeps the fatal XID seen on this boot: the GPU stays
	// out of allocatable and the condition says why...
	if line, err := waitLog(ctx, next, restoredMsg); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	} else {
		t.Logf("the new plugin kept the XID: %s", line)
	}
	total := int64(len(env.Profile.GPUs))
	if err := waitAllocatable(ctx, total-1, time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if _, err := waitCondition(ctx, "GPUHealthy", corev1.ConditionFalse, "xid=79"); err != nil {
		t.Fatal(err)
	}
	// ...until the driver says the GPU was reset: a recovery action, then none.
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	xidIndex := env.uuidIndex()[s.gpusA[0]]
	for _, c := range []struct{ cmd, part string }{
		{fmt.Sprintf("recovery %d reset", xidIndex), "recovery-action=reset"},
		{fmt.Sprintf("recovery %d none", xidIndex), ""},
	} {
		if err := ctl.InjectContext(ctx, c.cmd); err != nil {
			t.Fatal(err)
		}
		status := corev1.ConditionFalse
		if c.part == "" {
			status = corev1.ConditionTrue
		}
		if _, err := waitCondition(ctx, "GPUHealthy", status, c.part); err != nil {
			t.Fatalf("after %q: %v%s", c.cmd, err, pluginLogs(ctx))
		}
	}
	if err := waitAllocatable(ctx, total, time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if c, err := waitCondition(ctx, "GPUHealthy", corev1.ConditionTrue, ""); err != nil {
		t.Error(err)
	} else {
		t.Logf("node condition %s=%s after the restart: %s", c.Type, c.Status, c.Message)
	}
	s.podAIntact(t, ctx)
	s.newPodGetsFreeGPUs(t, ctx, podC)
}

// newPodGetsFreeGPUs runs a two-GPU pod and checks that it got GPUs no
// other pod holds, and sees exactly those.
func (s *scenario) newPodGetsFreeGPUs(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	pod, err := createPod(ctx, probePod(name, 2), true)
	if err != nil {
		t.Fatal(err)
	}
	got := sortedKeys(allocatedGPUs(pod))
	if len(got) != 2 {
		t.Fatalf("pod %s got %v", name, got)
	}
	for other, gpus := range s.held {
		for _, g := range got {
			if slices.Contains(gpus, g) {
				t.Errorf("pod %s got %s, which pod %s holds", name, g, other)
			}
		}
	}
	rep, err := probeOutput(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	visible := strings.Split(rep.Env["NVIDIA_VISIBLE_DEVICES"], ",")
	slices.Sort(visible)
	if !slices.Equal(visible, got) {
		t.Errorf("pod %s sees %v, was given %v", name, visible, got)
	}
	checkGPUDevices(t, rep, got)
	s.held[name] = got
	t.Logf("pod %s: %v", name, got)
}

func (s *scenario) podThroughCDI(t *testing.T, ctx context.Context) {
	if !env.CDI {
		t.Skip("the container runtime does not inject CDI devices (E2E_CDI=false)")
	}
	r, err := renderChart("cdi-cri")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	// The steps after this one restore and uninstall this release: back
	// on envvar, the plugin would remove its specs at start.
	s.release = r
	// The config's checksum changed, so the DaemonSet rolls the pod.
	next, err := waitPluginRunning(ctx, s.plugin)
	if err != nil {
		t.Fatal(err)
	}
	s.plugin = next
	// The node's allocatable still shows the old pod's devices, and the
	// kubelet rejects a pod it admits before the new pod registered.
	if _, err := waitRegistered(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gpuSpecFile()); err != nil {
		t.Fatalf("no CDI spec: %v%s", err, pluginLogs(ctx))
	}

	pod, err := createPod(ctx, cudaProbePod(podCDI, 2), true)
	if err != nil && strings.Contains(err.Error(), "UnexpectedAdmissionError") {
		// Registered, but the kubelet's first device list from the new
		// pod may still be on its way (milliseconds): once more.
		t.Logf("admitted before the kubelet had the new device list; again: %v", err)
		if err = deletePods(ctx, podCDI); err == nil {
			pod, err = createPod(ctx, cudaProbePod(podCDI, 2), true)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podCDI)
	if err != nil {
		t.Fatal(err)
	}
	got := sortedKeys(allocatedGPUs(pod))
	for other, gpus := range s.held {
		for _, g := range got {
			if slices.Contains(gpus, g) {
				t.Errorf("pod %s got %s, which pod %s holds", podCDI, g, other)
			}
		}
	}
	checkGPUDevices(t, rep, got)
	if !rep.Files[libraryInContainer] {
		t.Errorf("CDI did not mount the driver's %s", libraryInContainer)
	}
	checkCUDA(t, rep)
	s.held[podCDI] = got
	t.Logf("pod %s through CDI: GPUs %v, devices %v, %s mounted, ld cache %q", podCDI, got, rep.devicePaths(), libraryInContainer, rep.cudaCacheLine())
}

// restartWithoutPlugin takes the plugin off the node, kills the CDI pod's
// container and waits for the kubelet to restart it: it does so with the
// CDI names it checkpointed, without asking the plugin, so the spec files
// must have outlived the plugin. The restarted container gets CUDA too.
func (s *scenario) restartWithoutPlugin(t *testing.T, ctx context.Context) {
	if !env.CDI {
		t.Skip("the container runtime does not inject CDI devices (E2E_CDI=false)")
	}
	if err := s.release.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if pods, err := pluginPods(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("plugin pods left: %d (%v)", len(pods), err)
	}
	if _, err := os.Stat(gpuSpecFile()); err != nil {
		t.Fatalf("the GPU spec went with the plugin: %v", err)
	}
	before, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podCDI, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restarts := func(p *corev1.Pod) int32 {
		if len(p.Status.ContainerStatuses) == 0 {
			return 0
		}
		return p.Status.ContainerStatuses[0].RestartCount
	}
	pid, err := probePID(podCDI)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the probe (pid %d): %v", pid, err)
	}
	_, err = waitPod(ctx, podCDI, 2*time.Minute, "restarted and running", func(p *corev1.Pod) (bool, error) {
		if len(p.Status.ContainerStatuses) == 0 || restarts(p) <= restarts(before) {
			return false, nil
		}
		return p.Status.ContainerStatuses[0].State.Running != nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podCDI)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, s.held[podCDI])
	checkCUDA(t, rep)
	t.Logf("pod %s restarted without the plugin: devices %v, ld cache %q", podCDI, rep.devicePaths(), rep.cudaCacheLine())

	// The plugin comes back for the steps after this one.
	if err := s.release.apply(ctx); err != nil {
		t.Fatal(err)
	}
	if s.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *scenario) uninstall(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, allPods...); err != nil {
		t.Fatal(err)
	}
	if err := s.release.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if pods, err := pluginPods(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("plugin pods left: %d (%v)", len(pods), err)
	}
	// The specs stay after uninstall (containers restart with their names);
	// README's uninstall step removes them.
	if _, err := os.Stat(gpuSpecFile()); env.CDI && err != nil {
		t.Errorf("the GPU spec is gone after uninstall: %v", err)
	}
	if err := removeSpecs(); err != nil {
		t.Fatal(err)
	}
	left, err := leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	s.release = nil
}

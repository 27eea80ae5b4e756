package suite

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// The sharing lane: MIG devices and time-sliced replicas on a node whose
// mock machine is e2e/profiles/dgx-h100-mig.profile.
const (
	migProfile     = "dgx-h100-mig"
	migFixtureDir  = "mig" // under the node's fixture, so kind's extraMount holds it too
	sharedResource = corev1.ResourceName("nvidia.com/gpu.shared")
	sharedReplicas = 2
	podMIG         = "mig-1g"   // one nvidia.com/mig-1g.10gb
	podShared1     = "shared-1" // one replica of the shared GPU
	podShared2     = "shared-2" // the other replica of the same GPU
)

var sharingPods = []string{podMIG, podShared1, podShared2}

// TestSharingNode serves a MIG machine with migStrategy mixed and one GPU
// time-sliced: a pod gets one MIG device, two pods get replicas of one
// GPU, and an XID on that GPU reaches both.
func TestSharingNode(t *testing.T) {
	ctx := t.Context()
	s := &sharingScenario{}
	steps := []step{
		{"install on the MIG machine with migStrategy mixed and one GPU time-sliced", s.install},
		{"node advertises each MIG profile, the GPUs without MIG and the replicas", s.nodeAdvertises},
		{"pod gets one 1g.10gb MIG device with its GPU and capability nodes", s.migPod},
		{"two pods get the two replicas of one GPU", s.sharedPods},
		{"XID 79 on the shared GPU reaches both pods' status", s.xid},
		{"uninstall leaves the node clean", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, sharingPods...)
	runSteps(t, ctx, steps)
}

type sharingScenario struct {
	release *release
	// node is the MIG machine's fixture; its Fixture is a directory of
	// the node's fixture.
	node *settings
	// shared is the time-sliced GPU (the first without MIG).
	shared mocknvml.GPU
	// replicas are the replica IDs each shared pod holds, by pod.
	replicas map[string]string
}

// writeMIGFixture runs e2e/cluster/fixture for the MIG profile into a
// directory of the node's fixture, which the node sees at the same path.
func writeMIGFixture(ctx context.Context) (*settings, error) {
	dir := filepath.Join(env.Fixture, migFixtureDir)
	cmd := exec.CommandContext(ctx, "go", "run", "../fixture", "-profile", migProfile, "-o", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("writing the %s fixture: %w\n%s", migProfile, err, out)
	}
	p, err := mocknvml.LoadProfile(filepath.Join(dir, migProfile+".profile"))
	if err != nil {
		return nil, err
	}
	node := *env
	node.Fixture, node.Profile = dir, p
	return &node, nil
}

// migResourceName is the resource migStrategy mixed serves profile under.
func migResourceName(profile string) corev1.ResourceName {
	return corev1.ResourceName("nvidia.com/mig-" + strings.ReplaceAll(profile, "+", "."))
}

func (s *sharingScenario) install(t *testing.T, ctx context.Context) {
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deletePods(ctx, sharingPods...); err != nil {
		t.Fatal(err)
	}
	node, err := writeMIGFixture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.node = node
	found := false
	for _, g := range node.Profile.GPUs {
		if g.MIG != "on" {
			s.shared, found = g, true
			break
		}
	}
	if !found {
		t.Fatalf("%s has no GPU without MIG to time-slice", migProfile)
	}
	v, err := node.chartValues("envvar")
	if err != nil {
		t.Fatal(err)
	}
	healthRulesOnly(v)
	cfg := v["config"].(map[string]any)
	cfg["migStrategy"] = "mixed"
	// The first GPU without MIG as two replicas under its own name, so
	// that both pods land on it whatever the placement; the other GPUs
	// without MIG as two replicas each under nvidia.com/gpu.
	cfg["sharing"] = map[string]any{"timeSlicing": map[string]any{"resources": []any{
		map[string]any{"name": string(gpuResource), "replicas": sharedReplicas, "rename": string(sharedResource), "devices": []any{s.shared.UUID}},
		map[string]any{"name": string(gpuResource), "replicas": sharedReplicas},
	}}}
	if !node.hasNICs() {
		// The MIG capabilities the nvidia-caps minors come from.
		v["extraArgs"] = append(v["extraArgs"].([]any), "--proc-root="+node.procRoot())
	}
	r, err := renderValues(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.release = r
	t.Logf("installed %s on %s", r, node.Fixture)
	if _, err := waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantResources is what the node should advertise: each MIG profile's
// devices, the GPUs without MIG (but the shared one) as replicas under
// nvidia.com/gpu, and the shared GPU's replicas.
func (s *sharingScenario) wantResources() map[corev1.ResourceName]int64 {
	want := map[corev1.ResourceName]int64{sharedResource: sharedReplicas, gpuResource: 0}
	for _, g := range s.node.Profile.GPUs {
		switch {
		case g.MIG == "on":
			for _, m := range g.MIGDevices {
				want[migResourceName(m.Profile)]++
			}
		case g.UUID != s.shared.UUID:
			want[gpuResource] += sharedReplicas
		}
	}
	return want
}

// nodeResources are the node's nvidia.com/* capacity and allocatable.
func nodeResources(ctx context.Context) (capacity, allocatable map[corev1.ResourceName]int64, err error) {
	n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	pick := func(l corev1.ResourceList) map[corev1.ResourceName]int64 {
		m := map[corev1.ResourceName]int64{}
		for name, q := range l {
			if strings.HasPrefix(string(name), "nvidia.com/") {
				m[name] = q.Value()
			}
		}
		return m
	}
	return pick(n.Status.Capacity), pick(n.Status.Allocatable), nil
}

// waitResources waits until the node's allocatable and capacity hold
// want for every resource named there, and no other nvidia.com resource
// is allocatable (the kubelet keeps those of an earlier lane at 0).
func waitResources(ctx context.Context, want map[corev1.ResourceName]int64, timeout time.Duration) error {
	var c, a map[corev1.ResourceName]int64
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if c, a, err = nodeResources(ctx); err != nil {
			return false, nil
		}
		for name, n := range a {
			if want[name] != n {
				return false, nil
			}
		}
		for name, n := range want {
			if a[name] != n || c[name] < n {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: allocatable %v (capacity %v), want %v: %w", env.Node, a, c, want, err)
	}
	return nil
}

func (s *sharingScenario) nodeAdvertises(t *testing.T, ctx context.Context) {
	want := s.wantResources()
	if err := waitResources(ctx, want, 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	t.Logf("node %s advertises %v", env.Node, want)
}

// allocatedDevices is what the kubelet reports it gave the pod's
// container of resource name, by device ID, with each device's health.
func allocatedDevices(p *corev1.Pod, name corev1.ResourceName) map[string]corev1.ResourceHealthStatus {
	m := map[string]corev1.ResourceHealthStatus{}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name == name {
				for _, h := range rs.Resources {
					m[string(h.ResourceID)] = h.Health
				}
			}
		}
	}
	return m
}

// capNode is the container path of nvidia-caps minor n.
func capNode(n int) string { return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", n) }

// checkGPUNodes checks that the container has /dev/nvidiactl and exactly
// the GPU nodes of minors, as character devices.
func checkGPUNodes(t *testing.T, rep probeReport, minors ...int) {
	t.Helper()
	want := []string{"/dev/nvidiactl"}
	for _, m := range minors {
		want = append(want, fmt.Sprintf("/dev/nvidia%d", m))
	}
	have := map[string]bool{}
	for _, d := range rep.Devices {
		have[d.Path] = d.Char
	}
	for _, d := range want {
		if !have[d] {
			t.Errorf("container lacks the character device %s; it has %v", d, rep.devicePaths())
		}
	}
	for _, d := range rep.devicePaths() {
		gpuNode := strings.HasPrefix(d, "/dev/nvidia") && !strings.HasPrefix(d, "/dev/nvidia-")
		if gpuNode && !slices.Contains(want, d) {
			t.Errorf("container has %s, which it was not given", d)
		}
	}
}

func (s *sharingScenario) migPod(t *testing.T, ctx context.Context) {
	const profile = "1g.10gb"
	name := migResourceName(profile)
	// The probe reports which of every capability node the container has:
	// which MIG device it gets is the plugin's choice.
	byUUID := map[string]mocknvml.MIGDevice{}
	caps := []int{mocknvml.MIGConfigCapMinor, mocknvml.MIGMonitorCapMinor}
	for _, g := range s.node.Profile.GPUs {
		for _, m := range g.MIGDevices {
			byUUID[m.UUID] = m
			caps = append(caps, m.GICapMinor, m.CICapMinor)
		}
	}
	slices.Sort(caps)
	caps = slices.Compact(caps)
	look := make([]string, len(caps))
	for i, c := range caps {
		look[i] = capNode(c)
	}
	p := probePodFor(podMIG, corev1.ResourceList{name: *resource.NewQuantity(1, resource.DecimalSI)})
	p.Spec.Containers[0].Args = []string{"-look-for=" + strings.Join(look, ",")}
	pod, err := createPod(ctx, p, true)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podMIG)
	if err != nil {
		t.Fatal(err)
	}
	visible := rep.Env["NVIDIA_VISIBLE_DEVICES"]
	m, ok := byUUID[visible]
	if !ok || m.Profile != profile {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q, want one %s MIG device's UUID", visible, profile)
	}
	parent := s.node.Profile.GPUs[m.GPU]
	checkGPUNodes(t, rep, parent.Minor)
	wantCaps := []string{capNode(m.GICapMinor), capNode(m.CICapMinor)}
	var gotCaps []string
	for _, c := range look {
		if rep.Files[c] {
			gotCaps = append(gotCaps, c)
		}
	}
	slices.Sort(wantCaps)
	if !slices.Equal(gotCaps, wantCaps) {
		t.Errorf("container has the capability nodes %v, want %s's GPU and compute instance access: %v", gotCaps, visible, wantCaps)
	}
	if got := allocatedDevices(pod, name); !maps.Equal(got, map[string]corev1.ResourceHealthStatus{visible: "Healthy"}) {
		t.Errorf("allocatedResourcesStatus of %s lists %v, the container sees %s", name, got, visible)
	}
	t.Logf("pod %s: NVIDIA_VISIBLE_DEVICES=%s (GPU %d gi %d ci %d), devices %v, capabilities %v",
		podMIG, visible, m.GPU, m.GPUInstance, m.ComputeInstance, rep.devicePaths(), gotCaps)
}

func (s *sharingScenario) sharedPods(t *testing.T, ctx context.Context) {
	s.replicas = map[string]string{}
	for _, name := range []string{podShared1, podShared2} {
		pod, err := createPod(ctx, probePodFor(name, corev1.ResourceList{sharedResource: *resource.NewQuantity(1, resource.DecimalSI)}), true)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := probeOutput(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.Env["NVIDIA_VISIBLE_DEVICES"]; got != s.shared.UUID {
			t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES = %q, want the shared GPU %s once", name, got, s.shared.UUID)
		}
		checkGPUNodes(t, rep, s.shared.Minor)
		ids := sortedKeys(allocatedDevices(pod, sharedResource))
		if len(ids) != 1 || !strings.HasPrefix(ids[0], s.shared.UUID+gpu.ReplicaSep) {
			t.Fatalf("pod %s: allocatedResourcesStatus of %s lists %v, want one replica of %s", name, sharedResource, ids, s.shared.UUID)
		}
		s.replicas[name] = ids[0]
		t.Logf("pod %s: NVIDIA_VISIBLE_DEVICES=%s, replica %s, devices %v", name, rep.Env["NVIDIA_VISIBLE_DEVICES"], ids[0], rep.devicePaths())
	}
	if s.replicas[podShared1] == s.replicas[podShared2] {
		t.Errorf("both pods hold replica %s", s.replicas[podShared1])
	}
}

func (s *sharingScenario) xid(t *testing.T, ctx context.Context) {
	ctl, err := mocknvml.OpenControl(s.node.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	xidReachesPods(t, ctx, ctl, s.shared.Index, sharedResource, s.replicas, podShared1, podShared2)
	want := s.wantResources()
	want[sharedResource] = 0
	if err := waitResources(ctx, want, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The fault is the shared GPU's alone: the MIG pod's device stays healthy.
	p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podMIG, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for id, h := range allocatedDevices(p, migResourceName("1g.10gb")) {
		if h != "Healthy" {
			t.Errorf("pod %s: %s is %s after an XID on another GPU", podMIG, id, h)
		}
	}
}

// xidReachesPods injects XID 79 on the GPU at index through ctl and waits
// until each of pods shows the device it holds of resource (held, by pod)
// Unhealthy.
func xidReachesPods(t *testing.T, ctx context.Context, ctl *mocknvml.Control, index int, resource corev1.ResourceName, held map[string]string, pods ...string) {
	t.Helper()
	cmd := fmt.Sprintf("xid %d 79", index)
	injected := time.Now()
	if err := ctl.InjectContext(ctx, cmd); err != nil {
		t.Fatalf("injecting %q: %v", cmd, err)
	}
	for _, name := range pods {
		want := map[string]corev1.ResourceHealthStatus{held[name]: "Unhealthy"}
		if _, err := waitPod(ctx, name, time.Minute, fmt.Sprintf("showing %v", want), func(p *corev1.Pod) (bool, error) {
			return maps.Equal(allocatedDevices(p, resource), want), nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s: %s Unhealthy %s after %q", name, held[name], time.Since(injected).Round(time.Millisecond), cmd)
	}
}

func (s *sharingScenario) uninstall(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, sharingPods...); err != nil {
		t.Fatal(err)
	}
	uninstallClean(t, ctx, s.release)
	s.release = nil
	if err := os.RemoveAll(s.node.Fixture); err != nil {
		t.Error(err)
	}
}

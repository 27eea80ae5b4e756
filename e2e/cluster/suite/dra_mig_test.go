package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// The MIG partition lane: the profile's last GPU is put in MIG mode with
// no instance (a profile of the lane's own, beside the fixture's), and
// sharing.migPartitions publishes it as the placements it allows. Claims'
// Prepare creates their instances through the mock NVML, whose state
// file outlives the plugin's process as the driver's state does.
const (
	migClass    = "mig.gpu-device-plugin.github.io"
	migTmpl3g   = "mig-3g"
	migTmpl4g   = "mig-4g"
	podMIG4g    = "dra-mig-4g"
	podMIG3g    = "dra-mig-3g"
	podMIGLate  = "dra-mig-late"
	podMIGCrash = "dra-mig-crash"
)

var migPods = []string{podMIG4g, podMIG3g, podMIGLate, podMIGCrash}

// TestDRAMIGPartitions: two claims split the partitioned GPU into a 4g
// and a 3g instance, each pod getting its GPU's node and its instance's
// two capability nodes; a third claim that does not fit stays pending
// until a pod goes, whose instance is destroyed; a plugin SIGKILLed
// between creating an instance and recording it leaks nothing: the next
// one destroys it and prepares the claim anew.
func TestDRAMIGPartitions(t *testing.T) {
	s := &migScenario{}
	steps := []step{
		{"install in DRA mode with one GPU partitioned on demand", s.install},
		{"the GPU is published as its placements, with its counter set", s.slice},
		{"a 4g and a 3g claim split the GPU; each pod gets its instance", s.split},
		{"a third claim that does not fit stays pending", s.pending},
		{"deleting a pod destroys its instance, and the pending claim fits", s.free},
		{"SIGKILL between creating an instance and recording it leaks nothing", s.crash},
		{"uninstall leaves the node clean, no instance left", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, migPods...)
	runSteps(t, t.Context(), steps)
}

type migScenario struct {
	release *release
	gpu     mocknvml.GPU
	state   string // the mock's MIG state file
	plugin  string
	// instances are the MIG UUIDs each pod got.
	instances map[string]string
}

// partitionedProfile writes the fixture's profile with gpu in MIG mode.
func partitionedProfile(gpu int) (string, error) {
	b, err := os.ReadFile(env.profilePath())
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(b), "\n")
	found := false
	for i, l := range lines {
		if strings.HasPrefix(l, fmt.Sprintf("gpu %d ", gpu)) {
			lines[i], found = l+" mig=on", true
		}
	}
	if !found {
		return "", fmt.Errorf("%s has no gpu %d line", env.profilePath(), gpu)
	}
	path := filepath.Join(env.Fixture, "mig-partitions.profile")
	return path, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
}

// migProcRoot is the fixture's proc root with a devices file naming the
// nvidia-caps major: the fixture's nodes are all 1:3, so major 1 (what
// mocknvml's WriteProc writes for MIG profiles).
func migProcRoot() (string, error) {
	root := env.procRoot()
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(root, "devices")
	if _, err := os.Stat(p); err == nil {
		return root, nil
	}
	return root, os.WriteFile(p, []byte("Character devices:\n  1 mem\n  1 nvidia-caps\n195 nvidia\n"), 0o644)
}

func (s *migScenario) install(t *testing.T, ctx context.Context) {
	s.gpu = env.Profile.GPUs[len(env.Profile.GPUs)-1]
	s.instances = map[string]string{}
	profile, err := partitionedProfile(s.gpu.Index)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := migProcRoot()
	if err != nil {
		t.Fatal(err)
	}
	s.state = filepath.Join(env.Fixture, "mig-state")
	for _, p := range []string{s.state, s.state + ".lock"} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	v, err := draValues()
	if err != nil {
		t.Fatal(err)
	}
	var vars []any
	for _, e := range v["env"].([]any) {
		if e.(map[string]any)["name"] != "MOCK_NVML_PROFILE" {
			vars = append(vars, e)
		}
	}
	v["env"] = append(vars,
		map[string]any{"name": "MOCK_NVML_PROFILE", "value": profile},
		map[string]any{"name": "MOCK_NVML_MIG_STATE", "value": s.state},
		map[string]any{"name": "MOCK_NVML_PROC_ROOT", "value": proc},
	)
	if !slices.Contains(v["extraArgs"].([]any), any("--proc-root="+proc)) {
		v["extraArgs"] = append(v["extraArgs"].([]any), "--proc-root="+proc)
	}
	v["config"].(map[string]any)["sharing"] = map[string]any{"migPartitions": map[string]any{
		"enabled": true, "devices": []any{fmt.Sprint(s.gpu.Index)},
	}}
	s.release = installDRA(t, ctx, v, migPods...)
	if s.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *migScenario) name(profile string, start int) string {
	return fmt.Sprintf("gpu-%d-%s-%d", s.gpu.Index, strings.ReplaceAll(profile, ".", "-"), start)
}

func (s *migScenario) slice(t *testing.T, ctx context.Context) {
	devs, err := waitSlices(ctx, "publishing the placements", func(d map[string]resourceapi.Device) bool { _, ok := d[s.name("3g.40gb", 4)]; return ok })
	if err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if _, ok := devs[fmt.Sprintf("gpu-%d", s.gpu.Index)]; ok {
		t.Errorf("gpu-%d is published whole", s.gpu.Index)
	}
	var placements []string
	for name := range devs {
		if strings.HasPrefix(name, fmt.Sprintf("gpu-%d-", s.gpu.Index)) {
			placements = append(placements, name)
		}
	}
	slices.Sort(placements)
	// An H100's: 7 (1g), 7 (1g+me), 4 (1g.20gb), 3 (2g), 2 (3g), 1 (4g), 1 (7g).
	if len(placements) != 25 {
		t.Errorf("%d placements published, want 25: %v", len(placements), placements)
	}
	d := devs[s.name("3g.40gb", 4)]
	if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != fmt.Sprintf("gpu-%d-slices", s.gpu.Index) || len(d.ConsumesCounters[0].Counters) != 5 {
		t.Errorf("%s consumes %+v", s.name("3g.40gb", 4), d.ConsumesCounters)
	}
	// The counter sets are a slice of their own, which the helper's
	// controller may write a moment after the devices'.
	var sets []resourceapi.CounterSet
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sets, err = counterSets(ctx)
		return err == nil && len(sets) > 0, nil
	}); err != nil {
		t.Fatalf("no counter set published: %v", err)
	}
	// 8 memory slices, 7 compute slices, one 1g.10gb+me at most.
	if len(sets) != 1 || len(sets[0].Counters) != 10 {
		t.Errorf("counter sets %+v", sets)
	}
	t.Logf("published %d placements: %v", len(placements), placements)
}

// counterSets are the counter sets of this node's slices of our driver.
func counterSets(ctx context.Context) ([]resourceapi.CounterSet, error) {
	slices, _, err := nodeSlices(ctx)
	if err != nil {
		return nil, err
	}
	var out []resourceapi.CounterSet
	for _, sl := range slices {
		out = append(out, sl.Spec.SharedCounters...)
	}
	return out, nil
}

// migTemplate asks for one instance of profile on the partitioned GPU.
func (s *migScenario) migTemplate(ctx context.Context, name, profile string) error {
	return createTemplate(ctx, name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: migClass,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].profile == %q && device.attributes[%q].parentIndex == %d`, draDriver, profile, draDriver, s.gpu.Index),
			}}},
		},
	}}})
}

// runMIGPod runs pod on template and checks it got the placement want:
// its GPU's node and two capability nodes of the instance Prepare made.
func (s *migScenario) runMIGPod(t *testing.T, ctx context.Context, pod, template, want string) {
	t.Helper()
	p, err := createPod(ctx, claimProbePod(pod, template), true)
	if err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	claims, err := podClaims(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].Status.Allocation == nil || claims[0].Status.Allocation.Devices.Results[0].Device != want {
		t.Fatalf("pod %s's claim: %+v, want %s", pod, claims, want)
	}
	rep, err := probeOutput(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, []string{s.gpu.UUID})
	var caps []string
	for _, d := range rep.Devices {
		if strings.HasPrefix(d.Path, "/dev/nvidia-caps/") {
			caps = append(caps, d.Path)
		}
	}
	st, err := mocknvml.LoadMIGState(s.state)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := st.GPU(s.gpu.UUID)
	var wantCaps []string
	for _, ci := range g.ComputeInstances {
		i := slices.IndexFunc(g.GPUInstances, func(gi mocknvml.MIGStateGI) bool { return gi.ID == ci.GPUInstance })
		if i >= 0 && s.name(ci.Name, g.GPUInstances[i].Start) == want {
			minor := 3 + 135*s.gpu.Minor + 9*ci.GPUInstance
			wantCaps = []string{fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor+1+ci.ID)}
			s.instances[pod] = ci.UUID
		}
	}
	slices.Sort(wantCaps)
	if wantCaps == nil || !slices.Equal(caps, wantCaps) {
		t.Errorf("pod %s has capability nodes %v, want %v (instances %+v)", pod, caps, wantCaps, g)
	}
}

func (s *migScenario) split(t *testing.T, ctx context.Context) {
	for name, profile := range map[string]string{migTmpl3g: "3g.40gb", migTmpl4g: "4g.40gb"} {
		if err := s.migTemplate(ctx, name, profile); err != nil {
			t.Fatal(err)
		}
	}
	// The 4g first: a 3g at slice 0 would leave no room for it.
	s.runMIGPod(t, ctx, podMIG4g, migTmpl4g, s.name("4g.40gb", 0))
	s.runMIGPod(t, ctx, podMIG3g, migTmpl3g, s.name("3g.40gb", 4))
	for _, l := range pluginLogLines(ctx, s.plugin, "MIG: created an instance for a claim") {
		t.Logf("Prepare created %v (%v, gpu instance %v) in %v", l["device"], l["mig"], l["gpuInstance"], l["took"])
	}
}

func (s *migScenario) pending(t *testing.T, ctx context.Context) {
	if _, err := createPod(ctx, claimProbePod(podMIGLate, migTmpl3g), false); err != nil {
		t.Fatal(err)
	}
	if _, err := waitPod(ctx, podMIGLate, time.Minute, "unschedulable", func(p *corev1.Pod) (bool, error) {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	st, err := mocknvml.LoadMIGState(s.state)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := st.GPU(s.gpu.UUID); len(g.GPUInstances) != 2 {
		t.Errorf("%d GPU instances, want the two claims'", len(g.GPUInstances))
	}
}

func (s *migScenario) free(t *testing.T, ctx context.Context) {
	gone := s.instances[podMIG3g]
	if err := deletePods(ctx, podMIG3g); err != nil {
		t.Fatal(err)
	}
	if err := waitInstance(ctx, s.state, s.gpu.UUID, gone, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, l := range pluginLogLines(ctx, s.plugin, "MIG: destroyed a claim's instances") {
		t.Logf("Unprepare destroyed %v in %v", l["migs"], l["took"])
	}
	// The scheduler retries the pending pod on its own schedule.
	freed := time.Now()
	if _, err := waitPod(ctx, podMIGLate, 3*time.Minute, "running", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	t.Logf("the pending pod ran %.1fs after the placement was freed", time.Since(freed).Seconds())
}

// waitInstance waits until the mock's state has (or lacks) MIG device uuid.
func waitInstance(ctx context.Context, state, gpu, uuid string, present bool, timeout time.Duration) error {
	var last []mocknvml.MIGStateCI
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		st, err := mocknvml.LoadMIGState(state)
		if err != nil {
			return false, nil
		}
		g, _ := st.GPU(gpu)
		last = g.ComputeInstances
		return slices.ContainsFunc(g.ComputeInstances, func(ci mocknvml.MIGStateCI) bool { return ci.UUID == uuid }) == present, nil
	})
	if err != nil {
		return fmt.Errorf("MIG device %s present %v: %w (instances %+v)%s", uuid, present, err, last, pluginLogs(ctx))
	}
	return nil
}

func (s *migScenario) crash(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, podMIG4g, podMIGLate); err != nil {
		t.Fatal(err)
	}
	if err := s.waitNoInstance(ctx); err != nil {
		t.Fatal(err)
	}
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	// The next compute instance waits once its GPU instance exists: the
	// plugin is between creating and recording it.
	if err := ctl.PauseMIGCreate(s.gpu.Index, mocknvml.MIGPauseAfter); err != nil {
		t.Fatal(err)
	}
	if _, err := createPod(ctx, claimProbePod(podMIGCrash, migTmpl3g), false); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := ctl.WaitMIGCreatePaused(wctx, s.gpu.Index); err != nil {
		t.Fatalf("no creation paused: %v%s", err, pluginLogs(ctx))
	}
	left, err := mocknvml.LoadMIGState(s.state)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := left.GPU(s.gpu.UUID)
	if len(g.ComputeInstances) != 1 {
		t.Fatalf("paused with instances %+v, want the one being created", g)
	}
	orphan := g.ComputeInstances[0].UUID
	killed := time.Now()
	zero := int64(0)
	if err := k8s.kube.CoreV1().Pods(releaseNamespace).Delete(ctx, s.plugin, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if s.plugin, err = waitPluginRunning(ctx, s.plugin); err != nil {
		t.Fatal(err)
	}
	// The next plugin destroys the orphan and prepares the claim anew at
	// the kubelet's retry (its pod resync: about a minute after the
	// failed Prepare).
	if err := waitInstance(ctx, s.state, s.gpu.UUID, orphan, false, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := waitPod(ctx, podMIGCrash, 2*time.Minute, "running", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	st, err := mocknvml.LoadMIGState(s.state)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := st.GPU(s.gpu.UUID); len(g.ComputeInstances) != 1 || g.ComputeInstances[0].UUID == orphan {
		t.Errorf("after the restart: instances %+v, want one new one", g.ComputeInstances)
	}
	if l := pluginLogLines(ctx, s.plugin, "MIG: destroyed what an interrupted Prepare created; the kubelet prepares the claim again"); len(l) != 1 {
		t.Errorf("the next plugin logged %d reconciliations, want 1", len(l))
	}
	t.Logf("killed between creating %s and recording it; the pod ran on a new instance %.1fs later", orphan, time.Since(killed).Seconds())
}

// waitNoInstance waits until the partitioned GPU has no GPU instance.
func (s *migScenario) waitNoInstance(ctx context.Context) error {
	var left []mocknvml.MIGStateGI
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		st, err := mocknvml.LoadMIGState(s.state)
		if err != nil {
			return false, nil
		}
		g, _ := st.GPU(s.gpu.UUID)
		left = g.GPUInstances
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("GPU instances %+v left after the pods went: %w", left, err)
	}
	return nil
}

// pluginLogLines are the plugin pod's JSON log entries with message msg.
func pluginLogLines(ctx context.Context, pod, msg string) []map[string]any {
	out, err := k8s.kube.CoreV1().Pods(releaseNamespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return nil
	}
	var lines []map[string]any
	for _, line := range strings.Split(string(out), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == msg {
			lines = append(lines, e)
		}
	}
	return lines
}

func (s *migScenario) uninstall(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, migPods...); err != nil {
		t.Fatal(err)
	}
	if err := s.waitNoInstance(ctx); err != nil {
		t.Error(err)
	}
	uninstallDRA(t, ctx, s.release, migTmpl3g, migTmpl4g)
	s.release = nil
}

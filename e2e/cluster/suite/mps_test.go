package suite

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

// The MPS lane: one GPU of the node's mock machine shared through MPS, its
// control daemon the fixture's stand-in (mpstest/mockmps) run by the
// plugin, confined in the fixture's driver root.
const (
	mpsResource = corev1.ResourceName("nvidia.com/gpu.mps")
	mpsReplicas = 2
	podMPS1     = "mps-1"
	podMPS2     = "mps-2"
)

var mpsPods = []string{podMPS1, podMPS2}

// TestMPSNode shares one GPU through MPS: its shares are offered once its
// control daemon answers; two pods get one share each, with the daemon's
// pipe directory and shared memory mounted and half the GPU's threads and
// memory as their limits; the daemon killed behind the plugin's back is
// restarted; a plugin pod restart leaves the daemon and the pods running;
// an XID on the GPU reaches both pods, and its reset brings the
// shares back; turning MPS off stops the daemon and removes its
// directories.
func TestMPSNode(t *testing.T) {
	s := &mpsScenario{}
	steps := []step{
		{"install with one GPU shared through MPS", s.install},
		{"node advertises the MPS shares once the daemon answers", s.advertises},
		{"two pods get one share each: mounts and limits", s.pods},
		{"a daemon that dies is restarted and its shares offered again", s.daemonDies},
		{"a plugin pod restart leaves the daemon (in the MPS launcher's pod) and the pods running; the next plugin adopts it", s.pluginRestart},
		{"XID 79 on the shared GPU reaches both pods' status; a reset clears it", s.xid},
		{"turning MPS off stops the daemon and removes its directories", s.turnOff},
		{"uninstall leaves the node clean", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, mpsPods...)
	runSteps(t, t.Context(), steps)
}

type mpsScenario struct {
	release *release
	shared  mocknvml.GPU
	// root is the MPS root, in the fixture, which a kind node shares.
	root string
	// shares are the share IDs each pod holds, by pod.
	shares map[string]string
}

func (s *mpsScenario) dir(which string) string { return sharing.MPSDir(s.root, s.shared.UUID, which) }

func (s *mpsScenario) values(mps bool) (*release, error) {
	v, err := env.chartValues("envvar")
	if err != nil {
		return nil, err
	}
	healthRulesOnly(v)
	v["mpsRoot"] = s.root
	if mps {
		v["config"].(map[string]any)["sharing"] = map[string]any{"mps": map[string]any{
			"failRequestsGreaterThanOne": true,
			"resources": []any{map[string]any{
				"name": string(gpuResource), "replicas": mpsReplicas, "rename": string(mpsResource), "devices": []any{s.shared.UUID},
			}},
		}}
	}
	return renderValues(v)
}

func (s *mpsScenario) install(t *testing.T, ctx context.Context) {
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deletePods(ctx, mpsPods...); err != nil {
		t.Fatal(err)
	}
	s.shared = env.Profile.GPUs[0]
	s.root = filepath.Join(env.Fixture, "mps")
	r, err := s.values(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.release = r
	if _, err := waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *mpsScenario) want(shares int64) map[corev1.ResourceName]int64 {
	return map[corev1.ResourceName]int64{mpsResource: shares, gpuResource: int64(len(env.Profile.GPUs) - 1)}
}

func (s *mpsScenario) advertises(t *testing.T, ctx context.Context) {
	if err := waitResources(ctx, s.want(mpsReplicas), 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	// The daemon was told one share's limits: failRequestsGreaterThanOne.
	log, err := os.ReadFile(filepath.Join(s.dir(sharing.MPSLog), "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	threads, mib := s.share()
	for _, want := range []string{
		fmt.Sprintf("set_default_active_thread_percentage %s", threads),
		fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", mib),
	} {
		if !strings.Contains(string(log), want+"\n") {
			t.Errorf("the daemon was not told %q; it was told:\n%s", want, log)
		}
	}
}

// shmMarker is the file the stand-in daemon leaves in the /dev/shm it was
// given (the fixture switches it on), which the pods must see on theirs:
// the GPU's shm tmpfs lives in the node's mount namespace, which this
// test's may not see, so the daemon marks it.
func (s *mpsScenario) shmMarker(t *testing.T) string {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(s.dir(sharing.MPSPipe), mpsPIDFile))
	if err != nil {
		t.Fatal(err)
	}
	return "/dev/shm/mockmps." + strings.TrimSpace(string(pid))
}

// share is one share's thread percentage and pinned memory.
func (s *mpsScenario) share() (string, uint64) {
	return fmt.Sprint(100 / mpsReplicas), s.shared.MemoryMiB / mpsReplicas
}

func (s *mpsScenario) pods(t *testing.T, ctx context.Context) {
	s.shares = map[string]string{}
	threads, mib := s.share()
	marker := s.shmMarker(t)
	for _, name := range mpsPods {
		p := probePodFor(name, corev1.ResourceList{mpsResource: *resource.NewQuantity(1, resource.DecimalSI)})
		p.Spec.Containers[0].Args = []string{"-look-for=" + sharing.MPSContainerPipeDir + "/control," + marker}
		pod, err := createPod(ctx, p, true)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := probeOutput(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"NVIDIA_VISIBLE_DEVICES":            s.shared.UUID,
			"CUDA_MPS_PIPE_DIRECTORY":           sharing.MPSContainerPipeDir,
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": threads,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  fmt.Sprintf("0=%dM", mib),
		}
		for k, v := range want {
			if rep.Env[k] != v {
				t.Errorf("pod %s: %s=%q, want %q", name, k, rep.Env[k], v)
			}
		}
		for _, f := range []string{sharing.MPSContainerPipeDir + "/control", marker} {
			if !rep.Files[f] {
				t.Errorf("pod %s has no %s: the daemon's directories are not mounted, or its /dev/shm is not the daemon's", name, f)
			}
		}
		checkGPUNodes(t, rep, s.shared.Minor)
		ids := sortedKeys(allocatedDevices(pod, mpsResource))
		if len(ids) != 1 || !strings.HasPrefix(ids[0], s.shared.UUID+gpu.ReplicaSep) {
			t.Fatalf("pod %s: allocatedResourcesStatus of %s lists %v, want one share of %s", name, mpsResource, ids, s.shared.UUID)
		}
		s.shares[name] = ids[0]
		t.Logf("pod %s: share %s, %s=%s, %s=%s", name, ids[0], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", threads, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", rep.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	if s.shares[podMPS1] == s.shares[podMPS2] {
		t.Errorf("both pods hold share %s", s.shares[podMPS1])
	}
}

// daemonDies tells the stand-in to quit through its own socket, as a
// daemon that crashes leaves the plugin to find out, and waits for the
// plugin to say so and to start another.
func (s *mpsScenario) daemonDies(t *testing.T, ctx context.Context) {
	sock := filepath.Join(s.dir(sharing.MPSPipe), "control")
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, "quit")
	c.Close()
	killed := time.Now()
	var logs string
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		logs = pluginLogs(ctx)
		i := strings.LastIndex(logs, "MPS control daemon stopped answering")
		return i >= 0 && strings.Contains(logs[i:], "MPS control daemon up"), nil
	})
	if err != nil {
		t.Fatalf("no restart seen: %v%s", err, logs)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the new daemon's socket: %v", err)
	}
	if err := waitResources(ctx, s.want(mpsReplicas), time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("daemon restarted, shares offered again, %s after it died", time.Since(killed).Round(time.Millisecond))
}

// pluginRestart deletes the plugin pod. The daemon runs in the MPS
// launcher's pod, so it keeps running (the same pid) and the next plugin
// adopts it; the pods keep their shares and their containers run on,
// never restarted.
func (s *mpsScenario) pluginRestart(t *testing.T, ctx context.Context) {
	restartPluginKeepingMPS(t, ctx, s.dir(sharing.MPSPipe), mpsPods...)
	if err := waitResources(ctx, s.want(mpsReplicas), time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, name := range mpsPods {
		want := map[string]corev1.ResourceHealthStatus{s.shares[name]: "Healthy"}
		if _, err := waitPod(ctx, name, time.Minute, fmt.Sprintf("keeping %v", want), func(p *corev1.Pod) (bool, error) {
			return maps.Equal(allocatedDevices(p, mpsResource), want), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// restartPluginKeepingMPS deletes the plugin pod while pods use the MPS
// daemon whose pipe directory is pipe, and checks that the daemon kept
// running (the pid the stand-in wrote, and it answers), that the next
// plugin adopted it, and that the pods' containers were not restarted.
func restartPluginKeepingMPS(t *testing.T, ctx context.Context, pipe string, pods ...string) {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(pipe, mpsPIDFile))
	if err != nil {
		t.Fatal(err)
	}
	before, err := containerStates(ctx, pods...)
	if err != nil {
		t.Fatal(err)
	}
	old, err := waitPluginRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := k8s.kube.CoreV1().Pods(releaseNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next, err := waitPluginRunning(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	line, err := waitLog(ctx, next, "MPS control daemon up")
	if err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	if !strings.Contains(line, `"adopted":true`) {
		t.Errorf("the new plugin did not adopt the daemon the MPS launcher kept running: %s", line)
	}
	if now, err := os.ReadFile(filepath.Join(pipe, mpsPIDFile)); err != nil || string(now) != string(pid) {
		t.Errorf("the daemon's pid was %q, is %q (%v): it did not outlive the plugin pod", strings.TrimSpace(string(pid)), strings.TrimSpace(string(now)), err)
	}
	if err := askDaemon(pipe); err != nil {
		t.Errorf("the daemon does not answer after the plugin restart: %v", err)
	}
	after, err := containerStates(ctx, pods...)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(before, after) {
		t.Errorf("the MPS clients' containers changed across the plugin restart: before %v, after %v", before, after)
	}
	t.Logf("plugin pod %s replaced by %s; the MPS daemon (pid %s) adopted %s after the delete", old, next, strings.TrimSpace(string(pid)), time.Since(deleted).Round(time.Millisecond))
}

// mpsPIDFile is where the stand-in daemon writes its pid, in its pipe
// directory (mpstest/mockmps).
const mpsPIDFile = "nvidia-cuda-mps-control.pid"

// askDaemon asks the daemon on pipe what a probe asks.
func askDaemon(pipe string) error {
	c, err := net.DialTimeout("unix", filepath.Join(pipe, "control"), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, "get_default_active_thread_percentage"); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

// containerStates is each pod's containers' IDs and restart counts, by
// pod and container.
func containerStates(ctx context.Context, pods ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range pods {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			out[name+"/"+cs.Name] = fmt.Sprintf("%s restarts=%d running=%t", cs.ContainerID, cs.RestartCount, cs.State.Running != nil)
		}
	}
	return out, nil
}

func (s *mpsScenario) xid(t *testing.T, ctx context.Context) {
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	xidReachesPods(t, ctx, ctl, s.shared.Index, mpsResource, s.shares, mpsPods...)
	if err := waitResources(ctx, s.want(0), time.Minute); err != nil {
		t.Fatal(err)
	}
	// The driver then says the GPU was reset: its shares come back, and
	// the XID is not kept for the lanes after this one.
	// The plugin must see the reset before the all-clear (it polls).
	for _, c := range []struct{ cmd, seen string }{
		{fmt.Sprintf("recovery %d reset", s.shared.Index), "recovery-action=reset"},
		{fmt.Sprintf("recovery %d none", s.shared.Index), "clearing the sticky condition"},
	} {
		if err := ctl.InjectContext(ctx, c.cmd); err != nil {
			t.Fatalf("injecting %q: %v", c.cmd, err)
		}
		var logs string
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			logs = pluginLogs(ctx)
			return strings.Contains(logs, c.seen), nil
		}); err != nil {
			t.Fatalf("after %q, no %q in the plugin's log: %v%s", c.cmd, c.seen, err, logs)
		}
	}
	if err := waitResources(ctx, s.want(mpsReplicas), time.Minute); err != nil {
		t.Fatalf("after the reset: %v%s", err, pluginLogs(ctx))
	}
}

func (s *mpsScenario) turnOff(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, mpsPods...); err != nil {
		t.Fatal(err)
	}
	old, err := waitPluginRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.values(false)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.release = r
	if _, err := waitPluginRunning(ctx, old); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(s.root, s.shared.UUID))
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Fatalf("%s still there: %v%s", filepath.Join(s.root, s.shared.UUID), err, pluginLogs(ctx))
	}
}

func (s *mpsScenario) uninstall(t *testing.T, ctx context.Context) {
	uninstallClean(t, ctx, s.release)
	s.release = nil
	if err := os.RemoveAll(s.root); err != nil {
		t.Error(err)
	}
}

package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// gpuLabel is the GPU Operator's GPU node label, one of those the chart's
// default node affinity matches (values.yaml, gpuNodeSelectorTerms).
const gpuLabel = "nvidia.com/gpu.present"

// pluginSocket is the plugin's socket in the kubelet's device-plugin directory.
const pluginSocket = "nvidia.com_gpu.sock"

// nodeGPUs returns the node's nvidia.com/gpu capacity and allocatable.
func nodeGPUs(ctx context.Context) (capacity, allocatable int64, err error) {
	n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	c := n.Status.Capacity[gpuResource]
	a := n.Status.Allocatable[gpuResource]
	return c.Value(), a.Value(), nil
}

// waitAllocatable waits until the node's allocatable nvidia.com/gpu is want.
func waitAllocatable(ctx context.Context, want int64, timeout time.Duration) error {
	var c, a int64
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		c, a, err = nodeGPUs(ctx)
		return err == nil && a == want, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: allocatable nvidia.com/gpu is %d (capacity %d), want %d: %w", env.Node, a, c, want, err)
	}
	return nil
}

// prepareNode labels the node for the chart's node affinity and makes the
// test namespace, waiting for its default ServiceAccount, which pod
// admission needs.
func prepareNode(ctx context.Context) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, gpuLabel)
	if _, err := k8s.kube.CoreV1().Nodes().Patch(ctx, env.Node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s: %w", env.Node, err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}
	if _, err := k8s.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", testNamespace, err)
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := k8s.kube.CoreV1().ServiceAccounts(testNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// pluginPods lists the release's DaemonSet pods.
func pluginPods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := k8s.kube.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + releaseName + ",app.kubernetes.io/name=gpu-device-plugin",
	})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitPluginRunning waits for exactly one plugin pod, running and not
// being deleted, other than any named in old; it returns its name.
func waitPluginRunning(ctx context.Context, old ...string) (string, error) {
	var name, state string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := pluginPods(ctx)
		if err != nil {
			return false, nil
		}
		var running []string
		state = ""
		for _, p := range pods {
			state += fmt.Sprintf("%s=%s ", p.Name, p.Status.Phase)
			if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || slices.Contains(old, p.Name) {
				continue
			}
			ready := len(p.Status.ContainerStatuses) > 0
			for _, cs := range p.Status.ContainerStatuses {
				ready = ready && cs.State.Running != nil
			}
			if ready {
				running = append(running, p.Name)
			}
		}
		if len(running) == 1 && len(pods) == 1 {
			name = running[0]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("plugin pod not running (%s): %w%s", strings.TrimSpace(state), err, pluginLogs(ctx))
	}
	return name, nil
}

// waitPluginReady waits for pod's Ready condition, which the chart's
// readiness probe (gpu-device-plugin probe ready) sets once the plugin is
// registered or its slices are published, and fails if the liveness
// probe restarted its container on the way.
func waitPluginReady(ctx context.Context, pod string) error {
	var p *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if p, err = k8s.kube.CoreV1().Pods(releaseNamespace).Get(ctx, pod, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var conds []string
		if p != nil {
			for _, c := range p.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Message))
			}
		}
		return fmt.Errorf("plugin pod %s not ready (%s): %w%s", pod, strings.Join(conds, "; "), err, pluginLogs(ctx))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.RestartCount > 0 {
			return fmt.Errorf("plugin pod %s: container %s restarted %d times (liveness probe?)%s", pod, cs.Name, cs.RestartCount, pluginLogs(ctx))
		}
	}
	return nil
}

// pluginLogs is the tail of every plugin pod's log, for failure messages.
func pluginLogs(ctx context.Context) string {
	pods, _ := pluginPods(ctx)
	var b strings.Builder
	tail := int64(40)
	for _, p := range pods {
		out, err := k8s.kube.CoreV1().Pods(releaseNamespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil {
			out = []byte(err.Error())
		}
		fmt.Fprintf(&b, "\n--- %s log:\n%s", p.Name, out)
	}
	return b.String()
}

// waitRegistered waits until plugin pod logs that it registered with the
// kubelet, and returns when it did.
func waitRegistered(ctx context.Context, pod string) (time.Time, error) {
	var at time.Time
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := k8s.kube.CoreV1().Pods(releaseNamespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		for _, line := range strings.Split(string(out), "\n") {
			var e struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "registered with kubelet" {
				at = e.Time
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return at, fmt.Errorf("plugin pod %s did not register with the kubelet: %w%s", pod, err, pluginLogs(ctx))
	}
	return at, nil
}

// socketNewerThan waits until the plugin's socket exists in the device-plugin
// directory and was made after t: the plugin served again.
func socketNewerThan(ctx context.Context, t time.Time) error {
	p := filepath.Join(env.DevicePluginDir, pluginSocket)
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		fi, err := os.Stat(p)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = "made " + fi.ModTime().Format(time.RFC3339Nano)
		return fi.Mode()&fs.ModeSocket != 0 && fi.ModTime().After(t), nil
	})
	if err != nil {
		return fmt.Errorf("%s not re-created after %s (%s): %w", p, t.Format(time.RFC3339Nano), last, err)
	}
	return nil
}

// restartKubelet runs the cluster's kubelet restart command and waits
// until the node reports Ready with a heartbeat from the new kubelet.
func restartKubelet(ctx context.Context) (time.Time, error) {
	before := time.Now()
	cmd := exec.CommandContext(ctx, "sh", "-c", env.KubeletRestart)
	if out, err := cmd.CombinedOutput(); err != nil {
		return before, fmt.Errorf("restarting the kubelet (%s): %w\n%s", env.KubeletRestart, err, out)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				// Heartbeats have whole seconds, so the new kubelet's first
				// may carry the very second the restart began; the old one
				// posts only on a change or every five minutes.
				return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(before.Truncate(time.Second)), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return before, fmt.Errorf("node %s not Ready after the kubelet restarted: %w", env.Node, err)
	}
	return before, nil
}

// uninstallClean uninstalls r and checks that the node is left clean: no
// plugin pod, and, once the CDI specs the plugin keeps after uninstall are
// removed, none of its sockets or specs.
func uninstallClean(t *testing.T, ctx context.Context, r *release) {
	t.Helper()
	if err := r.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if pods, err := pluginPods(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("plugin pods left: %d (%v)", len(pods), err)
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
}

// leftovers lists the plugin sockets and the plugin's CDI specs still on
// the node.
func leftovers() ([]string, error) {
	var left []string
	for _, pattern := range []string{
		filepath.Join(env.DevicePluginDir, "*.sock"),
		filepath.Join(env.CDIDir, "gpu-device-plugin_*"),
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, err
		}
		for _, p := range m {
			if filepath.Base(p) != "kubelet.sock" {
				left = append(left, p)
			}
		}
	}
	return left, nil
}

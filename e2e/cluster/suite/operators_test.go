package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// What operators see (issue 17): Events on the pod and the Node, the
// Node's GPUHealthy condition, `list` naming the pod, and the metrics'
// pod labels. The device-plugin lane turns events, the node condition and
// metrics on.

// metricsPort is the plugin's metrics port on the node (host network).
const metricsPort = 19400

// operatorValues turns on what operators read: events, the node
// condition and metrics.
func operatorValues(v map[string]any) {
	v["events"] = map[string]any{"enabled": true}
	v["nodeCondition"] = map[string]any{"enabled": true}
	m := map[string]any{"enabled": true, "port": metricsPort, "service": map[string]any{"enabled": false}}
	// In the host's network the chart binds metrics to the Node's IP. kind's
	// node address is that IP, so kind scrapes the default; the local lane
	// scrapes at 127.0.0.1, so binds there.
	if ip := net.ParseIP(env.NodeAddress); ip != nil && ip.IsLoopback() {
		m["bindAddress"] = env.NodeAddress
	}
	v["metrics"] = m
}

// waitEvent waits for an Event about object (kind, namespace, name) with
// reason whose message contains every one of parts.
func waitEvent(ctx context.Context, kind, ns, name, reason string, parts ...string) (corev1.Event, error) {
	evNS := ns
	if kind == "Node" {
		evNS = metav1.NamespaceDefault
	}
	var found corev1.Event
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Events(evNS).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + ",reason=" + reason,
		})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range l.Items {
			seen = append(seen, e.Message)
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e.Message, p)
			}
			if ok {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return found, fmt.Errorf("no %s Event %s on %s %s/%s with %q (seen: %q): %w", reason, kind, kind, ns, name, parts, seen, err)
	}
	return found, nil
}

// waitCondition waits for the Node's condition typ to have status, and a
// message containing part.
func waitCondition(ctx context.Context, typ string, status corev1.ConditionStatus, part string) (corev1.NodeCondition, error) {
	var last corev1.NodeCondition
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if string(c.Type) == typ {
				last = c
				return c.Status == status && strings.Contains(c.Message, part), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return last, fmt.Errorf("node condition %s not %s with %q (last: %+v): %w", typ, status, part, last, err)
	}
	return last, nil
}

// scrape reads the plugin's metrics.
func scrape(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(env.NodeAddress, strconv.Itoa(metricsPort))), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metricLine is the first sample of metric whose labels include every
// one of labels (`name="value"`), or "".
func metricLine(text, metric string, labels ...string) string {
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, metric+"{") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(l, lb)
		}
		if ok {
			return l
		}
	}
	return ""
}

// listOnNode runs `gpu-device-plugin list -o json` on the node, as an
// operator would, against the fixture and the kubelet's PodResources.
func listOnNode(ctx context.Context, t *testing.T) []byte {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "gpu-device-plugin")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/gpu-device-plugin")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building gpu-device-plugin: %v\n%s", err, out)
	}
	socket := filepath.Join(filepath.Dir(env.DevicePluginDir), "pod-resources", "kubelet.sock")
	cmd := exec.CommandContext(ctx, bin, "list", "-o", "json",
		"--nvml-library="+env.nvmlLibrary(), "--sysfs-root="+filepath.Join(env.Fixture, "sys"),
		"--dev-root="+filepath.Join(env.Fixture, "dev"), "--proc-root="+env.procRoot(),
		"--node-name="+env.Node, "--pod-resources-socket="+socket)
	cmd.Env = append(os.Environ(), "MOCK_NVML_PROFILE="+env.profilePath())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("list on the node: %v\n%s", err, stderr.String())
	}
	return out
}

// operatorView checks, after XID 79 on xidGPU of pod A, everything an
// operator reads.
func (s *scenario) operatorView(t *testing.T, ctx context.Context) {
	xidGPU := s.gpusA[0]
	if _, err := waitEvent(ctx, "Pod", testNamespace, podA, "GPUUnhealthy", xidGPU, "xid=79: fallen off the bus"); err != nil {
		t.Error(err)
	}
	if _, err := waitEvent(ctx, "Node", "", env.Node, "GPUUnhealthy", xidGPU, "xid=79"); err != nil {
		t.Error(err)
	}
	// The thermal fault of the step before came and went.
	if _, err := waitEvent(ctx, "Pod", testNamespace, podA, "GPURecovered", s.gpusA[1]); err != nil {
		t.Error(err)
	}
	c, err := waitCondition(ctx, "GPUHealthy", corev1.ConditionFalse, xidGPU)
	if err != nil {
		t.Error(err)
	} else {
		t.Logf("node condition %s=%s: %s", c.Type, c.Status, c.Message)
	}

	var listing struct {
		GPUs []struct {
			UUID        string `json:"uuid"`
			AllocatedTo []struct {
				Namespace string `json:"namespace"`
				Pod       string `json:"pod"`
				Container string `json:"container"`
			} `json:"allocatedTo"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(listOnNode(ctx, t), &listing); err != nil {
		t.Fatal(err)
	}
	named := false
	for _, g := range listing.GPUs {
		if g.UUID == xidGPU {
			for _, h := range g.AllocatedTo {
				named = named || h.Namespace == testNamespace && h.Pod == podA && h.Container == "probe"
			}
		}
	}
	if !named {
		t.Errorf("list on the node does not name %s/%s as holding %s: %+v", testNamespace, podA, xidGPU, listing.GPUs)
	}

	var text, line string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		text, err = scrape(ctx)
		line = metricLine(text, "gpu_device_plugin_device_allocated", `device="`+xidGPU+`"`, `namespace="`+testNamespace+`"`, `pod="`+podA+`"`)
		return err == nil && line != "" && metricLine(text, "gpu_device_plugin_device_healthy", `device="`+xidGPU+`"`, `reason="xid=79"`) != "", nil
	})
	if err != nil {
		t.Errorf("metrics do not show %s held by %s with its reason: %v\n%s", xidGPU, podA, err, text)
	} else {
		t.Logf("metrics: %s", line)
	}
}

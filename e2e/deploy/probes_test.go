package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
)

// checkProbes: the plugin container's liveness and readiness probes run
// `gpu-device-plugin probe live|ready` on the socket serve is told to
// answer on, in an emptyDir of the pod's own (a surge pod answers for
// itself), and the plugin binary takes those commands: it exits 0 while
// the plugin says ok and 1 once it does not.
func checkProbes(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	var socket string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--health-socket="); ok {
			socket = v
		}
	}
	if socket == "" {
		t.Fatalf("%s: serve gets no --health-socket", ds.Name)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath != filepath.Dir(socket) {
			continue
		}
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		mounted = i >= 0 && spec.Volumes[i].EmptyDir != nil && !m.ReadOnly
	}
	if !mounted {
		t.Errorf("%s: %s is not a writable emptyDir of the pod's own", ds.Name, filepath.Dir(socket))
	}

	// The plugin's answers, on a socket of the test's.
	status := probe.New(nil)
	local := filepath.Join(t.TempDir(), "health.sock")
	ln, err := probe.Listen(local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- probe.Serve(ctx, ln, status.Handler()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	run := func(p *corev1.Probe) (string, error) {
		cmd := p.Exec.Command
		if cmd[0] != "/usr/bin/gpu-device-plugin" {
			t.Fatalf("probe runs %q, not the image's /usr/bin/gpu-device-plugin", cmd[0])
		}
		args := slices.Clone(cmd[1:])
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, socket, local)
		}
		x := exec.Command(plugin(t), args...)
		x.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := x.CombinedOutput()
		return string(out), err
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		what  string
	}{{"livenessProbe", c.LivenessProbe, "live"}, {"readinessProbe", c.ReadinessProbe, "ready"}} {
		if p.probe == nil || p.probe.Exec == nil {
			t.Errorf("%s: no exec %s", ds.Name, p.name)
			continue
		}
		if got := p.probe.Exec.Command; len(got) < 3 || got[1] != "probe" || got[2] != p.what {
			t.Errorf("%s: %s runs %q, want probe %s", ds.Name, p.name, got, p.what)
			continue
		}
		if out, err := run(p.probe); err != nil || strings.TrimSpace(out) != "ok" {
			t.Errorf("%s: %s on a plugin that is ok: %v\n%s", ds.Name, p.name, err, out)
		}
	}
	status.Gate("nvidia.com/gpu", "not yet registered with the kubelet")
	out, err := run(c.ReadinessProbe)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out, "not yet registered") {
		t.Errorf("%s: readinessProbe on a plugin not registered: %v, want exit 1 saying why\n%s", ds.Name, err, out)
	}
}

// health.enabled: false drops the probes, the socket and its volume.
func TestHelmProbesOff(t *testing.T) {
	objs := renderWith(t, chartutil.Values{"health": map[string]any{"enabled": false}})
	ds := objs.DaemonSets[0]
	c := ds.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Error("probes rendered with health.enabled: false")
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--health-socket") {
			t.Errorf("serve gets %s with health.enabled: false", a)
		}
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "probe" {
			t.Error("the probe volume is rendered with health.enabled: false")
		}
	}
}

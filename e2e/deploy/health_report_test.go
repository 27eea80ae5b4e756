package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// withHealth is vals with events and nodeCondition set.
func withHealth(vals chartutil.Values, events, nodeCondition bool) chartutil.Values {
	out := chartutil.Values{"events": map[string]any{"enabled": events}, "nodeCondition": map[string]any{"enabled": nodeCondition}}
	for k, v := range vals {
		out[k] = v
	}
	return out
}

// wantHealthRules is the RBAC of events and nodeCondition, exactly:
// adding a verb, a resource or a rule fails the tests, on purpose. Both
// read the Node (the Events' involvedObject UID; the condition's current
// state); only the condition writes nodes/status. No pods get: it would
// let one node's token read every pod of the cluster; Events on pods take
// the pod's UID from the kubelet. The plugin writes core/v1 Events, so no
// events.k8s.io.
func wantHealthRules(events, nodeCondition bool) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}
	if events {
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}})
	}
	if nodeCondition {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}})
	}
	return rules
}

// The Go side's names for the settings the chart and the node package set:
// a rename there must show here.
func TestHelmHealthReportingSettingNames(t *testing.T) {
	want := map[string]string{ // key: flag
		"events":             "events",
		"nodeCondition":      "node-condition",
		"nodeName":           "node-name",
		"kubeconfig":         "kubeconfig",
		"podResourcesSocket": "pod-resources-socket",
	}
	got := map[string]config.Setting{}
	for _, s := range config.Settings() {
		got[s.Key] = s
	}
	for key, flag := range want {
		s, ok := got[key]
		if !ok {
			t.Errorf("config.Settings has no key %s (flag --%s): the Go side does not read it (yet)", key, flag)
			continue
		}
		if s.Flag != flag || s.Env != config.EnvName(flag) {
			t.Errorf("setting %s is --%s / %s, the chart and packaging/gpu-device-plugin.env use --%s / %s", key, s.Flag, s.Env, flag, config.EnvName(flag))
		}
	}
}

// With events and/or nodeCondition on, in either kubeletAPI mode, the pod
// gets a ServiceAccount with its token, its node's name from the downward
// API, the flags, and a ClusterRole of exactly what the feature needs,
// beside DRA mode's own.
func TestHelmHealthReporting(t *testing.T) {
	for _, mode := range []string{"device-plugin", "dra"} {
		for _, on := range []struct{ events, nodeCondition bool }{{true, false}, {false, true}, {true, true}} {
			name := fmt.Sprintf("kubeletAPI=%s events=%v nodeCondition=%v", mode, on.events, on.nodeCondition)
			t.Run(name, func(t *testing.T) {
				vals := withHealth(chartutil.Values{"kubeletAPI": mode}, on.events, on.nodeCondition)
				objs, notes := renderNotes(t, vals)
				if errs := objs.validate(); len(errs) > 0 {
					t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
				}
				roles := map[string][]rbacv1.PolicyRule{"gpu-device-plugin-health": wantHealthRules(on.events, on.nodeCondition)}
				want := wantDaemonSet{
					namespace: releaseNamespace, hostDriverRoot: "/", devicePluginDir: "/var/lib/kubelet/device-plugins", cdiSpecDir: "/var/run/cdi",
					cdiHookDir: defaultCDIHookDir, stateDir: "/var/lib/gpu-device-plugin/state", podResourcesDir: defaultPodResourcesDir,
					privileged: true, image: defaultImage, maxUnavailable: intstr.FromInt32(1),
					serviceAccount: "gpu-device-plugin",
				}
				if mode == "dra" {
					roles["gpu-device-plugin"] = wantDRARules
					want = defaultDRADaemonSet()
				}
				checkRBAC(t, objs, releaseNamespace, "gpu-device-plugin", roles)
				ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
				checkDaemonSet(t, ds, cm, want)
				checkHealthPod(t, ds.Spec.Template.Spec, mode == "dra", on.events, on.nodeCondition)

				for _, n := range []struct {
					on   bool
					text string
				}{{on.events, "reason=GPUUnhealthy"}, {on.nodeCondition, `@.type=="GPUHealthy"`}} {
					if strings.Contains(notes, n.text) != n.on {
						t.Errorf("NOTES.txt says %q: %v, want %v:\n%s", n.text, !n.on, n.on, notes)
					}
				}
				// Last: it fails while the Go side lacks the flags.
				t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
			})
		}
	}
}

// checkHealthPod pins what events and nodeCondition add to the pod: the
// token, GPU_DEVICE_PLUGIN_NODE_NAME from the downward API (once), the
// flags of what is on and none of what is off, and the in-cluster account
// (no --kubeconfig). The pod UID stays DRA mode's.
func checkHealthPod(t *testing.T, spec corev1.PodSpec, dra, events, nodeCondition bool) {
	t.Helper()
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken || spec.ServiceAccountName == "" {
		t.Errorf("automountServiceAccountToken %v, serviceAccountName %q: want the token of the chart's ServiceAccount", spec.AutomountServiceAccountToken, spec.ServiceAccountName)
	}
	c := spec.Containers[0]
	var nodeName, podUID []corev1.EnvVar
	for _, e := range c.Env {
		switch e.Name {
		case "GPU_DEVICE_PLUGIN_NODE_NAME":
			nodeName = append(nodeName, e)
		case "GPU_DEVICE_PLUGIN_POD_UID":
			podUID = append(podUID, e)
		}
	}
	if len(nodeName) != 1 || nodeName[0].ValueFrom == nil || nodeName[0].ValueFrom.FieldRef == nil || nodeName[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("GPU_DEVICE_PLUGIN_NODE_NAME is %+v, want it once, from the downward API's spec.nodeName", nodeName)
	}
	if (len(podUID) == 1) != dra {
		t.Errorf("GPU_DEVICE_PLUGIN_POD_UID set %d times, want it only in DRA mode", len(podUID))
	}
	for _, f := range []struct {
		arg string
		on  bool
	}{{"--events=true", events}, {"--node-condition=true", nodeCondition}} {
		name := strings.SplitN(strings.TrimPrefix(f.arg, "--"), "=", 2)[0]
		n := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--"+name+"=") || a == "--"+name })
		switch {
		case f.on && !hasArg(c.Args, f.arg):
			t.Errorf("no %s in args %q", f.arg, c.Args)
		case !f.on && n >= 0:
			t.Errorf("%s in args with it off", c.Args[n])
		}
	}
	if v, ok := flagValue(c.Args, "kubeconfig"); ok {
		t.Errorf("--kubeconfig=%s: the pod uses its ServiceAccount", v)
	}
}

// Set in config, events or nodeCondition would turn reporting on without
// the ServiceAccount and RBAC the chart adds for the chart values: refused
// with the value to use, in either mode, on or off.
func TestHelmHealthReportingRefusesConfigKeys(t *testing.T) {
	for _, mode := range []string{"device-plugin", "dra"} {
		for _, key := range []string{"events", "nodeCondition"} {
			for _, v := range []any{true, "true", false} {
				vals := chartutil.Values{"kubeletAPI": mode, "config": map[string]any{key: v}}
				_, err := renderValues(t, loadChart(t), vals)
				if err == nil || !strings.Contains(err.Error(), "config."+key) || !strings.Contains(err.Error(), key+".enabled") {
					t.Errorf("rendering with %v: %v, want an error naming config.%s and %s.enabled", vals, err, key, key)
				}
			}
		}
	}
}

// The kubelet's PodResources directory is mounted in both modes by default,
// at the Go side's default path, and not at all with podResources.enabled:
// false; a relative hostDir is refused.
func TestHelmPodResources(t *testing.T) {
	for _, mode := range []string{"device-plugin", "dra"} {
		t.Run(mode, func(t *testing.T) {
			podOf := func(vals chartutil.Values) (corev1.Container, map[string]corev1.Volume, objects) {
				t.Helper()
				vals["kubeletAPI"] = mode
				objs := renderWith(t, vals)
				if errs := objs.validate(); len(errs) > 0 {
					t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
				}
				spec := objs.DaemonSets[0].Spec.Template.Spec
				volumes := map[string]corev1.Volume{}
				for _, v := range spec.Volumes {
					volumes[v.Name] = v
				}
				return spec.Containers[0], volumes, objs
			}

			c, volumes, _ := podOf(chartutil.Values{})
			checkPodResourcesMount(t, c, volumes, defaultPodResourcesDir)
			if v, _ := flagValue(c.Args, "pod-resources-socket"); v != config.DefaultPodResourcesSocket {
				t.Errorf("--pod-resources-socket=%s, want the plugin's default %s, which `list` run in the pod uses", v, config.DefaultPodResourcesSocket)
			}

			c, volumes, _ = podOf(chartutil.Values{"podResources": map[string]any{"enabled": true, "hostDir": "/var/lib/k0s/kubelet/pod-resources/"}})
			checkPodResourcesMount(t, c, volumes, "/var/lib/k0s/kubelet/pod-resources")

			c, volumes, objs := podOf(chartutil.Values{"podResources": map[string]any{"enabled": false}})
			checkPodResourcesMount(t, c, volumes, "")
			if _, ok := volumes["pod-resources"]; ok {
				t.Error("volume pod-resources with podResources.enabled: false")
			}
			if mode == "device-plugin" && len(objs.ServiceAccounts)+len(objs.ClusterRoles) != 0 {
				t.Error("podResources.enabled: false adds API access")
			}

			_, err := renderValues(t, loadChart(t), chartutil.Values{"kubeletAPI": mode, "podResources": map[string]any{"enabled": true, "hostDir": "var/lib/kubelet/pod-resources"}})
			if err == nil || !strings.Contains(err.Error(), "podResources.hostDir") || !strings.Contains(err.Error(), "absolute") {
				t.Errorf("rendering with a relative podResources.hostDir: %v, want an error naming podResources.hostDir", err)
			}
		})
	}
}

// The node package documents events and nodeCondition with the kubelet's
// credentials; uncommented, the plugin accepts them; its unit leaves the
// PodResources socket and the API server reachable.
func TestPackagingHealthReporting(t *testing.T) {
	env := string(mustRead(t, repoPath(t, "packaging", "gpu-device-plugin.env")))
	vars := []string{"GPU_DEVICE_PLUGIN_EVENTS=true", "GPU_DEVICE_PLUGIN_NODE_CONDITION=true", "GPU_DEVICE_PLUGIN_KUBECONFIG=/etc/kubernetes/kubelet.conf"}
	for _, want := range vars {
		if !strings.Contains(env, "#   "+want+"\n") {
			t.Errorf("packaging/gpu-device-plugin.env does not document %s", want)
		}
	}
	t.Run("accepted by the plugin", func(t *testing.T) {
		version := func(env ...string) ([]byte, error) {
			cmd := exec.Command(plugin(t), "version", "--config="+repoPath(t, "packaging", "config.yaml"))
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
			return cmd.CombinedOutput()
		}
		if out, err := version(vars...); err != nil {
			t.Errorf("gpu-device-plugin version with %q: %v\n%s", vars, err, out)
		}
		// Set wrongly, each is refused: the plugin does read it.
		for _, bad := range []string{"GPU_DEVICE_PLUGIN_EVENTS=maybe", "GPU_DEVICE_PLUGIN_NODE_CONDITION=maybe"} {
			if out, err := version(bad); err == nil {
				t.Errorf("%s was accepted: the variable is not read\n%s", bad, out)
			}
		}
	})

	// ProtectSystem=strict leaves /var/lib/kubelet readable, and connecting
	// to a socket on a read-only mount works; only hiding the directory, or
	// AF_UNIX, would cut the plugin off.
	unit := string(mustRead(t, repoPath(t, "packaging", "gpu-device-plugin.service")))
	dir := filepath.Dir(config.DefaultPodResourcesSocket)
	for _, line := range strings.Split(unit, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || (k != "InaccessiblePaths" && k != "TemporaryFileSystem" && k != "BindPaths" && k != "BindReadOnlyPaths") {
			continue
		}
		for _, p := range strings.Fields(v) {
			p = strings.SplitN(strings.TrimLeft(p, "-+"), ":", 2)[0]
			if dir == p || strings.HasPrefix(dir, p+"/") {
				t.Errorf("the unit's %s hides %s, where the kubelet's PodResources socket is", line, dir)
			}
		}
	}
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(line, "RestrictAddressFamilies="); ok {
			for _, fam := range []string{"AF_UNIX", "AF_INET", "AF_INET6"} {
				if !slices.Contains(strings.Fields(v), fam) {
					t.Errorf("the unit's RestrictAddressFamilies= lacks %s: the PodResources socket and the API server need AF_UNIX and AF_INET/AF_INET6", fam)
				}
			}
		}
	}
}

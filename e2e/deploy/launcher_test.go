package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// launcherComponent labels the MPS launcher's DaemonSet and pods.
const launcherComponent = "mps-launcher"

// The MPS launcher runs beside the plugin on the same nodes, with the same
// driver root, /dev and mpsRoot at the same paths, in the host's PID
// namespace, without API access, updated only when its pod is deleted; the
// plugin is told its socket, and neither DaemonSet's selector takes the
// other's pods. The static manifests hold what the chart renders.
func TestMPSLauncher(t *testing.T) {
	chart, _ := render(t, "")
	for _, tc := range []struct {
		name    string
		objs    objects
		static  objects
		enabled bool
	}{
		{"device-plugin mode", chart, readManifest(t), true},
		{"DRA mode", renderWith(t, draValues(nil)), readDRAManifest(t), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, o := range []struct {
				what string
				objs objects
			}{{"chart", tc.objs}, {"manifest", tc.static}} {
				t.Run(o.what, func(t *testing.T) {
					if len(o.objs.Launchers) != 1 || len(o.objs.DaemonSets) != 1 {
						t.Fatalf("%d launcher and %d plugin DaemonSets, want one each", len(o.objs.Launchers), len(o.objs.DaemonSets))
					}
					checkLauncher(t, o.objs.Launchers[0], o.objs.DaemonSets[0])
				})
			}
			got, want := tc.objs.Launchers[0], tc.static.Launchers[0]
			if got.Name != want.Name || !apiequality.Semantic.DeepEqual(got.Spec.Selector, want.Spec.Selector) ||
				!apiequality.Semantic.DeepEqual(got.Spec.UpdateStrategy, want.Spec.UpdateStrategy) ||
				!apiequality.Semantic.DeepEqual(got.Spec.Template.Labels, want.Spec.Template.Labels) {
				t.Errorf("launcher DaemonSet %s %v %v %v, manifest has %s %v %v %v", got.Name, got.Spec.Selector, got.Spec.UpdateStrategy, got.Spec.Template.Labels,
					want.Name, want.Spec.Selector, want.Spec.UpdateStrategy, want.Spec.Template.Labels)
			}
			if a, b := got.Spec.Template.Spec, want.Spec.Template.Spec; !apiequality.Semantic.DeepEqual(a, b) {
				x, _ := yaml.Marshal(a)
				y, _ := yaml.Marshal(b)
				t.Errorf("launcher pod spec differs from the manifest's\nchart:\n%s\nmanifest:\n%s", x, y)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		objs := renderWith(t, map[string]any{"mpsLauncher": map[string]any{"enabled": false}})
		if len(objs.Launchers) != 0 {
			t.Errorf("mpsLauncher.enabled false renders %d launchers", len(objs.Launchers))
		}
		if v, ok := flagValue(objs.DaemonSets[0].Spec.Template.Spec.Containers[0].Args, "mps-launcher-socket"); ok {
			t.Errorf("the plugin is told a launcher socket, %s, with no launcher", v)
		}
	})
	t.Run("a long release name", func(t *testing.T) {
		objs := renderWith(t, map[string]any{"fullnameOverride": "gpu-device-plugin-of-the-research-cluster-in-building-seven-x"})
		if name := objs.Launchers[0].Name; len(validation.IsDNS1123Subdomain(name)) > 0 || len(name) > 63 {
			t.Errorf("launcher DaemonSet name %q is not a valid DaemonSet name", name)
		}
	})
}

// checkLauncher pins what the launcher must be beside the plugin's
// DaemonSet ds.
func checkLauncher(t *testing.T, l, ds *appsv1.DaemonSet) {
	t.Helper()
	spec, plugin := l.Spec.Template.Spec, ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("not in the host's PID namespace, which the MPS server needs")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.ServiceAccountName != "" {
		t.Error("the launcher gets an API token; it talks to nothing")
	}
	if l.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("updateStrategy %s: an upgrade would end every MPS client; want OnDelete", l.Spec.UpdateStrategy.Type)
	}
	if !apiequality.Semantic.DeepEqual(spec.NodeSelector, plugin.NodeSelector) || !apiequality.Semantic.DeepEqual(spec.Tolerations, plugin.Tolerations) ||
		!apiequality.Semantic.DeepEqual(spec.Affinity, plugin.Affinity) {
		t.Error("the launcher is not scheduled where the plugin is (nodeSelector, tolerations, affinity)")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c, pc := spec.Containers[0], plugin.Containers[0]
	if c.Image != pc.Image {
		t.Errorf("image %s, the plugin's is %s", c.Image, pc.Image)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("not privileged: it mounts and chroots")
	}
	if len(c.Args) == 0 || c.Args[0] != "mps-launcher" {
		t.Errorf("args %q, want mps-launcher first", c.Args)
	}
	sock, _ := flagValue(c.Args, "mps-launcher-socket")
	if psock, _ := flagValue(pc.Args, "mps-launcher-socket"); sock == "" || sock != psock {
		t.Errorf("the launcher listens on %q, the plugin asks %q", sock, psock)
	}
	for _, flag := range []string{"mps-root", "driver-root", "dev-root"} {
		v, _ := flagValue(c.Args, flag)
		if pv, _ := flagValue(pc.Args, flag); v == "" || v != pv {
			t.Errorf("--%s %q, the plugin's %q", flag, v, pv)
		}
	}
	// The same host paths at the same container paths.
	mounts := func(s corev1.PodSpec, c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			for _, v := range s.Volumes {
				if v.Name == m.Name && v.HostPath != nil {
					out[m.MountPath] = v.HostPath.Path
				}
			}
		}
		return out
	}
	lm, pm := mounts(spec, c), mounts(plugin, pc)
	mpsRoot, _ := flagValue(c.Args, "mps-root")
	for _, at := range []string{"/dev", "/driver-root", mpsRoot} {
		if lm[at] == "" || lm[at] != pm[at] {
			t.Errorf("%s is host path %q in the launcher, %q in the plugin", at, lm[at], pm[at])
		}
	}
	// Neither DaemonSet takes the other's pods, nor does anything that
	// selects the plugin's pods.
	for _, p := range []struct {
		what string
		sel  *appsv1.DaemonSet
		pod  map[string]string
	}{{"the plugin's DaemonSet, the launcher's pods", ds, l.Spec.Template.Labels}, {"the launcher's DaemonSet, the plugin's pods", l, ds.Spec.Template.Labels}} {
		sel := labels.SelectorFromSet(p.sel.Spec.Selector.MatchLabels)
		if sel.Matches(labels.Set(p.pod)) {
			t.Errorf("%s: selected", p.what)
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/driver-root" && m.ReadOnly }) {
		t.Error("the driver root is not read-only")
	}
}

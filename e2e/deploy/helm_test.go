package deploy

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	releaseName      = "gpu-device-plugin"
	releaseNamespace = "kube-system"
)

func chartDir(t *testing.T) string { return repoPath(t, "deploy", "helm", "gpu-device-plugin") }

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readValues(t *testing.T, file string) chartutil.Values {
	t.Helper()
	if file == "" {
		return chartutil.Values{}
	}
	v, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// render renders the chart as `helm template gpu-device-plugin -n
// kube-system [-f values]` would, in strict mode (a missing value is an
// error), and decodes the result strictly.
func render(t *testing.T, valuesFile string) (objects, string) {
	t.Helper()
	c := loadChart(t)
	out, err := renderValues(t, c, readValues(t, valuesFile))
	if err != nil {
		t.Fatalf("rendering the chart with %q: %v", valuesFile, err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var stream strings.Builder
	for _, name := range names {
		stream.WriteString("---\n# Source: " + name + "\n" + out[name] + "\n")
	}
	objs, err := decodeStrict("chart with "+valuesFile, []byte(stream.String()))
	if err != nil {
		t.Fatal(err)
	}
	return objs, out[filepath.Join(c.Name(), "templates", "NOTES.txt")]
}

// renderValues renders the chart's templates with vals over its defaults,
// and with the image a user must name (withUserImage).
func renderValues(t *testing.T, c *chart.Chart, vals chartutil.Values) (map[string]string, error) {
	t.Helper()
	return renderAsGiven(t, c, withUserImage(vals))
}

// withUserImage is vals with image.repository set to the placeholder the
// static manifests carry, unless vals names one: the chart refuses its own
// default, since no image is published yet.
func withUserImage(vals chartutil.Values) chartutil.Values {
	img, _ := vals["image"].(map[string]any)
	if _, ok := img["repository"]; ok {
		return vals
	}
	out := chartutil.Values{}
	for k, v := range vals {
		out[k] = v
	}
	withRepo := map[string]any{"repository": defaultImage}
	for k, v := range img {
		withRepo[k] = v
	}
	out["image"] = withRepo
	return out
}

// kubeVersion is the Kubernetes the chart is rendered for, as helm
// install sees the API server's: the version this module's k8s.io modules
// are (Helm's own default, 1.20, is older than anything the chart runs on).
var kubeVersion = chartutil.KubeVersion{Version: "v1.37.0", Major: "1", Minor: "37"}

// renderAsGiven renders the chart's templates with exactly vals over its
// defaults, for kubeVersion.
func renderAsGiven(t *testing.T, c *chart.Chart, vals chartutil.Values) (map[string]string, error) {
	t.Helper()
	return renderFor(t, c, vals, kubeVersion)
}

// monitoringAPIs are the Prometheus Operator's kinds the chart renders
// (metrics.serviceMonitor, metrics.prometheusRule), as helm install finds
// them on a cluster with the operator's CRDs, and helm template with
// --api-versions. The chart refuses those values without them.
var monitoringAPIs = []string{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule"}

// renderFor renders the chart's templates with exactly vals over its
// defaults, for a cluster of version kv with the Prometheus Operator's
// CRDs.
func renderFor(t *testing.T, c *chart.Chart, vals chartutil.Values, kv chartutil.KubeVersion) (map[string]string, error) {
	t.Helper()
	return renderOn(t, c, vals, kv, monitoringAPIs)
}

// renderOn renders the chart's templates with exactly vals over its
// defaults, for a cluster of version kv that serves Kubernetes' own APIs
// and extra ("group/version" and "group/version/Kind").
func renderOn(t *testing.T, c *chart.Chart, vals chartutil.Values, kv chartutil.KubeVersion, extra []string) (map[string]string, error) {
	t.Helper()
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kv
	caps.APIVersions = append(slices.Clone(caps.APIVersions), extra...)
	rv, err := chartutil.ToRenderValues(c, vals,
		chartutil.ReleaseOptions{Name: releaseName, Namespace: releaseNamespace, Revision: 1, IsInstall: true},
		caps)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Engine{Strict: true}.Render(c, rv)
}

// The hook's host directory is mounted at the same path in the pod and
// named in the CDI spec: a relative one is refused with a message.
func TestHelmCDIHookDirMustBeAbsolute(t *testing.T) {
	_, err := renderValues(t, loadChart(t), chartutil.Values{"cdiHook": map[string]any{"hostDir": "var/lib/gpu-device-plugin/bin"}})
	if err == nil || !strings.Contains(err.Error(), "cdiHook.hostDir") || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("rendering with a relative cdiHook.hostDir: %v, want an error naming cdiHook.hostDir", err)
	}
}

// No image is published yet: an install that keeps values.yaml's
// repository, or empties it, stops with a message that says what to do,
// instead of pods that never pull.
func TestHelmRefusesUnpublishedImage(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals chartutil.Values
	}{
		{"values.yaml's", chartutil.Values{}},
		{"values.yaml's, named", chartutil.Values{"image": map[string]any{"repository": unpublishedImage, "tag": "v0.1.0"}}},
		{"empty", chartutil.Values{"image": map[string]any{"repository": ""}}},
		{"values.yaml's, DRA mode", chartutil.Values{"kubeletAPI": "dra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderAsGiven(t, loadChart(t), tc.vals)
			if err == nil {
				t.Fatal("the chart rendered without an image of the user's")
			}
			for _, want := range []string{"image.repository", "no gpu-device-plugin image is published yet", "make push IMAGE=", "set image.repository and image.tag"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	// What the user sets is used as given.
	out, err := renderAsGiven(t, loadChart(t), chartutil.Values{"image": map[string]any{"repository": "registry.example.com/team/gpu-device-plugin", "tag": "v1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	if ds := out["gpu-device-plugin/templates/daemonset.yaml"]; strings.Count(ds, "image: registry.example.com/team/gpu-device-plugin:v1.2.3") != 2 {
		t.Errorf("the DaemonSet does not run the image set, in both containers:\n%s", ds)
	}
}

func TestHelmLint(t *testing.T) {
	// helm lint renders for a cluster with Kubernetes' own APIs only, so
	// the ServiceMonitor and PrometheusRule of values-all.yaml would stop
	// it (TestHelmMonitoring renders them); its dashboard stays.
	all := withoutMonitoringCRDs(readValues(t, filepath.Join("testdata", "values-all.yaml")))
	allDRA := withoutMonitoringCRDs(readValues(t, filepath.Join("testdata", "values-all.yaml")))
	allDRA["kubeletAPI"] = "dra"
	for _, tc := range []struct {
		name string
		vals chartutil.Values
	}{
		{"defaults", readValues(t, "")},
		{"values-all.yaml", all},
		{"kubeletAPI=dra with NIC pools", draValues(nicPoolValues(t))},
		{"values-all.yaml with kubeletAPI=dra", allDRA},
		{"events", chartutil.Values{"events": map[string]any{"enabled": true}}},
		{"nodeCondition with NIC pools", withHealth(nicPoolValues(t), false, true)},
		{"events and nodeCondition, kubeletAPI=dra", draValues(withHealth(nil, true, true))},
		{"podResources off", chartutil.Values{"podResources": map[string]any{"enabled": false}}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkLint(t, tc.vals) })
	}
}

// checkLint runs helm lint with vals (and the image a user must name).
func checkLint(t *testing.T, vals chartutil.Values) {
	t.Helper()
	l := lint.AllWithKubeVersion(chartDir(t), withUserImage(vals), releaseNamespace, &kubeVersion)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		} else {
			t.Logf("helm lint: %s", m)
		}
	}
}

// With its defaults, the chart renders what the static manifest holds:
// the same DaemonSet spec and the same config, give or take Helm's own
// labels and the config checksum.
func TestHelmDefaultsMatchManifest(t *testing.T) {
	objs, notes := render(t, "")
	// helm uninstall leaves the CDI specs; NOTES.txt says how to remove them.
	if !strings.Contains(notes, "rm -f /var/run/cdi/gpu-device-plugin_*.json") {
		t.Errorf("NOTES.txt does not say how to remove the CDI specs after helm uninstall:\n%s", notes)
	}
	if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 || len(objs.Services) != 0 {
		t.Fatalf("want one ConfigMap and one DaemonSet, got %d ConfigMaps, %d DaemonSets, %d Services",
			len(objs.ConfigMaps), len(objs.DaemonSets), len(objs.Services))
	}
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	static := readManifest(t)
	ds, want := objs.DaemonSets[0], static.DaemonSets[0]

	if ds.Name != want.Name || ds.Namespace != want.Namespace {
		t.Errorf("DaemonSet %s/%s, manifest has %s/%s", ds.Namespace, ds.Name, want.Namespace, want.Name)
	}
	for k, v := range want.Labels {
		if ds.Labels[k] != v {
			t.Errorf("DaemonSet label %s=%q, manifest has %q", k, ds.Labels[k], v)
		}
	}
	if !apiequality.Semantic.DeepEqual(ds.Spec.Selector, want.Spec.Selector) {
		t.Errorf("selector %v, manifest has %v", ds.Spec.Selector, want.Spec.Selector)
	}
	if !apiequality.Semantic.DeepEqual(ds.Spec.UpdateStrategy, want.Spec.UpdateStrategy) {
		t.Errorf("updateStrategy %+v, manifest has %+v", ds.Spec.UpdateStrategy, want.Spec.UpdateStrategy)
	}
	if !apiequality.Semantic.DeepEqual(ds.Spec.Template.Labels, want.Spec.Template.Labels) {
		t.Errorf("pod labels %v, manifest has %v", ds.Spec.Template.Labels, want.Spec.Template.Labels)
	}
	if ds.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a config change would not roll the pods")
	}
	if got, exp := ds.Spec.Template.Spec, want.Spec.Template.Spec; !apiequality.Semantic.DeepEqual(got, exp) {
		a, _ := yaml.Marshal(got)
		b, _ := yaml.Marshal(exp)
		t.Errorf("pod spec differs from the manifest's\nchart:\n%s\nmanifest:\n%s", a, b)
	}

	cm, wantCM := objs.ConfigMaps[0], static.ConfigMaps[0]
	if cm.Name != wantCM.Name || cm.Namespace != wantCM.Namespace {
		t.Errorf("ConfigMap %s/%s, manifest has %s/%s", cm.Namespace, cm.Name, wantCM.Namespace, wantCM.Name)
	}
	var got, exp map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &got); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(wantCM.Data["config.yaml"]), &exp); err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(got, exp) {
		t.Errorf("config.yaml %v, manifest has %v", got, exp)
	}

	checkDaemonSet(t, ds, cm, wantDaemonSet{
		namespace: releaseNamespace, hostDriverRoot: "/", devicePluginDir: "/var/lib/kubelet/device-plugins", cdiSpecDir: "/var/run/cdi",
		cdiHookDir: defaultCDIHookDir, stateDir: "/var/lib/gpu-device-plugin/state", podResourcesDir: defaultPodResourcesDir,
		privileged: true, image: defaultImage, maxUnavailable: intstr.FromInt32(1),
	})
	checkAcceptedByPlugin(t, ds, cm)
}

// Every option reaches the object it is for.
func TestHelmEveryOption(t *testing.T) {
	objs, notes := render(t, filepath.Join("testdata", "values-all.yaml"))
	if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 || len(objs.Services) != 1 {
		t.Fatalf("want a ConfigMap, a DaemonSet and the metrics Service, got %d, %d, %d",
			len(objs.ConfigMaps), len(objs.DaemonSets), len(objs.Services))
	}
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	ds, cm, svc := objs.DaemonSets[0], objs.ConfigMaps[0], objs.Services[0]
	checkDaemonSet(t, ds, cm, wantDaemonSet{
		namespace: releaseNamespace, hostDriverRoot: "/run/nvidia/driver",
		devicePluginDir: "/var/lib/k0s/kubelet/device-plugins", cdiSpecDir: "/etc/cdi",
		cdiHookDir:      "/opt/gpu-device-plugin/bin", // values-all.yaml's, cleaned
		stateDir:        "/opt/gpu-device-plugin/state",
		mpsRoot:         "/run/gpu/mps",
		podResourcesDir: "/var/lib/k0s/kubelet/pod-resources", // values-all.yaml's, cleaned
		serviceAccount:  "gpu-plugin-all",                     // events and nodeCondition are on
		image:           "registry.example.com/gpu/gpu-device-plugin", maxUnavailable: intstr.FromString("10%"),
		ownAffinity: true,
	})
	// A subtest: the checks below run even while the Go side lacks a flag.
	t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
	t.Run("init container installs the hook", func(t *testing.T) { checkInstallsHook(t, ds) })

	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	check := func(what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: not rendered as set", what)
		}
	}
	check("fullnameOverride", ds.Name == "gpu-plugin-all" && cm.Name == "gpu-plugin-all" && svc.Name == "gpu-plugin-all-metrics")
	check("nameOverride", ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] == "gpuplugin")
	check("image", c.Image == "registry.example.com/gpu/gpu-device-plugin:v9.9.9" && c.ImagePullPolicy == corev1.PullAlways)
	check("imagePullSecrets", len(spec.ImagePullSecrets) == 1 && spec.ImagePullSecrets[0].Name == "regcred")

	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	check("config", cfg["deviceIDStrategy"] == "index" && cfg["logLevel"] == "debug" && cfg["healthPollInterval"] == "2s")
	check("deviceListStrategy", strings.Join(toStrings(cfg["deviceListStrategy"]), ",") == "envvar,cdi-cri")

	check("metrics flag", hasArg(c.Args, "--metrics-address=[fd00::5]:9500"))
	check("metrics port", len(c.Ports) == 1 && c.Ports[0].Name == "metrics" && c.Ports[0].ContainerPort == 9500)
	check("metrics service", len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Port == 9500 &&
		svc.Spec.Ports[0].TargetPort == intstr.FromString("metrics") && svc.Annotations["prometheus.io/scrape"] == "true")
	for k, v := range svc.Spec.Selector {
		check("metrics service selects the pods ("+k+")", ds.Spec.Template.Labels[k] == v)
	}

	check("nodeSelector", spec.NodeSelector["node-role.kubernetes.io/gpu"] == "" && len(spec.NodeSelector) == 2)
	// gpuNodeSelectorTerms is the required node affinity; affinity's
	// preferred one is kept beside it.
	na := spec.Affinity.NodeAffinity
	check("gpuNodeSelectorTerms", na != nil && na.RequiredDuringSchedulingIgnoredDuringExecution != nil &&
		toYAML(t, na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) ==
			toYAML(t, []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "example.com/accelerator", Operator: corev1.NodeSelectorOpIn, Values: []string{"nvidia"}}}}}))
	check("affinity", na != nil && len(na.PreferredDuringSchedulingIgnoredDuringExecution) == 1)
	check("affinity of the MPS launcher", len(objs.Launchers) == 1 && toYAML(t, objs.Launchers[0].Spec.Template.Spec.Affinity) == toYAML(t, spec.Affinity))
	check("tolerations", tolerates(spec.Tolerations, corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoExecute}))
	check("updateStrategy", ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String() == "10%")
	check("resources", c.Resources.Requests.Cpu().Cmp(resource.MustParse("50m")) == 0 && c.Resources.Limits.Memory().Cmp(resource.MustParse("256Mi")) == 0)
	sc := c.SecurityContext
	check("securityContext", sc.Privileged != nil && !*sc.Privileged && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation &&
		sc.Capabilities != nil && len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL")
	isc := spec.InitContainers[0].SecurityContext
	check("cdiHook.securityContext", isc.Privileged == nil && isc.AllowPrivilegeEscalation != nil && !*isc.AllowPrivilegeEscalation &&
		isc.Capabilities != nil && len(isc.Capabilities.Drop) == 1)
	check("runtimeClassName", spec.RuntimeClassName != nil && *spec.RuntimeClassName == "nvidia")
	check("extraArgs", hasArg(c.Args, "--nvml-retry-interval=10s"))
	check("env", envValue(c.Env, "NVIDIA_VISIBLE_DEVICES") == "all" && envValue(c.Env, "GPU_DEVICE_PLUGIN_THERMAL_MARGIN") == "7")
	check("extraVolumes", hasVolume(spec.Volumes, "plugins-registry"))
	check("extraVolumeMounts", hasMount(c.VolumeMounts, "/var/lib/kubelet/plugins_registry"))
	check("hostNetwork", spec.HostNetwork && spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet)
	check("podAnnotations", ds.Spec.Template.Annotations["example.com/team"] == "ml-platform")
	check("podLabels", ds.Spec.Template.Labels["example.com/tier"] == "node-agent")
	check("priorityClassName", spec.PriorityClassName == "system-node-critical")
	check("events", hasArg(c.Args, "--events=true") && strings.Contains(notes, "reason=GPUUnhealthy"))
	check("nodeCondition", hasArg(c.Args, "--node-condition=true") && strings.Contains(notes, `@.type=="GPUHealthy"`))
	check("remediation.cordon", hasArg(c.Args, "--remediation-cordon=true") && len(objs.Policies) == 1 && strings.HasSuffix(objs.Policies[0].Name, "-node-cordon"))
	checkRBAC(t, objs, releaseNamespace, "gpu-plugin-all", map[string][]rbacv1.PolicyRule{"gpu-plugin-all-health": wantHealthRules(true, true), "gpu-plugin-all-cordon": wantCordonRules})
	check("health", c.LivenessProbe != nil && c.LivenessProbe.PeriodSeconds == 30 && c.LivenessProbe.TimeoutSeconds == 7 && c.LivenessProbe.FailureThreshold == 4 &&
		c.ReadinessProbe != nil && c.ReadinessProbe.PeriodSeconds == 15 && c.ReadinessProbe.TimeoutSeconds == 6 && c.ReadinessProbe.FailureThreshold == 2 &&
		hasArg(c.Args, "--health-socket=/run/probe/health.sock"))
	check("NOTES.txt", strings.Contains(notes, "gpu-plugin-all-metrics"))
	check("NOTES.txt uninstall", strings.Contains(notes, "rm -f /etc/cdi/gpu-device-plugin_*.json") &&
		strings.Contains(notes, "/opt/gpu-device-plugin/bin/gpu-device-plugin-cdi-hook"))
}

// values-all.yaml must set every key values.yaml has, down to the leaves
// (a map or list value counts as one option), so a new option cannot slip
// past TestHelmEveryOption.
func TestHelmValuesFileCoversEveryOption(t *testing.T) {
	defaults := readValues(t, filepath.Join(chartDir(t), "values.yaml"))
	all := readValues(t, filepath.Join("testdata", "values-all.yaml"))
	var walk func(path string, def, got map[string]any)
	walk = func(path string, def, got map[string]any) {
		for k, dv := range def {
			gv, ok := got[k]
			if !ok {
				t.Errorf("testdata/values-all.yaml does not set %s%s", path, k)
				continue
			}
			dm, isMap := dv.(map[string]any)
			gm, gotMap := gv.(map[string]any)
			if isMap && gotMap && len(dm) > 0 && k != "config" && k != "nodeSelector" && k != "requests" && k != "limits" && k != "securityContext" {
				walk(path+k+".", dm, gm)
			}
		}
	}
	walk("", defaults, all)
}

func toStrings(v any) []string {
	var out []string
	if xs, ok := v.([]any); ok {
		for _, x := range xs {
			s, _ := x.(string)
			out = append(out, s)
		}
	}
	return out
}

func hasArg(args []string, arg string) bool {
	for _, a := range args {
		if a == arg {
			return true
		}
	}
	return false
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func hasVolume(vs []corev1.Volume, name string) bool {
	for _, v := range vs {
		if v.Name == name {
			return true
		}
	}
	return false
}

func hasMount(ms []corev1.VolumeMount, path string) bool {
	for _, m := range ms {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

// Node labels: NFD's folder mounted at its host path in nfd mode, nothing
// in none, and a mode the plugin does not know refused at install.
func TestHelmNodeLabels(t *testing.T) {
	for _, tt := range []struct {
		mode      string
		wantMount bool
	}{{"nfd", true}, {"node", false}, {"none", false}} {
		objs := renderWith(t, chartutil.Values{"nodeLabels": map[string]any{"mode": tt.mode, "nfdFeaturesDir": "/var/lib/nfd/features.d"}})
		if errs := objs.validate(); len(errs) > 0 {
			t.Fatalf("%s: the API server would reject the chart's objects:\n%v", tt.mode, errs.ToAggregate())
		}
		spec := objs.DaemonSets[0].Spec.Template.Spec
		c := spec.Containers[0]
		if !slices.Contains(c.Args, "--node-labels="+tt.mode) {
			t.Errorf("%s: args %v", tt.mode, c.Args)
		}
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "nfd-features" && m.MountPath == "/var/lib/nfd/features.d"
		})
		hostPath := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "nfd-features" && v.HostPath != nil && v.HostPath.Path == "/var/lib/nfd/features.d" &&
				v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate
		})
		if mounted != tt.wantMount || hostPath != tt.wantMount {
			t.Errorf("%s: features folder mounted %v, host path %v; want %v", tt.mode, mounted, hostPath, tt.wantMount)
		}
		if _, ok := flagValue(c.Args, "nfd-features-dir"); ok != tt.wantMount {
			t.Errorf("%s: --nfd-features-dir in args %v, want %v", tt.mode, ok, tt.wantMount)
		}
		// Only node labels the Node through the API: its token, RBAC and policy.
		api := spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken
		if node := tt.mode == "node"; api != node || (len(objs.ClusterRoles) > 0) != node || (len(objs.Policies) > 0) != node {
			t.Errorf("%s: token %v, %d ClusterRoles, %d policies; want API access %v", tt.mode, api, len(objs.ClusterRoles), len(objs.Policies), node)
		}
	}
	_, err := renderValues(t, loadChart(t), chartutil.Values{"nodeLabels": map[string]any{"mode": "gfd"}})
	if err == nil || !strings.Contains(err.Error(), `nodeLabels.mode "gfd"`) {
		t.Errorf("mode gfd: %v", err)
	}
}

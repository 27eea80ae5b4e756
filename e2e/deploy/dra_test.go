package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// draDriver is the plugin's DRA driver name, fixed by the Go side.
const draDriver = config.DRADriverName

// draValues is the chart in DRA mode, with vals over it.
func draValues(vals chartutil.Values) chartutil.Values {
	out := chartutil.Values{"kubeletAPI": "dra"}
	for k, v := range vals {
		out[k] = v
	}
	return out
}

// renderNotes renders the chart with vals and decodes it, with NOTES.txt.
func renderNotes(t *testing.T, vals chartutil.Values) (objects, string) {
	t.Helper()
	c := loadChart(t)
	out, err := renderValues(t, c, vals)
	if err != nil {
		t.Fatalf("rendering the chart with %v: %v", vals, err)
	}
	return renderWith(t, vals), out[filepath.Join(c.Name(), "templates", "NOTES.txt")]
}

// readDRAManifest is deploy/manifests/gpu-device-plugin-dra.yaml.
func readDRAManifest(t *testing.T) objects {
	t.Helper()
	p := repoPath(t, "deploy", "manifests", "gpu-device-plugin-dra.yaml")
	objs, err := decodeStrict(p, mustRead(t, p))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// defaultDRA is what the chart's defaults and the DRA manifest promise.
var defaultDRA = wantDRA{
	serviceAccount: "gpu-device-plugin",
	pluginDir:      "/var/lib/kubelet/plugins/" + draDriver,
	registryDir:    "/var/lib/kubelet/plugins_registry",
}

func defaultDRADaemonSet() wantDaemonSet {
	return wantDaemonSet{
		namespace: releaseNamespace, hostDriverRoot: "/", cdiSpecDir: "/var/run/cdi",
		cdiHookDir: defaultCDIHookDir, stateDir: "/var/lib/gpu-device-plugin/state", podResourcesDir: defaultPodResourcesDir,
		privileged: true, image: defaultImage,
		maxUnavailable: intstr.FromInt32(0), maxSurge: ptr.To(intstr.FromInt32(1)), dra: &defaultDRA,
	}
}

// checkDRAPod pins DRA mode's pod beyond its path flags (checkDaemonSet):
// the mode flag, the downward-API environment the plugin needs, and no
// trace of the device-plugin API.
func checkDRAPod(t *testing.T, spec corev1.PodSpec, c corev1.Container, want *wantDRA, volumes map[string]corev1.Volume) {
	t.Helper()
	if v, _ := flagValue(c.Args, "kubelet-api"); v != "dra" {
		t.Errorf("--kubelet-api=%q, want dra", v)
	}
	if v, ok := flagValue(c.Args, "device-plugin-dir"); ok {
		t.Errorf("--device-plugin-dir=%s in DRA mode", v)
	}
	for _, f := range []struct{ flag, path string }{{"dra-plugin-dir", want.pluginDir}, {"plugin-registry-dir", want.registryDir}} {
		// The kubelet dials the paths the plugin registers: the pod path
		// must be the host path.
		if v, _ := flagValue(c.Args, f.flag); v != f.path {
			t.Errorf("--%s=%q, want the host path %s (the kubelet dials the sockets at the paths the plugin sees)", f.flag, v, f.path)
		}
	}
	types := map[string]corev1.HostPathType{want.pluginDir: corev1.HostPathDirectoryOrCreate, want.registryDir: corev1.HostPathDirectory}
	for _, m := range c.VolumeMounts {
		hp := volumes[m.Name].HostPath
		if hp == nil {
			continue
		}
		if strings.HasSuffix(hp.Path, "device-plugins") || strings.HasSuffix(m.MountPath, "device-plugins") {
			t.Errorf("mount %s of host %s: DRA mode mounts no device-plugins directory", m.MountPath, hp.Path)
		}
		if wt, ok := types[hp.Path]; ok && (hp.Type == nil || *hp.Type != wt) {
			t.Errorf("host path %s has type %v, want %s", hp.Path, hp.Type, wt)
		}
		// Not the kubelet's whole plugins/ directory: other drivers' and
		// CSI sockets are there.
		if filepath.Base(hp.Path) == "plugins" {
			t.Errorf("host path %s mounted: want only the driver's own directory %s", hp.Path, want.pluginDir)
		}
	}
	for _, e := range []struct{ name, fieldPath string }{
		{"GPU_DEVICE_PLUGIN_NODE_NAME", "spec.nodeName"},
		{"GPU_DEVICE_PLUGIN_POD_UID", "metadata.uid"},
	} {
		i := slices.IndexFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == e.name })
		if i < 0 {
			t.Errorf("no %s in the environment", e.name)
			continue
		}
		if vf := c.Env[i].ValueFrom; vf == nil || vf.FieldRef == nil || vf.FieldRef.FieldPath != e.fieldPath {
			t.Errorf("%s is %+v, want the downward API's %s", e.name, c.Env[i], e.fieldPath)
		}
	}
	// Names that config.Settings gives the two settings: a rename on the
	// Go side must show here.
	for _, s := range config.Settings() {
		if (s.Key == "nodeName" && s.Env != "GPU_DEVICE_PLUGIN_NODE_NAME") || (s.Key == "podUID" && s.Env != "GPU_DEVICE_PLUGIN_POD_UID") {
			t.Errorf("setting %s reads %s, the chart sets another", s.Key, s.Env)
		}
	}
}

// The RBAC of DRA mode, exactly: adding a verb, a resource or a rule
// fails here, on purpose.
var wantDRARules = []rbacv1.PolicyRule{
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
	// The claims' status.devices entries: a server-side apply is a patch,
	// and the API server checks the driver's entries against the synthetic
	// resourceclaims/driver (associated-node: the claim is on the pod's node).
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{draDriver}, Verbs: []string{"associated-node:patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
}

// grants flattens rules into group/resource[name]/verb triples, so that
// the same grants written as other rules compare equal; a rule without
// resourceNames grants every name ([*]).
func grants(t *testing.T, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: nonResourceURLs are not expected", r)
		}
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, n := range names {
					for _, v := range r.Verbs {
						out = append(out, fmt.Sprintf("%s/%s[%s]:%s", g, res, n, v))
					}
				}
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// checkDRARBAC pins DRA mode's API access: its one ClusterRole, named as
// the ServiceAccount, and nothing else.
func checkDRARBAC(t *testing.T, objs objects, namespace, sa string) {
	t.Helper()
	checkRBAC(t, objs, namespace, sa, map[string][]rbacv1.PolicyRule{sa: wantDRARules})
}

// checkRBAC pins the chart's API access: one ServiceAccount, exactly the
// ClusterRoles in roles (name: rules) with exactly those grants, and one
// ClusterRoleBinding each, to that ServiceAccount alone; no Role.
func checkRBAC(t *testing.T, objs objects, namespace, sa string, roles map[string][]rbacv1.PolicyRule) {
	t.Helper()
	checkAccess(t, objs, namespace, sa, roles, nil)
}

// checkAccess is checkRBAC with exactly the Roles in nsRoles (name:
// rules), each in namespace, the ServiceAccount's, and bound once, by a
// RoleBinding there, to it alone.
func checkAccess(t *testing.T, objs objects, namespace, sa string, roles, nsRoles map[string][]rbacv1.PolicyRule) {
	t.Helper()
	if len(objs.Roles) != len(nsRoles) || len(objs.RoleBindings) != len(nsRoles) {
		t.Errorf("want %d Roles and RoleBindings, got %d, %d", len(nsRoles), len(objs.Roles), len(objs.RoleBindings))
	}
	nsBound := map[string]bool{}
	for _, b := range objs.RoleBindings {
		if b.Namespace != namespace || b.RoleRef.APIGroup != "rbac.authorization.k8s.io" || b.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s/%s refers to %+v, want a Role in %s", b.Namespace, b.Name, b.RoleRef, namespace)
		}
		if nsBound[b.RoleRef.Name] {
			t.Errorf("Role %s bound twice", b.RoleRef.Name)
		}
		nsBound[b.RoleRef.Name] = true
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: namespace}}; !slices.Equal(b.Subjects, want) {
			t.Errorf("RoleBinding %s subjects %+v, want %+v", b.Name, b.Subjects, want)
		}
	}
	for _, role := range objs.Roles {
		rules, ok := nsRoles[role.Name]
		switch {
		case !ok:
			t.Errorf("unexpected Role %s/%s", role.Namespace, role.Name)
			continue
		case role.Namespace != namespace:
			t.Errorf("Role %s in namespace %q, want %s", role.Name, role.Namespace, namespace)
		}
		if got, want := grants(t, role.Rules), grants(t, rules); !slices.Equal(got, want) {
			t.Errorf("Role %s grants\n  %s\nwant exactly\n  %s", role.Name, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		if !nsBound[role.Name] {
			t.Errorf("Role %s is bound to nothing", role.Name)
		}
	}
	if len(objs.ServiceAccounts) != 1 || len(objs.ClusterRoles) != len(roles) || len(objs.ClusterRoleBindings) != len(roles) {
		t.Fatalf("want one ServiceAccount and %d ClusterRoles and ClusterRoleBindings, got %d, %d, %d",
			len(roles), len(objs.ServiceAccounts), len(objs.ClusterRoles), len(objs.ClusterRoleBindings))
	}
	if a := objs.ServiceAccounts[0]; a.Name != sa || a.Namespace != namespace {
		t.Errorf("ServiceAccount %s/%s, want %s/%s", a.Namespace, a.Name, namespace, sa)
	}
	bound := map[string]bool{}
	for _, b := range objs.ClusterRoleBindings {
		if b.RoleRef.APIGroup != "rbac.authorization.k8s.io" || b.RoleRef.Kind != "ClusterRole" {
			t.Errorf("ClusterRoleBinding %s refers to %+v, want a ClusterRole", b.Name, b.RoleRef)
		}
		if bound[b.RoleRef.Name] {
			t.Errorf("ClusterRole %s bound twice", b.RoleRef.Name)
		}
		bound[b.RoleRef.Name] = true
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: namespace}}; !slices.Equal(b.Subjects, want) {
			t.Errorf("ClusterRoleBinding %s subjects %+v, want %+v", b.Name, b.Subjects, want)
		}
	}
	for _, role := range objs.ClusterRoles {
		rules, ok := roles[role.Name]
		if !ok {
			t.Errorf("unexpected ClusterRole %s", role.Name)
			continue
		}
		if got, want := grants(t, role.Rules), grants(t, rules); !slices.Equal(got, want) {
			t.Errorf("ClusterRole %s grants\n  %s\nwant exactly\n  %s", role.Name, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		if role.AggregationRule != nil {
			t.Errorf("ClusterRole %s aggregates other roles", role.Name)
		}
		if !bound[role.Name] {
			t.Errorf("ClusterRole %s is bound to nothing", role.Name)
		}
	}
}

// With kubeletAPI: dra, the chart gives the plugin the API access DRA
// needs and no more, the kubelet's plugin directories, and a rolling update
// that surges.
func TestHelmDRA(t *testing.T) {
	objs, notes := renderNotes(t, draValues(nil))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 || len(objs.Services) != 0 {
		t.Fatalf("want one ConfigMap and one DaemonSet, got %d ConfigMaps, %d DaemonSets, %d Services",
			len(objs.ConfigMaps), len(objs.DaemonSets), len(objs.Services))
	}
	ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
	checkDRARBAC(t, objs, releaseNamespace, "gpu-device-plugin")
	checkDaemonSet(t, ds, cm, defaultDRADaemonSet())
	t.Run("init container installs the hook", func(t *testing.T) { checkInstallsHook(t, ds) })
	checkAcceptedByPlugin(t, ds, cm)
	if len(objs.Policies) != 2 || len(objs.PolicyBindings) != 2 {
		t.Errorf("%d ValidatingAdmissionPolicies, %d bindings: want the two restricting ResourceSlices and claim status to the pod's node", len(objs.Policies), len(objs.PolicyBindings))
	}
	if len(objs.DeviceClasses) != 2 || objs.DeviceClasses[0].Name != "gpu."+draDriver || objs.DeviceClasses[1].Name != "mig."+draDriver {
		t.Errorf("want DeviceClasses gpu.%s and mig.%s alone, got %d", draDriver, draDriver, len(objs.DeviceClasses))
	}
	for _, want := range []string{
		"kind: ResourceClaimTemplate", "deviceClassName: gpu." + draDriver, "nvidia.com/gpu: 2",
		"kubectl get resourceslices", "rm -f /var/run/cdi/gpu-device-plugin_*.json",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "allocatable") {
		t.Errorf("NOTES.txt of DRA mode points at node allocatable, which DRA does not fill:\n%s", notes)
	}
}

// Device-plugin mode, the default, needs no API access: no token, no
// service account, no RBAC, nor any DRA object, even with every dra.*
// value changed, as long as events and nodeCondition are off.
func TestHelmDevicePluginModeHasNoAPIAccess(t *testing.T) {
	allOff := readValues(t, filepath.Join("testdata", "values-all.yaml"))
	allOff["events"] = map[string]any{"enabled": false}
	allOff["nodeCondition"] = map[string]any{"enabled": false}
	allOff["remediation"] = map[string]any{"cordon": false}
	for _, tc := range []struct {
		name string
		vals chartutil.Values
	}{
		{"defaults", chartutil.Values{}},
		{"explicit", chartutil.Values{"kubeletAPI": "device-plugin", "events": map[string]any{"enabled": false}, "nodeCondition": map[string]any{"enabled": false}}},
		{"values-all.yaml with events, nodeCondition and remediation.cordon off", allOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderWith(t, tc.vals)
			if n := len(objs.ServiceAccounts) + len(objs.ClusterRoles) + len(objs.ClusterRoleBindings) + len(objs.Policies) + len(objs.PolicyBindings) + len(objs.DeviceClasses); n != 0 {
				t.Errorf("%d ServiceAccounts, RBAC, admission or DeviceClass objects in device-plugin mode", n)
			}
			spec := objs.DaemonSets[0].Spec.Template.Spec
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.ServiceAccountName != "" {
				t.Errorf("automountServiceAccountToken %v, serviceAccountName %q: want false and none", spec.AutomountServiceAccountToken, spec.ServiceAccountName)
			}
			c := spec.Containers[0]
			for _, f := range []string{"kubelet-api", "dra-plugin-dir", "plugin-registry-dir", "events", "node-condition", "remediation-cordon", "kubeconfig"} {
				if v, ok := flagValue(c.Args, f); ok {
					t.Errorf("--%s=%s in device-plugin mode", f, v)
				}
			}
			if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return strings.HasPrefix(e.Name, "GPU_DEVICE_PLUGIN_NODE") }); i >= 0 {
				t.Errorf("env %s in device-plugin mode", c.Env[i].Name)
			}
		})
	}
}

// Every dra.* value reaches its object, on top of values-all.yaml (which
// keeps kubeletAPI at device-plugin for TestHelmEveryOption).
func TestHelmDRAEveryOption(t *testing.T) {
	vals := readValues(t, filepath.Join("testdata", "values-all.yaml"))
	vals["kubeletAPI"] = "dra"
	objs, _ := renderNotes(t, vals)
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
	// values-all.yaml has events, nodeCondition and remediation.cordon on:
	// their roles beside DRA's.
	checkRBAC(t, objs, releaseNamespace, "gpu-plugin-all", map[string][]rbacv1.PolicyRule{
		"gpu-plugin-all": wantDRARules, "gpu-plugin-all-health": wantHealthRules(true, true), "gpu-plugin-all-cordon": wantCordonRules,
	})
	checkDaemonSet(t, ds, cm, wantDaemonSet{
		namespace: releaseNamespace, hostDriverRoot: "/run/nvidia/driver", cdiSpecDir: "/etc/cdi",
		cdiHookDir: "/opt/gpu-device-plugin/bin", stateDir: "/opt/gpu-device-plugin/state", mpsRoot: "/run/gpu/mps", podResourcesDir: "/var/lib/k0s/kubelet/pod-resources",
		image: "registry.example.com/gpu/gpu-device-plugin", maxUnavailable: intstr.FromInt32(2), maxSurge: ptr.To(intstr.FromInt32(0)),
		dra: &wantDRA{
			serviceAccount: "gpu-plugin-all",
			pluginDir:      "/var/lib/k0s/kubelet/plugins/" + draDriver, // values-all.yaml's, cleaned
			registryDir:    "/var/lib/k0s/kubelet/plugins_registry",
		},
		ownAffinity: true, // values-all.yaml's gpuNodeSelectorTerms
	})
	// A subtest: the checks below run even while the Go side lacks a flag.
	t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
	// remediation.cordon's policy only.
	if len(objs.Policies) != 1 || !strings.HasSuffix(objs.Policies[0].Name, "-node-cordon") || len(objs.PolicyBindings) != 1 {
		t.Error("dra.restrictSlicesToNode: false still renders the admission policy")
	}
	if len(objs.DeviceClasses) != 2 || objs.DeviceClasses[0].Spec.ExtendedResourceName != nil || objs.DeviceClasses[1].Spec.ExtendedResourceName != nil {
		t.Error("dra.gpuExtendedResource: false still names nvidia.com/gpu in the GPU DeviceClass")
	}
	// dra.nicExtendedResources: false, with pools.
	vals["config"] = nicPoolValues(t)["config"]
	for _, dc := range renderWith(t, vals).DeviceClasses {
		if dc.Spec.ExtendedResourceName != nil {
			t.Errorf("DeviceClass %s serves %s with dra.nicExtendedResources and gpuExtendedResource false", dc.Name, *dc.Spec.ExtendedResourceName)
		}
	}
}

// Mistakes that would leave a node without a working plugin are refused
// at install time, with the value to change.
func TestHelmDRARefuses(t *testing.T) {
	pools := nicPoolValues(t)["config"]
	for _, tc := range []struct {
		name string
		vals chartutil.Values
		want string
	}{
		{"unknown kubeletAPI", chartutil.Values{"kubeletAPI": "csi"}, `kubeletAPI "csi"`},
		{"kubeletAPI in config", chartutil.Values{"config": map[string]any{"kubeletAPI": "dra"}}, "config.kubeletAPI"},
		{"relative pluginDir", draValues(chartutil.Values{"dra": map[string]any{"pluginDir": "var/lib/kubelet/plugins/x"}}), "dra.pluginDir"},
		{"relative pluginRegistryDir", draValues(chartutil.Values{"dra": map[string]any{"pluginRegistryDir": "plugins_registry"}}), "dra.pluginRegistryDir"},
		// The surge pod would need the metrics host port the old one holds.
		{"surge, metrics and host network", draValues(chartutil.Values{"metrics": map[string]any{"enabled": true}, "hostNetwork": true}), "dra.updateStrategy"},
		{"surge, metrics and NIC pools", draValues(chartutil.Values{"metrics": map[string]any{"enabled": true}, "config": pools}), "dra.updateStrategy"},
		{"two pools, one DeviceClass", draValues(chartutil.Values{"config": map[string]any{"nicResources": []any{
			map[string]any{"name": "example.com/rdma_a"}, map[string]any{"name": "example.com/rdma-a"}}}}), "both give DeviceClass example.com-rdma-a." + draDriver},
		{"pool name no DeviceClass name", draValues(chartutil.Values{"config": map[string]any{"nicResources": []any{
			map[string]any{"name": "example.com/a._b"}}}}), "not a DNS subdomain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderValues(t, loadChart(t), tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rendering with %v: %v, want an error containing %q", tc.vals, err, tc.want)
			}
		})
	}
	// Without metrics, or with maxSurge 0, the host network is fine.
	renderWith(t, draValues(chartutil.Values{"hostNetwork": true}))
	renderWith(t, draValues(chartutil.Values{"metrics": map[string]any{"enabled": true}, "hostNetwork": true,
		"dra": map[string]any{"updateStrategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": 1}}}}))
}

// sampleDevice is a device as a ResourceSlice of driver publishes it, with
// attributes named as the Go side may write them: bare (in the driver's
// domain) or qualified.
func sampleDevice(driver string, qualified bool, attrs map[string]string) dracel.Device {
	d := dracel.Device{Driver: driver, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}}
	for k, v := range attrs {
		name := k
		if qualified {
			name = driver + "/" + k
		}
		d.Attributes[resourcev1.QualifiedName(name)] = resourcev1.DeviceAttribute{StringValue: ptr.To(v)}
	}
	return d
}

// selects compiles a DeviceClass's selectors as the scheduler does and
// says whether they all select d, described by what.
func selects(t *testing.T, dc *resourcev1.DeviceClass, d dracel.Device, what string) bool {
	t.Helper()
	if len(dc.Spec.Selectors) == 0 {
		t.Fatalf("DeviceClass %s has no selectors: it would select every device of every driver", dc.Name)
	}
	for _, s := range dc.Spec.Selectors {
		if s.CEL == nil {
			t.Fatalf("DeviceClass %s: a selector without CEL", dc.Name)
		}
		r := dracel.GetCompiler(dracel.Features{}).CompileCELExpression(s.CEL.Expression, dracel.Options{})
		if r.Error != nil {
			t.Fatalf("DeviceClass %s: %q does not compile: %v", dc.Name, s.CEL.Expression, r.Error)
		}
		ok, _, err := r.DeviceMatches(context.Background(), d)
		if err != nil {
			// The scheduler takes an error as "no" but reports it:
			// a class must not fail on any device.
			t.Errorf("DeviceClass %s on %s: %v", dc.Name, what, err)
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

// The DeviceClasses select exactly the plugin's GPUs, and each NIC pool's
// NICs, whatever else the cluster's drivers publish; each serves its
// extended resource; their names follow the documented rule.
func TestHelmDRADeviceClasses(t *testing.T) {
	objs := renderWith(t, draValues(nicPoolValues(t)))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	classes := map[string]*resourcev1.DeviceClass{}
	for _, dc := range objs.DeviceClasses {
		classes[dc.Name] = dc
	}
	pools := []string{"example.com/rdma_numa0", "example.com/rdma_numa1"}
	want := map[string]string{ // class: extended resource ("" none)
		"gpu." + draDriver:                    "nvidia.com/gpu",
		"mig." + draDriver:                    "",
		"example.com-rdma-numa0." + draDriver: pools[0],
		"example.com-rdma-numa1." + draDriver: pools[1],
	}
	if len(classes) != len(want) {
		t.Errorf("DeviceClasses %v, want %v", slices.Sorted(func(yield func(string) bool) {
			for k := range classes {
				if !yield(k) {
					return
				}
			}
		}), want)
	}
	for name, er := range want {
		dc := classes[name]
		if dc == nil {
			t.Errorf("no DeviceClass %s", name)
			continue
		}
		if er == "" {
			if dc.Spec.ExtendedResourceName != nil {
				t.Errorf("DeviceClass %s: extendedResourceName %s, want none", name, *dc.Spec.ExtendedResourceName)
			}
			continue
		}
		if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != er {
			t.Errorf("DeviceClass %s: extendedResourceName %v, want %s", name, dc.Spec.ExtendedResourceName, er)
		}
	}
	if t.Failed() {
		return
	}

	devices := map[string]map[string]string{
		"gpu":   {"type": "gpu"},
		"mig":   {"type": "mig", "profile": "1g.10gb"},
		"nic0":  {"type": "nic", "pool": pools[0]},
		"nic1":  {"type": "nic", "pool": pools[1]},
		"other": {"type": "fpga"},
	}
	wantSel := map[string]string{ // device: the one class that selects it
		"gpu": "gpu." + draDriver, "mig": "mig." + draDriver, "nic0": "example.com-rdma-numa0." + draDriver, "nic1": "example.com-rdma-numa1." + draDriver,
	}
	for _, qualified := range []bool{false, true} {
		for dev, attrs := range devices {
			for _, driver := range []string{draDriver, "gpu.nvidia.com"} {
				d := sampleDevice(driver, qualified, attrs)
				what := fmt.Sprintf("%s %v of driver %s (qualified attribute names: %v)", dev, attrs, driver, qualified)
				for name, dc := range classes {
					exp := driver == draDriver && wantSel[dev] == name
					if got := selects(t, dc, d, what); got != exp {
						t.Errorf("DeviceClass %s selects %s: %v, want %v", name, what, got, exp)
					}
				}
			}
		}
	}
}

// The DeviceClass name of a NIC pool: the pool name lower-cased, "/" and
// "_" made "-", then ".gpu-device-plugin.github.io". The Go side and the
// README rely on this rule.
func TestHelmDRANICDeviceClassName(t *testing.T) {
	for pool, want := range map[string]string{
		"example.com/rdma_a":        "example.com-rdma-a." + draDriver,
		"example.com/RDMA_Numa0":    "example.com-rdma-numa0." + draDriver,
		"nvidia.com/mlx5.ib":        "nvidia.com-mlx5.ib." + draDriver,
		"rdma.example.org/pf-numa1": "rdma.example.org-pf-numa1." + draDriver,
	} {
		objs := renderWith(t, draValues(chartutil.Values{"config": map[string]any{"nicResources": []any{map[string]any{"name": pool}}}}))
		var names []string
		for _, dc := range objs.DeviceClasses {
			names = append(names, dc.Name)
		}
		if !slices.Contains(names, want) {
			t.Errorf("pool %s: DeviceClasses %q, want %s", pool, names, want)
		}
		if errs := objs.validate(); len(errs) > 0 {
			t.Errorf("pool %s: %v", pool, errs.ToAggregate())
		}
	}
}

// policyVerdict evaluates a ValidatingAdmissionPolicy on one request as
// the API server's admission plugin does (validating.compilePolicy, which
// is not exported, line for line), leaving out the match constraints,
// which checkPolicyScope pins. It returns "" for admit, else the message.
func policyVerdict(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy, op admission.Operation, u user.Info, obj, old runtime.Object) string {
	t.Helper()
	return policyVerdictOn(t, p, resourcev1.SchemeGroupVersion.WithResource("resourceslices"), resourcev1.SchemeGroupVersion.WithKind("ResourceSlice"), "slice", "", op, u, obj, old)
}

// policyVerdictOn is policyVerdict on object name of any resource and
// subresource.
func policyVerdictOn(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy, gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, name, sub string, op admission.Operation, u user.Info, obj, old runtime.Object) string {
	t.Helper()
	comp, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	vars := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	msgVars := plugincel.OptionalVariableDeclarations{}
	var named []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		named = append(named, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	comp.CompileAndStoreVariables(named, vars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if len(p.Spec.MatchConditions) > 0 {
		var mcs []plugincel.ExpressionAccessor
		for i := range p.Spec.MatchConditions {
			mcs = append(mcs, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
		}
		matcher = matchconditions.NewMatcher(comp.CompileCondition(mcs, vars, environment.StoredExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	v := validating.NewValidator(comp.CompileCondition(validations, vars, environment.StoredExpressions), matcher,
		comp.CompileCondition(nil, vars, environment.StoredExpressions), comp.CompileCondition(messages, msgVars, environment.StoredExpressions),
		p.Spec.FailurePolicy, nil)

	attrs := admission.NewAttributesRecord(obj, old, gvk, "", name, gvr, sub, op, nil, false, u)
	res := v.Validate(context.Background(), gvr, &admission.VersionedAttributes{
		Attributes: attrs, VersionedObject: admission.NewLazyObject(obj), VersionedOldObject: admission.NewLazyObject(old), VersionedKind: gvk,
	}, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	var msgs []string
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Errorf("policy %s: evaluation error: %s", p.Name, d.Message)
		}
		if d.Action == validating.ActionDeny {
			msgs = append(msgs, d.Message)
		}
	}
	return strings.Join(msgs, "; ")
}

// checkPolicyScope pins what the slices policy applies to: every write of
// a ResourceSlice in any version, denied on failure.
func checkPolicyScope(t *testing.T, objs objects) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	return checkDRAPolicy(t, objs, "-resourceslices", "resourceslices", []string{"CREATE", "DELETE", "UPDATE"})
}

// checkClaimStatusScope pins what the claim-status policy applies to:
// every update of a ResourceClaim's status in any version.
func checkClaimStatusScope(t *testing.T, objs objects) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	return checkDRAPolicy(t, objs, "-claim-status", "resourceclaims/status", []string{"UPDATE"})
}

// checkDRAPolicy finds DRA mode's policy named …suffix, with its binding,
// and pins its scope: ops on resource.k8s.io resource in every version,
// denied on failure, bound everywhere with Deny.
func checkDRAPolicy(t *testing.T, objs objects, suffix, resource string, ops []string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	if len(objs.Policies) != 2 || len(objs.PolicyBindings) != 2 {
		t.Fatalf("%d ValidatingAdmissionPolicies and %d bindings, want two each", len(objs.Policies), len(objs.PolicyBindings))
	}
	i := slices.IndexFunc(objs.Policies, func(p *admissionregistrationv1.ValidatingAdmissionPolicy) bool {
		return strings.HasSuffix(p.Name, suffix)
	})
	if i < 0 {
		t.Fatalf("no policy named …%s", suffix)
	}
	p := objs.Policies[i]
	j := slices.IndexFunc(objs.PolicyBindings, func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool {
		return b.Spec.PolicyName == p.Name
	})
	if j < 0 {
		t.Fatalf("policy %s is bound to nothing", p.Name)
	}
	b := objs.PolicyBindings[j]
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail: a policy that cannot run must not let writes through", p.Spec.FailurePolicy)
	}
	mc := p.Spec.MatchConstraints
	if mc == nil || len(mc.ResourceRules) != 1 || mc.NamespaceSelector != nil && len(mc.NamespaceSelector.MatchLabels)+len(mc.NamespaceSelector.MatchExpressions) > 0 {
		t.Fatalf("matchConstraints %+v, want one resource rule", mc)
	}
	r := mc.ResourceRules[0]
	if !slices.Equal(r.APIGroups, []string{"resource.k8s.io"}) || !slices.Equal(r.APIVersions, []string{"*"}) ||
		!slices.Equal(r.Resources, []string{resource}) || len(r.ResourceNames) > 0 ||
		!slices.Equal(sorted(opStrings(r.Operations)), ops) {
		t.Errorf("rule %+v, want %v of resource.k8s.io %s in every version", r, ops, resource)
	}
	if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) ||
		b.Spec.MatchResources != nil || b.Spec.ParamRef != nil {
		t.Errorf("binding %+v, want policy %s everywhere with Deny", b.Spec, p.Name)
	}
	return p
}

func opStrings(ops []admissionregistrationv1.OperationType) []string {
	var out []string
	for _, o := range ops {
		out = append(out, string(o))
	}
	return out
}

// pluginAccount is the plugin's ServiceAccount as the API server names it.
const pluginAccount = "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin"

// onNode is user name as a pod's bound token shows it on node (none: a
// token that names no node).
func onNode(name, node string) user.Info {
	extra := map[string][]string{}
	if node != "" {
		extra["authentication.kubernetes.io/node-name"] = []string{node}
	}
	return &user.DefaultInfo{Name: name, Groups: []string{"system:serviceaccounts"}, Extra: extra}
}

// The admission policy keeps each plugin to its own node's ResourceSlices:
// evaluated on the requests a plugin, a compromised one, and others make.
func TestHelmDRAAdmissionPolicy(t *testing.T) {
	objs := renderWith(t, draValues(nil))
	p := checkPolicyScope(t, objs)

	sa := pluginAccount
	// slice is one of the plugin's slices of node: its driver, one pool
	// named after the node, and its own managedFields entry.
	slice := func(node string) *resourcev1.ResourceSlice {
		s := &resourcev1.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: "slice", ManagedFields: []metav1.ManagedFieldsEntry{
				sliceEntry(fieldManager, "2026-05-01T12:00:00Z", `{"f:spec":{"f:devices":{},"f:driver":{},"f:nodeName":{},"f:pool":{"f:name":{}}}}`)}},
			Spec: resourcev1.ResourceSliceSpec{Driver: draDriver, Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}},
		}
		if node == "" {
			s.Spec.AllNodes = ptr.To(true)
			s.Spec.Pool.Name = "n1"
		} else {
			s.Spec.NodeName = ptr.To(node)
		}
		return s
	}
	with := func(s *resourcev1.ResourceSlice, f func(*resourcev1.ResourceSlice)) *resourcev1.ResourceSlice {
		f(s)
		return s
	}
	otherDriver := func(s *resourcev1.ResourceSlice) { s.Spec.Driver = "gpu.nvidia.com" }
	otherPool := func(s *resourcev1.ResourceSlice) { s.Spec.Pool.Name = "n2" }
	// A made-up entry for the kubelet: its next apply would remove the
	// slice's devices.
	forged := func(s *resourcev1.ResourceSlice) {
		s.ManagedFields = append(s.ManagedFields, sliceEntry("kube-controller-manager", "2026-05-01T11:00:00Z", `{"f:spec":{"f:devices":{}}}`))
	}
	// The entry the API server writes for the plugin on each request.
	ownEntryNewer := func(s *resourcev1.ResourceSlice) {
		s.ManagedFields[0] = sliceEntry(fieldManager, "2026-05-01T12:05:00Z", `{"f:spec":{"f:devices":{},"f:driver":{},"f:nodeName":{},"f:perDeviceNodeSelection":{},"f:pool":{"f:name":{}}}}`)
	}
	var none *resourcev1.ResourceSlice
	obj := func(s *resourcev1.ResourceSlice) runtime.Object {
		if s == nil {
			return nil
		}
		return s
	}
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		u        user.Info
		obj, old *resourcev1.ResourceSlice
		deny     string // part of the message; "" admits
	}{
		{"create own", admission.Create, onNode(sa, "n1"), slice("n1"), none, ""},
		{"update own", admission.Update, onNode(sa, "n1"), slice("n1"), slice("n1"), ""},
		{"delete own", admission.Delete, onNode(sa, "n1"), none, slice("n1"), ""},
		{"create another node's", admission.Create, onNode(sa, "n1"), slice("n2"), none, "not node n2's"},
		{"create for all nodes", admission.Create, onNode(sa, "n1"), slice(""), none, "one without spec.nodeName"},
		{"move own to another node", admission.Update, onNode(sa, "n1"), slice("n2"), slice("n1"), "not node n2's"},
		{"take over another node's", admission.Update, onNode(sa, "n1"), slice("n1"), slice("n2"), "change or delete only its own"},
		{"delete another node's", admission.Delete, onNode(sa, "n1"), none, slice("n2"), "change or delete only its own"},
		{"token without a node", admission.Create, onNode(sa, ""), slice("n1"), none, "the token names no node"},
		// Only this driver's slices, in the pool named after the node.
		{"create another driver's on own node", admission.Create, onNode(sa, "n1"), with(slice("n1"), otherDriver), none, "not driver/pool gpu.nvidia.com/n1"},
		{"create in another pool on own node", admission.Create, onNode(sa, "n1"), with(slice("n1"), otherPool), none, "not driver/pool " + draDriver + "/n2"},
		{"turn own into another driver's", admission.Update, onNode(sa, "n1"), with(slice("n1"), otherDriver), slice("n1"), "not driver/pool gpu.nvidia.com/n1"},
		{"take over another driver's on own node", admission.Update, onNode(sa, "n1"), slice("n1"), with(slice("n1"), otherDriver), "not driver/pool gpu.nvidia.com/n1"},
		{"delete another driver's on own node", admission.Delete, onNode(sa, "n1"), none, with(slice("n1"), otherDriver), "not driver/pool gpu.nvidia.com/n1"},
		// managedFields: the plugin's own entry is the API server's to
		// write; no other may be added or widened.
		{"update own, with its own entry renewed", admission.Update, onNode(sa, "n1"), with(slice("n1"), ownEntryNewer), slice("n1"), ""},
		{"create with another manager's entry", admission.Create, onNode(sa, "n1"), with(slice("n1"), forged), none, "may not add or widen the entries of kube-controller-manager"},
		{"update adding another manager's entry", admission.Update, onNode(sa, "n1"), with(slice("n1"), forged), slice("n1"), "may not add or widen the entries of kube-controller-manager"},
		{"update widening another manager's entry", admission.Update, onNode(sa, "n1"), with(slice("n1"), func(s *resourcev1.ResourceSlice) {
			forged(s)
			s.ManagedFields[1].FieldsV1.Raw = []byte(`{"f:spec":{"f:devices":{},"f:nodeName":{}}}`)
		}), with(slice("n1"), forged), "may not add or widen the entries of kube-controller-manager"},
		{"update keeping another manager's entry", admission.Update, onNode(sa, "n1"), with(slice("n1"), forged), with(slice("n1"), forged), ""},
		// Not the plugin's account: the policy does not apply (RBAC and
		// the Node authorizer decide).
		{"another service account", admission.Create, onNode("system:serviceaccount:kube-system:other", "n1"), slice("n2"), none, ""},
		{"the same name in another namespace", admission.Create, onNode("system:serviceaccount:default:gpu-device-plugin", "n1"), slice("n2"), none, ""},
		{"a kubelet", admission.Create, &user.DefaultInfo{Name: "system:node:n2", Groups: []string{"system:nodes"}}, slice("n2"), none, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := policyVerdict(t, p, tc.op, tc.u, obj(tc.obj), obj(tc.old))
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && got == "":
				t.Errorf("admitted, want denied with %q", tc.deny)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("denied with %q, want %q in the message", got, tc.deny)
			}
		})
	}
}

// fieldManager is the plugin's field manager on every write: the
// admission policies tell its managedFields entry from the others' by it.
const fieldManager = config.FieldManager

// sliceEntry is a managedFields entry of an update by manager at time.
func sliceEntry(manager, at, fields string) metav1.ManagedFieldsEntry {
	t, err := time.Parse(time.RFC3339, at)
	if err != nil {
		panic(err)
	}
	mt := metav1.NewTime(t)
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "resource.k8s.io/v1",
		Time: &mt, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
}

// The claim-status policy keeps each plugin to its own entries of
// status.devices (its driver, its node's pool) and leaves the rest of the
// claim alone: evaluated on the status updates a plugin, a compromised one,
// and others make.
func TestHelmDRAClaimStatusPolicy(t *testing.T) {
	objs := renderWith(t, draValues(nil))
	p := checkClaimStatusScope(t, objs)

	sa := pluginAccount
	ready := func(msg string) []metav1.Condition {
		return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", Message: msg, LastTransitionTime: metav1.Unix(1767225600, 0)}}
	}
	own := func(pool, dev string) resourcev1.AllocatedDeviceStatus {
		return resourcev1.AllocatedDeviceStatus{Driver: draDriver, Pool: pool, Device: dev, Conditions: ready("prepared on node " + pool)}
	}
	nic := own("n1", "nic-0000-18-00-0")
	nic.NetworkData = &resourcev1.NetworkDeviceData{InterfaceName: "ibp24s0", HardwareAddress: "00:00:10:29:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1a:2b:10"}
	nic.Data = &runtime.RawExtension{Raw: []byte(`{"pciBusID":"0000:18:00.0"}`)}
	other := resourcev1.AllocatedDeviceStatus{Driver: "net.example.com", Pool: "n1", Device: "eth0", Conditions: ready("attached"),
		NetworkData: &resourcev1.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.0.0.2/24"}}}
	// claim is a claim allocated on n1 with status entries devs.
	claim := func(devs ...resourcev1.AllocatedDeviceStatus) *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{
			TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-c", ResourceVersion: "10", Labels: map[string]string{"app": "x"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-scheduler", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}}},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu." + draDriver}}}}},
			Status: resourcev1.ResourceClaimStatus{
				Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: draDriver, Pool: "n1", Device: "gpu-0"},
					{Request: "nic", Driver: draDriver, Pool: "n1", Device: "nic-0000-18-00-0"},
					{Request: "net", Driver: "net.example.com", Pool: "n1", Device: "eth0"},
				}}},
				ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "uid-p"}},
				Devices:     devs,
			},
		}
	}
	with := func(c *resourcev1.ResourceClaim, f func(*resourcev1.ResourceClaim)) *resourcev1.ResourceClaim {
		f(c)
		return c
	}
	before := claim(other)
	for _, tc := range []struct {
		name     string
		u        user.Info
		obj, old *resourcev1.ResourceClaim
		deny     string // part of the message; "" admits
	}{
		{"add own entries", onNode(sa, "n1"), claim(other, own("n1", "gpu-0"), nic), before, ""},
		{"add own entries before the other driver's", onNode(sa, "n1"), claim(nic, own("n1", "gpu-0"), other), before, ""},
		{"change own entries", onNode(sa, "n1"), claim(other, own("n1", "gpu-0")), claim(other, nic, own("n1", "gpu-0")), ""},
		{"the server's own fields change", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) {
			c.ResourceVersion = "11"
			c.ManagedFields = append(c.ManagedFields, metav1.ManagedFieldsEntry{Manager: "gpu-device-plugin", Operation: metav1.ManagedFieldsOperationApply, Subresource: "status"})
		}), before, ""},
		{"an entry in another node's pool", onNode(sa, "n1"), claim(other, own("n2", "gpu-0")), before, "may change only its own status.devices entries"},
		{"another driver's entry changed", onNode(sa, "n1"), claim(with(claim(other), func(c *resourcev1.ResourceClaim) {
			c.Status.Devices[0].NetworkData = &resourcev1.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.0.0.3/24"}}
		}).Status.Devices[0], nic), before, "not another driver's or node's"},
		{"another driver's entry removed", onNode(sa, "n1"), claim(nic), before, "not another driver's or node's"},
		{"an entry of another driver added", onNode(sa, "n1"), claim(other, resourcev1.AllocatedDeviceStatus{Driver: "net.example.com", Pool: "n1", Device: "eth1"}), before, "not another driver's or node's"},
		{"allocation changed", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) { c.Status.Allocation = nil }), before, "not status.allocation"},
		{"reservedFor changed", onNode(sa, "n1"), with(claim(other), func(c *resourcev1.ResourceClaim) { c.Status.ReservedFor = nil }), before, "not status.reservedFor"},
		{"labels changed", onNode(sa, "n1"), with(claim(other), func(c *resourcev1.ResourceClaim) { c.Labels = map[string]string{"app": "y"} }), before, "not metadata.labels"},
		{"spec changed", onNode(sa, "n1"), with(claim(other), func(c *resourcev1.ResourceClaim) { c.Spec.Devices.Requests[0].Name = "other" }), before, "not spec"},
		{"token without a node", onNode(sa, ""), claim(other, nic), before, "the token names no node"},
		// managedFields: no entry but the plugin's may be added or widened.
		{"another manager's entry added", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) {
			c.ManagedFields = append(c.ManagedFields, metav1.ManagedFieldsEntry{Manager: "net-driver", Operation: metav1.ManagedFieldsOperationApply, Subresource: "status",
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:devices":{"k:{\"device\":\"eth0\",\"driver\":\"net.example.com\",\"pool\":\"n1\"}":{}}}}`)}})
		}), before, "may not add or widen the entries of net-driver"},
		{"the scheduler's entry widened", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) {
			c.ManagedFields[0].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:reservedFor":{}}}`)}
		}), before, "may not add or widen the entries of kube-scheduler"},
		{"the scheduler's entry renamed", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) { c.ManagedFields[0].Manager = "kubectl" }),
			before, "may not add or widen the entries of kubectl"},
		{"the managedFields emptied", onNode(sa, "n1"), with(claim(other, nic), func(c *resourcev1.ResourceClaim) { c.ManagedFields = nil }), before, ""},
		// Not the plugin's account: the policy does not apply.
		{"another service account", onNode("system:serviceaccount:kube-system:other", "n1"), claim(own("n2", "gpu-0")), before, ""},
		{"a kubelet", &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes"}}, claim(own("n2", "gpu-0")), before, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := policyVerdictOn(t, p, resourcev1.SchemeGroupVersion.WithResource("resourceclaims"), resourcev1.SchemeGroupVersion.WithKind("ResourceClaim"),
				"c", "status", admission.Update, tc.u, tc.obj, tc.old)
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && got == "":
				t.Errorf("admitted, want denied with %q", tc.deny)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("denied with %q, want %q in the message", got, tc.deny)
			}
		})
	}
}

// The static DRA manifest holds what the chart renders with kubeletAPI:
// dra: every object, give or take Helm's own labels and the config
// checksum.
func TestHelmDRAMatchesManifest(t *testing.T) {
	chartObjs := renderWith(t, draValues(nil))
	static := readDRAManifest(t)
	if errs := static.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the DRA manifest:\n%v", errs.ToAggregate())
	}
	a, b := comparable(t, chartObjs), comparable(t, static)
	for key, got := range a {
		want, ok := b[key]
		if !ok {
			t.Errorf("the chart renders %s, the manifest has none", key)
			continue
		}
		if got != want {
			t.Errorf("%s differs\nchart:\n%s\nmanifest:\n%s", key, got, want)
		}
	}
	for key := range b {
		if _, ok := a[key]; !ok {
			t.Errorf("the manifest has %s, the chart renders none", key)
		}
	}
}

// TestManifestDRA checks the DRA manifest on its own terms, as
// TestManifestDaemonSet and TestManifestAcceptedByPlugin do the default one.
func TestManifestDRA(t *testing.T) {
	objs := readDRAManifest(t)
	if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 || len(objs.Services) != 0 {
		t.Fatalf("want one ConfigMap and one DaemonSet, got %d ConfigMaps, %d DaemonSets, %d Services",
			len(objs.ConfigMaps), len(objs.DaemonSets), len(objs.Services))
	}
	checkDRARBAC(t, objs, "kube-system", "gpu-device-plugin")
	checkDaemonSet(t, objs.DaemonSets[0], objs.ConfigMaps[0], defaultDRADaemonSet())
	checkPolicyScope(t, objs)
	checkClaimStatusScope(t, objs)
	checkAcceptedByPlugin(t, objs.DaemonSets[0], objs.ConfigMaps[0])
}

// comparable gives each object as YAML, by kind and name, without what
// only Helm adds; config.yaml is compared by content, not layout.
func comparable(t *testing.T, objs objects) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(kind string, o metav1.Object, v any) {
		labels := map[string]string{}
		for k, v := range o.GetLabels() {
			if k != "helm.sh/chart" && k != "app.kubernetes.io/managed-by" {
				labels[k] = v
			}
		}
		o.SetLabels(labels)
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[kind+" "+o.GetNamespace()+"/"+o.GetName()] = string(b)
	}
	for _, o := range objs.ServiceAccounts {
		c := o.DeepCopy()
		add("ServiceAccount", c, c)
	}
	for _, o := range objs.ClusterRoles {
		c := o.DeepCopy()
		add("ClusterRole", c, c)
	}
	for _, o := range objs.ClusterRoleBindings {
		c := o.DeepCopy()
		add("ClusterRoleBinding", c, c)
	}
	for _, o := range objs.Policies {
		c := o.DeepCopy()
		add("ValidatingAdmissionPolicy", c, c)
	}
	for _, o := range objs.PolicyBindings {
		c := o.DeepCopy()
		add("ValidatingAdmissionPolicyBinding", c, c)
	}
	for _, o := range objs.DeviceClasses {
		c := o.DeepCopy()
		add("DeviceClass", c, c)
	}
	for _, o := range objs.Services {
		c := o.DeepCopy()
		add("Service", c, c)
	}
	for _, o := range objs.ConfigMaps {
		c := o.DeepCopy()
		for k, v := range c.Data {
			var parsed any
			if err := yaml.Unmarshal([]byte(v), &parsed); err != nil {
				t.Fatalf("ConfigMap %s, %s: %v", c.Name, k, err)
			}
			b, _ := yaml.Marshal(parsed)
			c.Data[k] = string(b)
		}
		add("ConfigMap", c, c)
	}
	for _, o := range objs.DaemonSets {
		c := o.DeepCopy()
		delete(c.Spec.Template.Annotations, "checksum/config")
		if len(c.Spec.Template.Annotations) == 0 {
			c.Spec.Template.Annotations = nil
		}
		add("DaemonSet", c, c)
	}
	return out
}

// The node package documents DRA mode in its environment file with
// variables the plugin reads, and its unit lets the plugin write the
// kubelet's DRA directories (ProtectSystem=strict makes everything else
// read-only), in either mode.
func TestPackagingDRA(t *testing.T) {
	env := string(mustRead(t, repoPath(t, "packaging", "gpu-device-plugin.env")))
	var vars []string
	for _, want := range []string{"GPU_DEVICE_PLUGIN_KUBELET_API=dra", "GPU_DEVICE_PLUGIN_KUBECONFIG=/etc/kubernetes/kubelet.conf"} {
		if !strings.Contains(env, "#   "+want+"\n") {
			t.Errorf("packaging/gpu-device-plugin.env does not document %s", want)
		}
		vars = append(vars, want)
	}
	// Uncommented, they are accepted by the plugin with the shipped config.
	cmd := exec.Command(plugin(t), "version", "--config="+repoPath(t, "packaging", "config.yaml"))
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, vars...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("gpu-device-plugin version with %q: %v\n%s", vars, err, out)
	}
	// Set wrongly, the same variable is refused: the plugin does read it.
	// A new Cmd: one that has run cannot run again (it would fail anyway).
	cmd = exec.Command(plugin(t), "version", "--config="+repoPath(t, "packaging", "config.yaml"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GPU_DEVICE_PLUGIN_KUBELET_API=dra", "GPU_DEVICE_PLUGIN_KUBECONFIG=relative/kubelet.conf"}
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("a relative GPU_DEVICE_PLUGIN_KUBECONFIG was accepted: the variable is not read\n%s", out)
	}

	unit := string(mustRead(t, repoPath(t, "packaging", "gpu-device-plugin.service")))
	var rw, mkdir []string
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(line, "ReadWritePaths="); ok {
			for _, p := range strings.Fields(v) {
				rw = append(rw, strings.TrimPrefix(p, "-"))
			}
		}
		if v, ok := strings.CutPrefix(line, "ExecStartPre=+/bin/mkdir -p "); ok {
			mkdir = append(mkdir, strings.Fields(v)...)
		}
	}
	d := config.Default()
	for _, dir := range []string{d.DevicePluginDir, d.DRAPluginDir, d.PluginRegistryDir, d.CDISpecDir} {
		if !slices.Contains(rw, dir) {
			t.Errorf("the unit's ReadWritePaths= %q lack %s", rw, dir)
		}
		// A ReadWritePaths= entry missing when the unit starts is skipped.
		if !slices.Contains(mkdir, dir) {
			t.Errorf("the unit's ExecStartPre= does not create %s before the sandbox is set up", dir)
		}
	}
}

// computeDomains.enabled: the channel class the controller's templates
// name, the plugin's settings from the downward API, and its RBAC on
// ComputeDomains; off by default.
func TestHelmDRAComputeDomains(t *testing.T) {
	off := renderWith(t, draValues(nil))
	for _, dc := range off.DeviceClasses {
		if strings.HasPrefix(dc.Name, "compute-domain-channel.") {
			t.Errorf("DeviceClass %s rendered with computeDomains off", dc.Name)
		}
	}
	objs := renderWith(t, draValues(chartutil.Values{"computeDomains": map[string]any{"enabled": true}}))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	var class *resourcev1.DeviceClass
	for _, dc := range objs.DeviceClasses {
		if dc.Name == "compute-domain-channel."+draDriver {
			class = dc
		}
	}
	if class == nil || !strings.Contains(class.Spec.Selectors[0].CEL.Expression, `.type == "channel"`) {
		t.Fatalf("channel DeviceClass = %+v", class)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range objs.DaemonSets[0].Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if env["GPU_DEVICE_PLUGIN_IMEX_COMPUTE_DOMAINS"].Value != "true" {
		t.Error("imex.computeDomains not set")
	}
	if ip := env["GPU_DEVICE_PLUGIN_IMEX_NODE_IP"]; ip.ValueFrom == nil || ip.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("imex.nodeIP = %+v, want the pod's status.hostIP", ip)
	}
	verbs := map[string][]string{}
	for _, cr := range objs.ClusterRoles {
		if cr.Name == cdController { // the controller's own: computedomain_test.go
			continue
		}
		for _, r := range cr.Rules {
			if slices.Contains(r.APIGroups, "gpu-device-plugin.github.io") {
				for _, res := range r.Resources {
					verbs[res] = append(verbs[res], r.Verbs...)
				}
			}
		}
	}
	if !slices.Equal(verbs["computedomains"], []string{"get", "list", "watch"}) || !slices.Equal(verbs["computedomains/status"], []string{"patch"}) {
		t.Errorf("ComputeDomain RBAC = %v", verbs)
	}
}

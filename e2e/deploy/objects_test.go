package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/admissionregistration"
	_ "k8s.io/kubernetes/pkg/apis/admissionregistration/install"
	admissionregistrationvalidation "k8s.io/kubernetes/pkg/apis/admissionregistration/validation"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/rbac"
	_ "k8s.io/kubernetes/pkg/apis/rbac/install"
	rbacvalidation "k8s.io/kubernetes/pkg/apis/rbac/validation"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	resourcevalidation "k8s.io/kubernetes/pkg/apis/resource/validation"
	"k8s.io/kubernetes/pkg/capabilities"
	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// objects are the Kubernetes objects of one manifest stream, by kind.
type objects struct {
	ConfigMaps []*corev1.ConfigMap
	// DaemonSets are the plugin's; Launchers the MPS launcher's
	// (app.kubernetes.io/component: mps-launcher).
	DaemonSets []*appsv1.DaemonSet
	Launchers  []*appsv1.DaemonSet
	Services   []*corev1.Service

	// DRA mode's (kubeletAPI: dra).
	ServiceAccounts     []*corev1.ServiceAccount
	ClusterRoles        []*rbacv1.ClusterRole
	ClusterRoleBindings []*rbacv1.ClusterRoleBinding
	// In the release namespace: nodeLabels.mode nodefeature's, and the
	// ComputeDomain controller's Lease's.
	Roles          []*rbacv1.Role
	RoleBindings   []*rbacv1.RoleBinding
	Policies       []*admissionregistrationv1.ValidatingAdmissionPolicy
	PolicyBindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	DeviceClasses  []*resourcev1.DeviceClass

	// computeDomains.enabled's controller.
	Deployments []*appsv1.Deployment

	// The monitoring values' (metrics.serviceMonitor, .prometheusRule,
	// .dashboard): Dashboards are the ConfigMaps of component dashboard.
	ServiceMonitors []*monitoringv1.ServiceMonitor
	PrometheusRules []*monitoringv1.PrometheusRule
	Dashboards      []*corev1.ConfigMap
}

// decodeStrict splits a YAML stream into documents and decodes each into
// its k8s.io/api type, failing on unknown fields, duplicate keys, trailing
// data and kinds this project does not ship.
func decodeStrict(source string, stream []byte) (objects, error) {
	var out objects
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			plugins := out.DaemonSets[:0]
			for _, ds := range out.DaemonSets {
				if ds.Labels["app.kubernetes.io/component"] == launcherComponent {
					out.Launchers = append(out.Launchers, ds)
				} else {
					plugins = append(plugins, ds)
				}
			}
			out.DaemonSets = plugins
			configs := out.ConfigMaps[:0]
			for _, cm := range out.ConfigMaps {
				if cm.Labels["app.kubernetes.io/component"] == dashboardComponent {
					out.Dashboards = append(out.Dashboards, cm)
				} else {
					configs = append(configs, cm)
				}
			}
			out.ConfigMaps = configs
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return out, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments
		}
		var tm struct{ APIVersion, Kind string }
		if err := json.Unmarshal(js, &tm); err != nil {
			return out, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		var target any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			out.ConfigMaps, target = append(out.ConfigMaps, o), o
		case "apps/v1/DaemonSet":
			o := &appsv1.DaemonSet{}
			out.DaemonSets, target = append(out.DaemonSets, o), o
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			out.Deployments, target = append(out.Deployments, o), o
		case "rbac.authorization.k8s.io/v1/Role":
			o := &rbacv1.Role{}
			out.Roles, target = append(out.Roles, o), o
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			o := &rbacv1.RoleBinding{}
			out.RoleBindings, target = append(out.RoleBindings, o), o
		case "v1/Service":
			o := &corev1.Service{}
			out.Services, target = append(out.Services, o), o
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			out.ServiceAccounts, target = append(out.ServiceAccounts, o), o
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			o := &rbacv1.ClusterRole{}
			out.ClusterRoles, target = append(out.ClusterRoles, o), o
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			out.ClusterRoleBindings, target = append(out.ClusterRoleBindings, o), o
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
			o := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			out.Policies, target = append(out.Policies, o), o
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
			o := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			out.PolicyBindings, target = append(out.PolicyBindings, o), o
		case "resource.k8s.io/v1/DeviceClass":
			o := &resourcev1.DeviceClass{}
			out.DeviceClasses, target = append(out.DeviceClasses, o), o
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			out.ServiceMonitors, target = append(out.ServiceMonitors, o), o
		case "monitoring.coreos.com/v1/PrometheusRule":
			o := &monitoringv1.PrometheusRule{}
			out.PrometheusRules, target = append(out.PrometheusRules, o), o
		default:
			return out, fmt.Errorf("%s: document %d: unexpected %s %s", source, i, tm.APIVersion, tm.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(target); err != nil {
			return out, fmt.Errorf("%s: document %d (%s): %w", source, i, tm.Kind, err)
		}
		if dec.More() {
			return out, fmt.Errorf("%s: document %d (%s): trailing data", source, i, tm.Kind)
		}
	}
}

// validate runs the API server's validation on every object, after the
// API server's defaulting, as `kubectl apply` would have it done. The API
// server is taken to run with --allow-privileged=true, as kubeadm and
// every managed Kubernetes set it.
func (o objects) validate() field.ErrorList {
	capabilities.Setup(true, 0)
	var errs field.ErrorList
	for _, cm := range slices.Concat(o.ConfigMaps, o.Dashboards) {
		var in core.ConfigMap
		errs = append(errs, convert(cm.DeepCopy(), &in)...)
		errs = append(errs, prefix("ConfigMap "+cm.Name, corevalidation.ValidateConfigMap(&in))...)
	}
	for _, ds := range slices.Concat(o.DaemonSets, o.Launchers) {
		var in apps.DaemonSet
		errs = append(errs, convert(ds.DeepCopy(), &in)...)
		errs = append(errs, prefix("DaemonSet "+ds.Name, appsvalidation.ValidateDaemonSet(&in, corevalidation.PodValidationOptions{}))...)
	}
	for _, d := range o.Deployments {
		var in apps.Deployment
		errs = append(errs, convert(d.DeepCopy(), &in)...)
		errs = append(errs, prefix("Deployment "+d.Name, appsvalidation.ValidateDeployment(&in, corevalidation.PodValidationOptions{}))...)
	}
	for _, r := range o.Roles {
		var in rbac.Role
		errs = append(errs, convert(r.DeepCopy(), &in)...)
		errs = append(errs, prefix("Role "+r.Name, rbacvalidation.ValidateRole(&in))...)
	}
	for _, rb := range o.RoleBindings {
		var in rbac.RoleBinding
		errs = append(errs, convert(rb.DeepCopy(), &in)...)
		errs = append(errs, prefix("RoleBinding "+rb.Name, rbacvalidation.ValidateRoleBinding(&in))...)
	}
	for _, svc := range o.Services {
		var in core.Service
		errs = append(errs, convert(svc.DeepCopy(), &in)...)
		errs = append(errs, prefix("Service "+svc.Name, corevalidation.ValidateServiceCreate(&in))...)
	}
	for _, sa := range o.ServiceAccounts {
		var in core.ServiceAccount
		errs = append(errs, convert(sa.DeepCopy(), &in)...)
		errs = append(errs, prefix("ServiceAccount "+sa.Name, corevalidation.ValidateServiceAccount(&in))...)
	}
	for _, cr := range o.ClusterRoles {
		var in rbac.ClusterRole
		errs = append(errs, convert(cr.DeepCopy(), &in)...)
		errs = append(errs, prefix("ClusterRole "+cr.Name, rbacvalidation.ValidateClusterRole(&in, rbacvalidation.ClusterRoleValidationOptions{}))...)
	}
	for _, crb := range o.ClusterRoleBindings {
		var in rbac.ClusterRoleBinding
		errs = append(errs, convert(crb.DeepCopy(), &in)...)
		errs = append(errs, prefix("ClusterRoleBinding "+crb.Name, rbacvalidation.ValidateClusterRoleBinding(&in))...)
	}
	for _, r := range o.Roles {
		var in rbac.Role
		errs = append(errs, convert(r.DeepCopy(), &in)...)
		errs = append(errs, prefix("Role "+r.Name, rbacvalidation.ValidateRole(&in))...)
	}
	for _, rb := range o.RoleBindings {
		var in rbac.RoleBinding
		errs = append(errs, convert(rb.DeepCopy(), &in)...)
		errs = append(errs, prefix("RoleBinding "+rb.Name, rbacvalidation.ValidateRoleBinding(&in))...)
	}
	// These compile every CEL expression, as the API server does on create.
	for _, p := range o.Policies {
		var in admissionregistration.ValidatingAdmissionPolicy
		errs = append(errs, convert(p.DeepCopy(), &in)...)
		errs = append(errs, prefix("ValidatingAdmissionPolicy "+p.Name, admissionregistrationvalidation.ValidateValidatingAdmissionPolicy(&in))...)
	}
	for _, b := range o.PolicyBindings {
		var in admissionregistration.ValidatingAdmissionPolicyBinding
		errs = append(errs, convert(b.DeepCopy(), &in)...)
		errs = append(errs, prefix("ValidatingAdmissionPolicyBinding "+b.Name, admissionregistrationvalidation.ValidateValidatingAdmissionPolicyBinding(&in))...)
	}
	for _, dc := range o.DeviceClasses {
		var in resource.DeviceClass
		errs = append(errs, convert(dc.DeepCopy(), &in)...)
		errs = append(errs, prefix("DeviceClass "+dc.Name, resourcevalidation.ValidateDeviceClass(&in))...)
	}
	// No API server code validates the Prometheus Operator's kinds: their
	// metadata as any object's, their durations and rules as the operator
	// reads them (monitoring_test.go).
	for _, sm := range o.ServiceMonitors {
		errs = append(errs, prefix("ServiceMonitor "+sm.Name, apimachineryvalidation.ValidateObjectMeta(&sm.ObjectMeta, true, apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata")))...)
		errs = append(errs, prefix("ServiceMonitor "+sm.Name, validateServiceMonitor(sm))...)
	}
	for _, pr := range o.PrometheusRules {
		errs = append(errs, prefix("PrometheusRule "+pr.Name, apimachineryvalidation.ValidateObjectMeta(&pr.ObjectMeta, true, apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata")))...)
		errs = append(errs, prefix("PrometheusRule "+pr.Name, validatePrometheusRule(pr))...)
	}
	return errs
}

// convert defaults a copy of a versioned object and converts it to the
// internal type the validation takes.
func convert(versioned runtime.Object, internal any) field.ErrorList {
	legacyscheme.Scheme.Default(versioned)
	if err := legacyscheme.Scheme.Convert(versioned, internal, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	return nil
}

func prefix(what string, errs field.ErrorList) field.ErrorList {
	for _, e := range errs {
		e.Field = what + ": " + e.Field
	}
	return errs
}

// repoPath is a path inside the repository.
func repoPath(t *testing.T, parts ...string) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(append([]string{root}, parts...)...)
}

// flagValue is the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

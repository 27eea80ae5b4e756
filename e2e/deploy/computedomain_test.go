package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

const cdController = "gpu-device-plugin-compute-domain-controller"

// cdValues is DRA mode with ComputeDomains on, and vals over
// computeDomains.controller.
func cdValues(controller map[string]any) chartutil.Values {
	cd := map[string]any{"enabled": true}
	if controller != nil {
		cd["controller"] = controller
	}
	return draValues(chartutil.Values{"computeDomains": cd})
}

// cdControllerObjects renders the chart with ComputeDomains on and
// returns its controller Deployment, after the API server's validation.
func cdControllerObjects(t *testing.T, controller map[string]any) (objects, *appsv1.Deployment) {
	t.Helper()
	objs := renderWith(t, cdValues(controller))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	if len(objs.Deployments) != 1 || objs.Deployments[0].Name != cdController {
		t.Fatalf("want one Deployment %s, got %d", cdController, len(objs.Deployments))
	}
	return objs, objs.Deployments[0]
}

// TestHelmComputeDomainControllerOff: no controller, roles or policy
// without computeDomains.enabled, nor in device-plugin mode.
func TestHelmComputeDomainControllerOff(t *testing.T) {
	for name, vals := range map[string]chartutil.Values{
		"DRA mode, computeDomains off":       draValues(nil),
		"device-plugin mode, computeDomains": {"computeDomains": map[string]any{"enabled": true}},
	} {
		objs := renderWith(t, vals)
		if len(objs.Deployments)+len(objs.Roles)+len(objs.RoleBindings) != 0 {
			t.Errorf("%s: %d Deployments, %d Roles, %d RoleBindings rendered", name, len(objs.Deployments), len(objs.Roles), len(objs.RoleBindings))
		}
		for _, cr := range objs.ClusterRoles {
			if cr.Name == cdController {
				t.Errorf("%s: ClusterRole %s rendered", name, cr.Name)
			}
		}
		for _, p := range objs.Policies {
			if strings.HasSuffix(p.Name, "-compute-domain-status") {
				t.Errorf("%s: policy %s rendered", name, p.Name)
			}
		}
	}
}

// TestHelmComputeDomainControllerRBAC: the controller's RBAC is exactly
// the calls internal/control/computedomain makes: the domains read and
// their top-level status applied, the channel templates read and created,
// the slices listed, Events created, and its Lease in the release
// namespace only.
func TestHelmComputeDomainControllerRBAC(t *testing.T) {
	objs, _ := cdControllerObjects(t, nil)
	var sa *corev1.ServiceAccount
	for _, s := range objs.ServiceAccounts {
		if s.Name == cdController {
			sa = s
		}
	}
	if sa == nil || sa.Namespace != releaseNamespace {
		t.Fatalf("no ServiceAccount %s in %s", cdController, releaseNamespace)
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: cdController, Namespace: releaseNamespace}}

	wantCluster := []rbacv1.PolicyRule{
		{APIGroups: []string{"gpu-device-plugin.github.io"}, Resources: []string{"computedomains"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"gpu-device-plugin.github.io"}, Resources: []string{"computedomains/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaimtemplates"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
	var bound []string
	for _, crb := range objs.ClusterRoleBindings {
		if reflect.DeepEqual(crb.Subjects, subject) {
			bound = append(bound, crb.RoleRef.Name)
		}
	}
	if !slices.Equal(bound, []string{cdController}) {
		t.Fatalf("the controller's account is bound to ClusterRoles %v, want only %s", bound, cdController)
	}
	for _, cr := range objs.ClusterRoles {
		if cr.Name == cdController && !reflect.DeepEqual(cr.Rules, wantCluster) {
			t.Errorf("ClusterRole %s:\n got %+v\nwant %+v", cr.Name, cr.Rules, wantCluster)
		}
	}

	wantRole := []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{cdController}, Verbs: []string{"get", "update"}},
	}
	if len(objs.Roles) != 1 || len(objs.RoleBindings) != 1 {
		t.Fatalf("%d Roles and %d RoleBindings, want one each (the Lease's)", len(objs.Roles), len(objs.RoleBindings))
	}
	r, rb := objs.Roles[0], objs.RoleBindings[0]
	if r.Namespace != releaseNamespace || !reflect.DeepEqual(r.Rules, wantRole) {
		t.Errorf("Role %s/%s:\n got %+v\nwant %+v in %s", r.Namespace, r.Name, r.Rules, wantRole, releaseNamespace)
	}
	if rb.Namespace != releaseNamespace || rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != r.Name || !reflect.DeepEqual(rb.Subjects, subject) {
		t.Errorf("RoleBinding %+v, want the Role bound to the controller's account in %s", rb, releaseNamespace)
	}
}

// TestHelmComputeDomainControllerDeployment: the controller runs from the
// plugin's image as its own account, unprivileged, with the replicas
// asked for, and its pods are none of the DaemonSets' or the Service's.
func TestHelmComputeDomainControllerDeployment(t *testing.T) {
	objs, d := cdControllerObjects(t, nil)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1 by default", d.Spec.Replicas)
	}
	// values-all.yaml's controller values reach the Deployment.
	all := readValues(t, filepath.Join("testdata", "values-all.yaml"))
	ctl := all["computeDomains"].(map[string]any)["controller"].(map[string]any)
	_, d2 := cdControllerObjects(t, ctl)
	if *d2.Spec.Replicas != 2 {
		t.Errorf("computeDomains.controller.replicas=2 renders %d", *d2.Spec.Replicas)
	}
	if r := d2.Spec.Template.Spec.Containers[0].Resources; r.Requests.Cpu().String() != "20m" || r.Requests.Memory().String() != "48Mi" || r.Limits.Memory().String() != "96Mi" {
		t.Errorf("computeDomains.controller.resources render %+v, want values-all.yaml's", r)
	}
	pod := d.Spec.Template
	if pod.Spec.ServiceAccountName != cdController {
		t.Errorf("serviceAccountName %q, want %s", pod.Spec.ServiceAccountName, cdController)
	}
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Volumes) != 0 {
		t.Fatalf("want one container and no volumes: %+v", pod.Spec)
	}
	c := pod.Spec.Containers[0]
	if plugin := objs.DaemonSets[0].Spec.Template.Spec.Containers[0]; c.Image != plugin.Image || c.ImagePullPolicy != plugin.ImagePullPolicy {
		t.Errorf("image %s (%s), want the plugin's %s (%s)", c.Image, c.ImagePullPolicy, plugin.Image, plugin.ImagePullPolicy)
	}
	// The controller's own executable; gpu-device-plugin-dra's
	// compute-domain-controller is only for charts of earlier releases.
	if !slices.Equal(c.Command, []string{imageControllerPath}) || slices.Contains(c.Args, "compute-domain-controller") || !slices.Contains(c.Args, "--lease-name="+cdController) {
		t.Errorf("command %v args %v, want %s --lease-name=%s", c.Command, c.Args, imageControllerPath, cdController)
	}
	ps, cs := pod.Spec.SecurityContext, c.SecurityContext
	switch {
	case ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0:
		t.Errorf("pod securityContext %+v, want runAsNonRoot and a non-root user", ps)
	case ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("seccompProfile %+v, want RuntimeDefault", ps.SeccompProfile)
	case cs == nil || cs.Privileged != nil && *cs.Privileged || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation:
		t.Errorf("container securityContext %+v: want unprivileged, no privilege escalation", cs)
	case cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem:
		t.Error("root filesystem not read-only")
	case cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(cs.Capabilities.Add) != 0:
		t.Errorf("capabilities %+v, want ALL dropped and none added", cs.Capabilities)
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Error("the controller shares a host namespace")
	}
	// The controller serves no endpoint a probe could ask.
	if c.LivenessProbe != nil || c.ReadinessProbe != nil || len(c.Ports) != 0 {
		t.Errorf("probes or ports on a controller that serves none: %+v %+v %v", c.LivenessProbe, c.ReadinessProbe, c.Ports)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want memory requested and limited", c.Resources)
	}
	podLabels := labels.Set(pod.Labels)
	for _, ds := range objs.DaemonSets {
		if labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).Matches(podLabels) {
			t.Errorf("DaemonSet %s selects the controller's pods (%v)", ds.Name, pod.Labels)
		}
	}
	for _, svc := range objs.Services {
		if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s selects the controller's pods (%v)", svc.Name, pod.Labels)
		}
	}
}

// TestHelmComputeDomainControllerFlags: the Deployment's command line and
// environment pass the controller's own flag parsing and checks (the
// binary as make builds it), which then fails at its first API step, on
// the kubeconfig this test adds; and its Lease is the one the Role names.
func TestHelmComputeDomainControllerFlags(t *testing.T) {
	objs, d := cdControllerObjects(t, nil)
	c := d.Spec.Template.Spec.Containers[0]
	if lease, _ := flagValue(c.Args, "lease-name"); !slices.Contains(objs.Roles[0].Rules[1].ResourceNames, lease) {
		t.Errorf("--lease-name=%q, the Role grants get and update on %v", lease, objs.Roles[0].Rules[1].ResourceNames)
	}
	env := []string{"PATH=/usr/bin:/bin"}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, e.Name+"="+releaseNamespace)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"="+cdController+"-5d8f7c9b4-x2x7q")
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			env = append(env, fmt.Sprintf("%s=%d", e.Name, c.Resources.Limits.Memory().Value()))
		default:
			t.Errorf("env %s: a source this test does not resolve: %+v", e.Name, e.ValueFrom)
		}
	}
	bin := filepath.Join(draBuild(t), filepath.Base(c.Command[0]))
	runController := func(args []string) string {
		cmd := exec.Command(bin, append(slices.Clone(args), "--kubeconfig=/nonexistent/kubeconfig")...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		var exit *exec.ExitError
		if err := cmd.Run(); !errors.As(err, &exit) {
			t.Fatalf("%s %v: %v, want a non-zero exit (no kubeconfig)\n%s", bin, args, err, out.String())
		}
		return out.String()
	}
	if out := runController(c.Args); !strings.Contains(out, "API access") || !strings.Contains(out, "/nonexistent/kubeconfig") {
		t.Errorf("the Deployment's flags did not get past the controller's checks to its API access:\n%s", out)
	}
	// The same run notices a flag it does not know: the check above can fail.
	if out := runController(append(slices.Clone(c.Args), "--lease=x")); !strings.Contains(out, "flag provided but not defined: -lease") {
		t.Errorf("an unknown flag was not refused:\n%s", out)
	}
}

// computeDomainPolicy renders the chart with ComputeDomains on and returns
// its status policy, checking what it applies to and whom.
func computeDomainPolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	objs, _ := cdControllerObjects(t, nil)
	i := slices.IndexFunc(objs.Policies, func(p *admissionregistrationv1.ValidatingAdmissionPolicy) bool {
		return strings.HasSuffix(p.Name, "-compute-domain-status")
	})
	if i < 0 {
		t.Fatal("no …-compute-domain-status policy")
	}
	p := objs.Policies[i]
	if !slices.ContainsFunc(objs.PolicyBindings, func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool {
		return b.Spec.PolicyName == p.Name && slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) &&
			b.Spec.MatchResources == nil && b.Spec.ParamRef == nil
	}) {
		t.Errorf("policy %s has no binding with Deny everywhere", p.Name)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", p.Spec.FailurePolicy)
	}
	r := p.Spec.MatchConstraints.ResourceRules
	if len(r) != 1 || !slices.Equal(r[0].APIGroups, []string{"gpu-device-plugin.github.io"}) || !slices.Equal(r[0].Resources, []string{"computedomains/status"}) ||
		!slices.Equal(r[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) || !slices.Equal(r[0].APIVersions, []string{"*"}) {
		t.Errorf("rules %+v, want UPDATE of computedomains/status in every version", r)
	}
	return p
}

// busyDomainJSON is a ComputeDomain as a running cluster has it: the
// user's spec, the controller's top-level status, node n2's entry, and
// each writer's managedFields entry.
const busyDomainJSON = `{
  "apiVersion": "gpu-device-plugin.github.io/v1alpha1", "kind": "ComputeDomain",
  "metadata": {
    "name": "training", "namespace": "team-a", "uid": "uid-d", "resourceVersion": "1000", "generation": 1,
    "creationTimestamp": "2026-05-01T12:00:00Z", "labels": {"team": "a"},
    "managedFields": [
      {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "gpu-device-plugin.github.io/v1alpha1",
       "time": "2026-05-01T12:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}, "f:spec": {"f:numNodes": {}, "f:channel": {}}}},
      {"manager": "gpu-device-plugin-compute-domain-controller", "operation": "Apply", "apiVersion": "gpu-device-plugin.github.io/v1alpha1",
       "time": "2026-05-01T12:00:01Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:status": {}, "f:reason": {}, "f:message": {}}}, "subresource": "status"},
      {"manager": "gpu-device-plugin-node-n2", "operation": "Apply", "apiVersion": "gpu-device-plugin.github.io/v1alpha1",
       "time": "2026-05-01T12:00:02Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:nodes": {"k:{\"name\":\"n2\"}": {".": {}, "f:name": {}, "f:ipAddress": {}, "f:cliqueID": {}, "f:status": {}, "f:heartbeat": {}}}}}, "subresource": "status"}
    ]
  },
  "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "training-channel"}, "allocationMode": "Single"}},
  "status": {
    "status": "NotReady", "reason": "WaitingForNodes", "message": "1 of 2 nodes joined",
    "nodes": [{"name": "n2", "ipAddress": "10.0.0.2", "cliqueID": "c1.1", "status": "Ready", "heartbeat": "2026-05-01T12:00:02Z"}]
  }
}`

func busyDomain(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON([]byte(busyDomainJSON)); err != nil {
		t.Fatal(err)
	}
	return u
}

func nodeEntry(name, ip string) map[string]any {
	return map[string]any{"name": name, "ipAddress": ip, "cliqueID": "c1.1", "status": "NotReady", "reason": "DaemonNotReady", "heartbeat": "2026-05-01T12:05:00Z"}
}

func domainNodes(u *unstructured.Unstructured) []any {
	n, _, _ := unstructured.NestedSlice(u.Object, "status", "nodes")
	return n
}

func setDomainNodes(t *testing.T, u *unstructured.Unstructured, nodes ...any) {
	t.Helper()
	if err := unstructured.SetNestedSlice(u.Object, nodes, "status", "nodes"); err != nil {
		t.Fatal(err)
	}
}

// nodeApplied is what the API server admits after node's apply of its
// entry: a new resourceVersion and node's own managedFields entry.
func nodeApplied(t *testing.T, u *unstructured.Unstructured, node string) {
	t.Helper()
	u.SetResourceVersion("1001")
	mf := u.Object["metadata"].(map[string]any)["managedFields"].([]any)
	mf = append(mf, map[string]any{"manager": "gpu-device-plugin-node-" + node, "operation": "Apply", "apiVersion": "gpu-device-plugin.github.io/v1alpha1",
		"time": "2026-05-01T12:05:00Z", "fieldsType": "FieldsV1", "subresource": "status",
		"fieldsV1": map[string]any{"f:status": map[string]any{"f:nodes": map[string]any{`k:{"name":"` + node + `"}`: map[string]any{".": map[string]any{}, "f:name": map[string]any{}}}}}})
	u.Object["metadata"].(map[string]any)["managedFields"] = mf
}

// TestHelmComputeDomainStatusPolicy: the node plugin's account may add,
// change and remove only the status.nodes entry of the node its token
// names; other nodes' entries, the controller's top-level status and
// everything else stay, evaluated as the API server's admission plugin
// does. The controller's own account is not matched.
func TestHelmComputeDomainStatusPolicy(t *testing.T) {
	p := computeDomainPolicy(t)
	plugin := "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin"
	onNode := func(node string) user.Info {
		extra := map[string][]string{}
		if node != "" {
			extra["authentication.kubernetes.io/node-name"] = []string{node}
		}
		return &user.DefaultInfo{Name: plugin, Extra: extra}
	}
	controller := &user.DefaultInfo{Name: "system:serviceaccount:" + releaseNamespace + ":" + cdController}
	addOwn := func(u *unstructured.Unstructured) {
		setDomainNodes(t, u, append(domainNodes(u), nodeEntry("n1", "10.0.0.1"))...)
		nodeApplied(t, u, "n1")
	}
	withOwn := func(u *unstructured.Unstructured) {
		setDomainNodes(t, u, append(domainNodes(u), nodeEntry("n1", "10.0.0.1"))...)
	}
	const notOurs = "may change only its own entry in a ComputeDomain's status.nodes, not "
	const others = "may write only its own entry in a ComputeDomain's status.nodes, not the entries of "

	for _, tc := range []struct {
		name   string
		u      user.Info
		old    func(*unstructured.Unstructured) // the stored domain, from busyDomain
		change func(*unstructured.Unstructured) // what the write changes
		deny   string                           // what the refusal says; "" when allowed
	}{
		// Allowed: the node's own entry, added, changed, removed.
		{"own entry added", onNode("n1"), nil, addOwn, ""},
		{"own entry added before the others", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			setDomainNodes(t, u, append([]any{nodeEntry("n1", "10.0.0.1")}, domainNodes(u)...)...)
			nodeApplied(t, u, "n1")
		}, ""},
		{"own heartbeat and readiness", onNode("n1"), withOwn, func(u *unstructured.Unstructured) {
			e := domainNodes(u)[1].(map[string]any)
			e["heartbeat"], e["status"] = "2026-05-01T12:06:00Z", "Ready"
			delete(e, "reason")
			setDomainNodes(t, u, domainNodes(u)[0], e)
			nodeApplied(t, u, "n1")
		}, ""},
		{"own entry removed", onNode("n1"), withOwn, func(u *unstructured.Unstructured) {
			setDomainNodes(t, u, domainNodes(u)[0])
			nodeApplied(t, u, "n1")
		}, ""},
		{"own entry in a domain of 18 nodes", onNode("n1"), func(u *unstructured.Unstructured) {
			for i := 3; i <= 18; i++ {
				setDomainNodes(t, u, append(domainNodes(u), nodeEntry(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i)))...)
			}
		}, addOwn, ""},
		{"the controller, top-level status", controller, nil, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "Ready", "status", "status")
		}, ""},

		// Who may write.
		{"token without a node", onNode(""), nil, addOwn, "the token names no node"},
		{"as another node", onNode("n3"), nil, addOwn, others + "n1"},

		// Other nodes' entries.
		{"another node's entry changed", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			addOwn(u)
			nodes := domainNodes(u) // a copy
			nodes[0].(map[string]any)["ipAddress"] = "192.0.2.1"
			setDomainNodes(t, u, nodes...)
		}, others + "n2"},
		{"another node's entry added", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			addOwn(u)
			setDomainNodes(t, u, append(domainNodes(u), nodeEntry("n3", "10.0.0.3"))...)
		}, others + "n3"},
		{"another node's entry removed", onNode("n1"), withOwn, func(u *unstructured.Unstructured) {
			setDomainNodes(t, u, domainNodes(u)[1])
			nodeApplied(t, u, "n1")
		}, others + "n2"},
		{"every entry removed", onNode("n1"), withOwn, func(u *unstructured.Unstructured) {
			unstructured.RemoveNestedField(u.Object, "status", "nodes")
		}, others + "n2"},

		// The controller's top-level status, and the rest of the domain.
		{"status.status", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			addOwn(u)
			_ = unstructured.SetNestedField(u.Object, "Ready", "status", "status")
		}, notOurs + "status.status"},
		{"reason and message", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "DomainReady", "status", "reason")
			unstructured.RemoveNestedField(u.Object, "status", "message")
		}, notOurs + "status.reason, status.message"},
		{"a top-level status field added", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "x", "status", "conditions")
		}, notOurs + "status.conditions"},
		{"spec", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(18), "spec", "numNodes")
		}, notOurs + "spec"},
		{"a label", onNode("n1"), nil, func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"team": "b"}) }, notOurs + "metadata.labels"},
		{"a finalizer", onNode("n1"), nil, func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"example.com/keep"}) }, notOurs + "metadata.finalizers"},

		// managedFields: the controller's entry widened to own n2's entry,
		// or another node's entry made up, would make that writer's next
		// apply remove what it did not write.
		{"the controller's entry widened", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			addOwn(u)
			mf := u.Object["metadata"].(map[string]any)["managedFields"].([]any)
			mf[1].(map[string]any)["fieldsV1"] = map[string]any{"f:status": map[string]any{"f:status": map[string]any{}, "f:nodes": map[string]any{}}}
		}, "may not add or widen the entries of gpu-device-plugin-compute-domain-controller"},
		{"another node's manager entry made up", onNode("n1"), nil, func(u *unstructured.Unstructured) {
			addOwn(u)
			nodeApplied(t, u, "n3")
		}, "may not add or widen the entries of gpu-device-plugin-node-n3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := busyDomain(t)
			if tc.old != nil {
				tc.old(old)
			}
			obj := old.DeepCopy()
			tc.change(obj)
			got := policyVerdictOn(t, p, schema.GroupVersionResource{Group: "gpu-device-plugin.github.io", Version: "v1alpha1", Resource: "computedomains"},
				obj.GroupVersionKind(), obj.GetName(), "status", admission.Update, tc.u, obj, old)
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("verdict %q, want denied with %q", got, tc.deny)
			}
		})
	}
}

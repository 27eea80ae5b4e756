package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"helm.sh/helm/v3/pkg/chartutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/cordon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// cordonValues is vals with remediation.cordon on.
func cordonValues(vals chartutil.Values) chartutil.Values {
	out := chartutil.Values{"remediation": map[string]any{"cordon": true}}
	maps.Copy(out, vals)
	return out
}

// wantCordonRules is remediation.cordon's RBAC, exactly: read the Node,
// patch it. No update, no nodes/status, no list.
var wantCordonRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}}}

// policyNamed is the policy of objs whose name ends in suffix, checked to
// be bound with Deny, to fail closed, and to apply to every UPDATE of
// nodes in the core group.
func policyNamed(t *testing.T, objs objects, suffix string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	var p *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, x := range objs.Policies {
		if strings.HasSuffix(x.Name, suffix) {
			p = x
		}
	}
	if p == nil {
		t.Fatalf("no policy *%s among %d", suffix, len(objs.Policies))
	}
	bound := slices.ContainsFunc(objs.PolicyBindings, func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool {
		return b.Spec.PolicyName == p.Name && b.Spec.MatchResources == nil && b.Spec.ParamRef == nil &&
			slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny})
	})
	if !bound {
		t.Errorf("policy %s has no binding of its own with Deny", p.Name)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail: a policy that cannot run must not let writes through", p.Spec.FailurePolicy)
	}
	r := p.Spec.MatchConstraints.ResourceRules
	if len(r) != 1 || !slices.Equal(r[0].Resources, []string{"nodes"}) || !slices.Equal(r[0].APIGroups, []string{""}) ||
		!slices.Equal(r[0].APIVersions, []string{"*"}) || !slices.Equal(r[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) {
		t.Errorf("rules %+v, want UPDATE of nodes in the core group, any version", r)
	}
	return p
}

// cordonPolicy renders the chart with vals and remediation.cordon on and
// returns its node-cordon policy, checking that it names the Go side's
// annotation and bound.
func cordonPolicy(t *testing.T, vals chartutil.Values) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	objs := renderWith(t, cordonValues(vals))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	p := policyNamed(t, objs, "-node-cordon")
	var exprs strings.Builder
	for _, v := range p.Spec.Variables {
		exprs.WriteString(v.Expression + "\n")
	}
	if !strings.Contains(exprs.String(), `"`+cordon.Annotation+`"`) {
		t.Errorf("the policy's variables do not name the annotation %s", cordon.Annotation)
	}
	if want := fmt.Sprintf("size(variables.mark) <= %d", cordon.MaxReason); !slices.ContainsFunc(p.Spec.Validations, func(v admissionregistrationv1.Validation) bool {
		return v.Expression == want
	}) {
		t.Errorf("the policy does not bound the annotation with %s (cordon.MaxReason)", want)
	}
	return p
}

// pluginOn is the plugin's ServiceAccount as its pod on node (none: "")
// authenticates.
func pluginOn(node string) user.Info {
	extra := map[string][]string{}
	if node != "" {
		extra["authentication.kubernetes.io/node-name"] = []string{node}
	}
	return &user.DefaultInfo{Name: "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin", Extra: extra}
}

// Changes to a Node, for the policies.
func cordonNode(n *corev1.Node) {
	n.Spec.Unschedulable = true
	n.Annotations[cordon.Annotation] = "GPU-a: gpu-lost"
}

func uncordonNode(n *corev1.Node) {
	n.Spec.Unschedulable = false
	delete(n.Annotations, cordon.Annotation)
}

func cordonedByUs(n *corev1.Node) { cordonNode(n) }

func cordonedByOperator(n *corev1.Node) {
	n.Spec.Unschedulable = true
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule})
}

// TestHelmCordonPolicy: with remediation.cordon the plugin's
// ServiceAccount may cordon only its own schedulable Node, marking it, and
// lift only a cordon its mark shows; nothing else on the Node, evaluated
// as the API server's admission plugin does.
func TestHelmCordonPolicy(t *testing.T) {
	p := cordonPolicy(t, nil)
	other := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:node-controller"}
	const notOurs = "may change only spec.unschedulable and the annotation " + cordon.Annotation + " of its Node, not "
	const notItsCordon = "never take over or lift someone else's cordon"

	for _, tc := range []struct {
		name   string
		u      user.Info
		node   string
		before func(*corev1.Node) // the Node as it was; nil: busyNode as is
		change func(*corev1.Node)
		deny   string // what the refusal says; "" when allowed
	}{
		// Allowed: our cordon, and its undoing.
		{"own Node cordoned", pluginOn("n1"), "n1", nil, cordonNode, ""},
		{"own Node cordoned, as stored", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { cordonNode(n); serverWritten(n) }, ""},
		{"own cordon lifted", pluginOn("n1"), "n1", cordonedByUs, uncordonNode, ""},
		{"own mark removed from a Node someone uncordoned", pluginOn("n1"), "n1", func(n *corev1.Node) { n.Annotations[cordon.Annotation] = "x" },
			func(n *corev1.Node) { delete(n.Annotations, cordon.Annotation) }, ""},
		{"nothing changed", pluginOn("n1"), "n1", nil, func(*corev1.Node) {}, ""},
		{"another user, anything", other, "n1", nil, func(n *corev1.Node) { n.Spec.Taints = nil; n.Labels["x"] = "y" }, ""},

		// Who may write.
		{"another node cordoned", pluginOn("n1"), "n2", nil, cordonNode, "may cordon only its own Node, not node n2"},
		{"another node uncordoned", pluginOn("n1"), "n2", cordonedByUs, uncordonNode, "may cordon only its own Node, not node n2"},
		{"token without a node", pluginOn(""), "n1", nil, cordonNode, "the token names no node"},

		// Never someone else's cordon.
		{"an operator's cordon lifted", pluginOn("n1"), "n1", cordonedByOperator, func(n *corev1.Node) { n.Spec.Unschedulable = false }, notItsCordon},
		{"an operator's cordon taken over", pluginOn("n1"), "n1", cordonedByOperator, func(n *corev1.Node) { n.Annotations[cordon.Annotation] = "mine now" }, notItsCordon},
		{"a cordon without our mark", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Spec.Unschedulable = true }, notItsCordon},
		{"our mark alone", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Annotations[cordon.Annotation] = "x" }, notItsCordon},
		{"our mark rewritten while cordoned", pluginOn("n1"), "n1", cordonedByUs, func(n *corev1.Node) { n.Annotations[cordon.Annotation] = "another reason" }, notItsCordon},
		{"our cordon lifted, our mark kept", pluginOn("n1"), "n1", cordonedByUs, func(n *corev1.Node) { n.Spec.Unschedulable = false }, notItsCordon},
		{"our mark removed, the Node left cordoned", pluginOn("n1"), "n1", cordonedByUs, func(n *corev1.Node) { delete(n.Annotations, cordon.Annotation) }, notItsCordon},
		{"a mark too long", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			cordonNode(n)
			n.Annotations[cordon.Annotation] = strings.Repeat("x", cordon.MaxReason+1)
		},
			fmt.Sprintf("is at most %d characters long", cordon.MaxReason)},
		{"a mark as long as allowed", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			cordonNode(n)
			n.Annotations[cordon.Annotation] = cordon.Reason(strings.Repeat("é", 2*cordon.MaxReason))
		}, ""},

		// Refused: every other field.
		{"a taint", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			cordonNode(n)
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoExecute}}
		}, notOurs + "spec.taints"},
		{"podCIDR", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Spec.PodCIDR = "10.244.9.0/24" }, notOurs + "spec.podCIDR"},
		{"providerID", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Spec.ProviderID = "x" }, notOurs + "spec.providerID"},
		{"a label, with nodeLabels mode off", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Labels["nvidia.com/gpu.count"] = "8" }, notOurs + "metadata.labels"},
		{"another annotation", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { cordonNode(n); n.Annotations["example.com/x"] = "y" },
			notOurs + "annotation example.com/x"},
		{"the labels' annotation, with nodeLabels mode off", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Annotations[nodelabels.Annotation] = "nvidia.com/gpu.count" },
			notOurs + "annotation " + nodelabels.Annotation},
		{"an annotation removed", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			delete(n.Annotations, "volumes.kubernetes.io/controller-managed-attach-detach")
		}, notOurs + "annotation volumes.kubernetes.io/controller-managed-attach-detach"},
		{"finalizer", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Finalizers = []string{"example.com/keep"} }, notOurs + "metadata.finalizers"},
		{"status", pluginOn("n1"), "n1", nil, func(n *corev1.Node) { n.Status.Phase = corev1.NodeTerminated }, notOurs + "status"},
		{"several at once, each named", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			n.Spec.PodCIDR = "10.244.9.0/24"
			n.Labels["example.com/a"] = "b"
			n.Annotations["example.com/c"] = "d"
		}, notOurs + "spec.podCIDR, metadata.labels, annotation example.com/c"},
		{"another manager's entry added", pluginOn("n1"), "n1", nil, func(n *corev1.Node) {
			cordonNode(n)
			serverWritten(n)
			n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:unschedulable":{}}}`)}})
		}, "may not add or widen the entries of kubectl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := busyNode(tc.node)
			if tc.before != nil {
				tc.before(old)
			}
			obj := old.DeepCopy()
			tc.change(obj)
			got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), tc.node, "", admission.Update, tc.u, obj, old)
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("verdict %q, want denied with %q", got, tc.deny)
			}
		})
	}
}

// pluginWrite runs write against a fake API server holding node, applies
// the merge patch it sent (if any) as the API server does, and returns
// the Node after it, as stored. A preconditioned patch (the cordon's)
// must name the resourceVersion read.
func pluginWrite(t *testing.T, node *corev1.Node, preconditioned bool, write func(api *kubeapi.Client) error) (*corev1.Node, bool) {
	t.Helper()
	oldJSON, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fakeNodeServer{node: oldJSON}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	api, err := kubeapi.New(kubeapi.Config{Server: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(api); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	switch len(srv.patches) {
	case 0:
		return node, false
	case 1:
	default:
		t.Fatalf("%d patches, want at most one", len(srv.patches))
	}
	if preconditioned {
		var rv struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(srv.patches[0], &rv); err != nil || rv.Metadata.ResourceVersion != node.ResourceVersion {
			t.Errorf("patch %s names resourceVersion %q, want the one read, %q", srv.patches[0], rv.Metadata.ResourceVersion, node.ResourceVersion)
		}
	}
	newJSON, err := jsonpatch.MergePatch(oldJSON, srv.patches[0])
	if err != nil {
		t.Fatalf("applying the plugin's patch %s: %v", srv.patches[0], err)
	}
	obj := &corev1.Node{}
	if err := json.Unmarshal(newJSON, obj); err != nil {
		t.Fatal(err)
	}
	serverWritten(obj)
	return obj, true
}

// The plugin's own writes, as package cordon sends them through kubeapi,
// applied by the API server's JSON merge patch: allowed, and they change
// exactly spec.unschedulable and the annotation.
func TestHelmCordonPolicyAllowsPluginPatch(t *testing.T) {
	p := cordonPolicy(t, nil)
	w := func(api *kubeapi.Client) cordon.Writer { return cordon.Writer{API: api, Node: "n1"} }
	check := func(t *testing.T, old, obj *corev1.Node) {
		t.Helper()
		if got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), "n1", "", admission.Update, pluginOn("n1"), obj, old); got != "" {
			t.Errorf("the plugin's patch denied: %s", got)
		}
		a, b := old.DeepCopy(), obj.DeepCopy()
		a.Spec.Unschedulable, b.Spec.Unschedulable = false, false
		delete(a.Annotations, cordon.Annotation)
		delete(b.Annotations, cordon.Annotation)
		a.ResourceVersion, a.ManagedFields, b.ResourceVersion, b.ManagedFields = "", nil, "", nil
		if !equalJSON(t, a, b) {
			t.Errorf("the patch changed more than the cordon")
		}
	}
	node := busyNode("n1")
	cordoned, wrote := pluginWrite(t, node, true, func(api *kubeapi.Client) error {
		out, err := w(api).Cordon(context.Background(), "GPU-a: gpu-lost: NVML cannot reach the GPU")
		if out != cordon.Cordoned {
			t.Errorf("outcome %s", out)
		}
		return err
	})
	if !wrote || !cordoned.Spec.Unschedulable || cordoned.Annotations[cordon.Annotation] != "GPU-a: gpu-lost: NVML cannot reach the GPU" {
		t.Fatalf("after the cordon: unschedulable %v, annotations %v", cordoned.Spec.Unschedulable, cordoned.Annotations)
	}
	check(t, node, cordoned)

	uncordoned, wrote := pluginWrite(t, cordoned, true, func(api *kubeapi.Client) error {
		out, err := w(api).Uncordon(context.Background())
		if out != cordon.Uncordoned {
			t.Errorf("outcome %s", out)
		}
		return err
	})
	if _, marked := uncordoned.Annotations[cordon.Annotation]; !wrote || uncordoned.Spec.Unschedulable || marked {
		t.Fatalf("after the uncordon: unschedulable %v, annotations %v", uncordoned.Spec.Unschedulable, uncordoned.Annotations)
	}
	check(t, cordoned, uncordoned)

	// Someone uncordoned by hand, leaving the mark: the plugin removes only it.
	lifted := cordoned.DeepCopy()
	lifted.Spec.Unschedulable = false
	cleaned, wrote := pluginWrite(t, lifted, true, func(api *kubeapi.Client) error { _, err := w(api).Uncordon(context.Background()); return err })
	if _, marked := cleaned.Annotations[cordon.Annotation]; !wrote || marked || cleaned.Spec.Unschedulable {
		t.Fatalf("after removing the mark: unschedulable %v, annotations %v", cleaned.Spec.Unschedulable, cleaned.Annotations)
	}
	check(t, lifted, cleaned)

	// Within the API server's CEL cost limits on a large Node.
	big := busyNode("n1")
	bigger(big)
	bigCordoned, wrote := pluginWrite(t, big, true, func(api *kubeapi.Client) error {
		_, err := w(api).Cordon(context.Background(), "GPU-a: xid=79")
		return err
	})
	if !wrote {
		t.Fatal("no cordon of the large Node")
	}
	check(t, big, bigCordoned)

	// An operator's cordon: no write at all.
	operator := busyNode("n1")
	cordonedByOperator(operator)
	for _, write := range []func(api *kubeapi.Client) error{
		func(api *kubeapi.Client) error { _, err := w(api).Cordon(context.Background(), "x"); return err },
		func(api *kubeapi.Client) error { _, err := w(api).Uncordon(context.Background()); return err },
	} {
		if _, wrote := pluginWrite(t, operator, true, write); wrote {
			t.Error("the plugin wrote to a Node an operator cordoned")
		}
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(x) == string(y)
}

// With nodeLabels.mode node and remediation.cordon both on, the two
// policies both judge every write of the plugin's to its Node: each lets
// the other feature's writes through, and still refuses the rest.
func TestHelmCordonWithNodeLabels(t *testing.T) {
	objs := renderWith(t, cordonValues(nodeLabelsValues(nil)))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	policies := []*admissionregistrationv1.ValidatingAdmissionPolicy{policyNamed(t, objs, "-node-labels"), policyNamed(t, objs, "-node-cordon")}
	verdict := func(t *testing.T, obj, old *corev1.Node) string {
		t.Helper()
		var msgs []string
		for _, p := range policies {
			if got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), "n1", "", admission.Update, pluginOn("n1"), obj, old); got != "" {
				msgs = append(msgs, p.Name+": "+got)
			}
		}
		return strings.Join(msgs, "; ")
	}
	checkRBAC(t, objs, releaseNamespace, "gpu-device-plugin", map[string][]rbacv1.PolicyRule{"gpu-device-plugin-labels": wantLabelsRules, "gpu-device-plugin-cordon": wantCordonRules})

	// The plugin's own writes, one after the other, on a Node with the GPU
	// operator's labels.
	node := nodeWithGPULabels("n1")
	steps := []struct {
		name  string
		write func(api *kubeapi.Client) error
	}{
		{"labels", func(api *kubeapi.Client) error {
			_, err := nodelabels.NodeWriter{API: api, Node: "n1"}.Sync(context.Background(),
				labels.Compute(labels.Facts{Inventory: h100Inventory(), MIGStrategy: config.MIGStrategyNone}))
			return err
		}},
		{"cordon", func(api *kubeapi.Client) error {
			_, err := cordon.Writer{API: api, Node: "n1"}.Cordon(context.Background(), "GPU-a: gpu-lost")
			return err
		}},
		{"labels while cordoned", func(api *kubeapi.Client) error {
			_, err := nodelabels.NodeWriter{API: api, Node: "n1"}.Sync(context.Background(),
				labels.Compute(labels.Facts{Inventory: h100Inventory("1g.10gb"), MIGStrategy: config.MIGStrategyMixed}))
			return err
		}},
		{"uncordon", func(api *kubeapi.Client) error {
			_, err := cordon.Writer{API: api, Node: "n1"}.Uncordon(context.Background())
			return err
		}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			obj, wrote := pluginWrite(t, node, step.name == "cordon" || step.name == "uncordon", step.write)
			if !wrote {
				t.Fatal("no write")
			}
			if got := verdict(t, obj, node); got != "" {
				t.Errorf("the plugin's %s denied: %s", step.name, got)
			}
			node = obj
		})
	}

	// Still refused, by one policy or the other.
	for _, tc := range []struct {
		name   string
		change func(*corev1.Node)
		deny   string
	}{
		{"the GPU operator's label", func(n *corev1.Node) { n.Labels["nvidia.com/gpu.deploy.driver"] = "false" }, "label nvidia.com/gpu.deploy.driver"},
		{"a taint", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoExecute}} }, "spec.taints"},
		{"another annotation", func(n *corev1.Node) { n.Annotations["example.com/x"] = "y" }, "annotation example.com/x"},
		{"a cordon without our mark", func(n *corev1.Node) { n.Spec.Unschedulable = true }, "never take over or lift someone else's cordon"},
		{"our labels and a taint", func(n *corev1.Node) {
			n.Labels["nvidia.com/gpu.count"] = "7"
			n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoExecute}}
		}, "spec.taints"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			old := nodeWithGPULabels("n1")
			obj := old.DeepCopy()
			tc.change(obj)
			if got := verdict(t, obj, old); !strings.Contains(got, tc.deny) {
				t.Errorf("verdict %q, want denied with %q", got, tc.deny)
			}
		})
	}
}

// The RBAC, the flag and the policy come with remediation.cordon only, in
// either kubeletAPI mode: a ClusterRole of exactly nodes get and patch,
// the ServiceAccount's token and the node's name, and --remediation-cordon.
func TestHelmCordon(t *testing.T) {
	off := renderWith(t, chartutil.Values{"remediation": map[string]any{"cordon": false}})
	if n := len(off.ServiceAccounts) + len(off.ClusterRoles) + len(off.Policies); n != 0 {
		t.Errorf("remediation.cordon false: %d ServiceAccounts, ClusterRoles and policies", n)
	}
	if _, ok := flagValue(off.DaemonSets[0].Spec.Template.Spec.Containers[0].Args, "remediation-cordon"); ok {
		t.Error("--remediation-cordon with remediation.cordon false")
	}
	for _, mode := range []string{"device-plugin", "dra"} {
		t.Run(mode, func(t *testing.T) {
			vals := cordonValues(chartutil.Values{"kubeletAPI": mode, "config": map[string]any{"remediation": map[string]any{"enabled": true}}})
			if mode == "dra" {
				vals = draValues(vals)
			}
			objs := renderWith(t, vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			roles := map[string][]rbacv1.PolicyRule{"gpu-device-plugin-cordon": wantCordonRules}
			if mode == "dra" {
				roles["gpu-device-plugin"] = wantDRARules
			}
			checkRBAC(t, objs, releaseNamespace, "gpu-device-plugin", roles)
			policyNamed(t, objs, "-node-cordon")
			ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
			checkHealthPod(t, ds.Spec.Template.Spec, mode == "dra", false, false)
			if c := ds.Spec.Template.Spec.Containers[0]; !hasArg(c.Args, "--remediation-cordon=true") {
				t.Errorf("no --remediation-cordon=true in %q", c.Args)
			}
			t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
		})
	}
}

// Set in config (or a named config), remediation.cordon would cordon
// without the RBAC and policy the chart adds for the chart value: refused
// with the value to use, on or off.
func TestHelmCordonRefusesConfigKey(t *testing.T) {
	for _, v := range []any{true, false} {
		for _, vals := range []chartutil.Values{
			{"config": map[string]any{"remediation": map[string]any{"enabled": true, "cordon": v}}},
			{"config": map[string]any{"nodeLabel": "example.com/cfg", "map": map[string]any{"h100": map[string]any{"remediation": map[string]any{"cordon": v}}}}},
		} {
			_, err := renderValues(t, loadChart(t), vals)
			if err == nil || !strings.Contains(err.Error(), "config.remediation.cordon: set the chart value remediation.cordon instead") {
				t.Errorf("rendering with %v: %v, want an error naming config.remediation.cordon and the chart value", vals, err)
			}
		}
	}
}

// The Go side's name for the setting the chart sets.
func TestHelmCordonSettingName(t *testing.T) {
	for _, s := range config.Settings() {
		if s.Key == "remediation.cordon" {
			if s.Flag != "remediation-cordon" {
				t.Errorf("remediation.cordon is --%s, the chart sets --remediation-cordon", s.Flag)
			}
			return
		}
	}
	t.Error("config.Settings has no key remediation.cordon")
}

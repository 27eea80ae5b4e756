package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// nodeLabelsValues is vals with nodeLabels.mode node.
func nodeLabelsValues(vals chartutil.Values) chartutil.Values {
	out := chartutil.Values{"nodeLabels": map[string]any{"mode": "node"}}
	maps.Copy(out, vals)
	return out
}

// wantLabelsRules is nodeLabels mode node's RBAC, exactly: read the Node,
// patch it. No update (the plugin patches), no nodes/status, no list.
var wantLabelsRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}}}

// nodeLabelsPolicy renders the chart with nodeLabels.mode node and returns
// its node-labels policy, checking what it applies to and that it holds
// the Go side's key pattern and annotation.
func nodeLabelsPolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	objs := renderWith(t, nodeLabelsValues(nil))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	if len(objs.Policies) != 1 || len(objs.PolicyBindings) != 1 {
		t.Fatalf("%d ValidatingAdmissionPolicies and %d bindings, want one each", len(objs.Policies), len(objs.PolicyBindings))
	}
	p, b := objs.Policies[0], objs.PolicyBindings[0]
	if p.Name != "gpu-device-plugin-node-labels" || b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("policy %s, binding to %s with %v; want gpu-device-plugin-node-labels, Deny", p.Name, b.Spec.PolicyName, b.Spec.ValidationActions)
	}
	if b.Spec.MatchResources != nil || b.Spec.ParamRef != nil {
		t.Errorf("binding narrows the policy: %+v", b.Spec)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail: a policy that cannot run must not let writes through", p.Spec.FailurePolicy)
	}
	r := p.Spec.MatchConstraints.ResourceRules
	if len(r) != 1 || !slices.Equal(r[0].Resources, []string{"nodes"}) || !slices.Equal(r[0].APIGroups, []string{""}) ||
		!slices.Equal(r[0].APIVersions, []string{"*"}) || !slices.Equal(r[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) {
		t.Errorf("rules %+v, want UPDATE of nodes in the core group, any version", r)
	}
	var exprs strings.Builder
	for _, v := range p.Spec.Variables {
		exprs.WriteString(v.Expression + "\n")
	}
	// The same pattern as the Go side, as a CEL raw string, and the same
	// annotation: a label the plugin computes must never be refused.
	for _, want := range []string{`r"` + labels.KeyPattern + `"`, `"` + nodelabels.Annotation + `"`} {
		if !strings.Contains(exprs.String(), want) {
			t.Errorf("the policy's variables do not hold %s", want)
		}
	}
	// The Go side's bound on how many keys it computes.
	if want := fmt.Sprintf("size(variables.ownLabels) <= %d", labels.MaxKeys); !slices.ContainsFunc(p.Spec.Validations, func(v admissionregistrationv1.Validation) bool {
		return v.Expression == want
	}) {
		t.Errorf("the policy does not bound our labels with %s (labels.MaxKeys)", want)
	}
	return p
}

// nodeWithGPULabels is busyNode with what the GPU operator and the plugin
// set: the plugin's labels and annotation, and the operator's own
// nvidia.com/ labels beside them.
func nodeWithGPULabels(name string) *corev1.Node {
	n := busyNode(name)
	maps.Copy(n.Labels, map[string]string{
		"nvidia.com/gpu.deploy.driver":    "true",
		"nvidia.com/mig.config":           "all-disabled",
		"nvidia.com/device-plugin.config": "h100",
		"node-role.kubernetes.io/gpu":     "",
		"nvidia.com/gpu.product":          "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.count":            "8",
		"nvidia.com/mig-1g.10gb.count":    "7",
	})
	n.Annotations[nodelabels.Annotation] = "nvidia.com/gpu.count,nvidia.com/gpu.product,nvidia.com/mig-1g.10gb.count"
	// nfd-master set the GPU labels before the plugin took over.
	n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "nfd-master", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:nvidia.com/gpu.count":{},"f:nvidia.com/gpu.product":{}}}}`)}})
	return n
}

// addMIGLabels adds our MIG labels to n until it has want of them, the
// GPU operator's aside.
func addMIGLabels(n *corev1.Node, want int) {
	have := 0
	for k := range n.Labels {
		if labels.IsKey(k) {
			have++
		}
	}
	for i := 0; have < want; i++ {
		n.Labels[fmt.Sprintf("nvidia.com/mig-%dg.%dgb.count", i%8, i)] = "1"
		have++
	}
}

// TestHelmNodeLabelsPolicy: with nodeLabels.mode node, the plugin's
// ServiceAccount may change only its own Node's GPU labels (the keys it
// computes) and its annotation; nothing else on the Node, evaluated as the
// API server's admission plugin does.
func TestHelmNodeLabelsPolicy(t *testing.T) {
	p := nodeLabelsPolicy(t)
	sa := "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin"
	onNode := func(node string) user.Info {
		extra := map[string][]string{}
		if node != "" {
			extra["authentication.kubernetes.io/node-name"] = []string{node}
		}
		return &user.DefaultInfo{Name: sa, Extra: extra}
	}
	other := &user.DefaultInfo{Name: "system:serviceaccount:gpu-operator:gpu-operator"}
	relabel := func(n *corev1.Node) {
		n.Labels["nvidia.com/gpu.count"] = "7"
		n.Labels["nvidia.com/cuda.driver-version.full"] = "580.65.06"
		n.Annotations[nodelabels.Annotation] = "nvidia.com/cuda.driver-version.full,nvidia.com/gpu.count,nvidia.com/gpu.product,nvidia.com/mig-1g.10gb.count"
	}
	const notOurs = "may change only its GPU labels (GPU Feature Discovery's names under nvidia.com/) and the annotation " + nodelabels.Annotation + " of its Node, not "

	for _, tc := range []struct {
		name   string
		u      user.Info
		node   string
		change func(*corev1.Node)
		deny   string // what the refusal says; "" when allowed
	}{
		// Allowed: our keys set, changed and deleted, our annotation.
		{"own labels set and changed", onNode("n1"), "n1", relabel, ""},
		{"own labels, as stored: new resourceVersion and managedFields", onNode("n1"), "n1", func(n *corev1.Node) { relabel(n); serverWritten(n) }, ""},
		{"a MIG profile's labels added", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Labels["nvidia.com/mig-3g.40gb.product"] = "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
			n.Labels["nvidia.com/mig-1g.10gb.me.engines.ofa"] = "1"
		}, ""},
		{"a key it wrote deleted", onNode("n1"), "n1", func(n *corev1.Node) {
			delete(n.Labels, "nvidia.com/mig-1g.10gb.count")
			n.Annotations[nodelabels.Annotation] = "nvidia.com/gpu.count,nvidia.com/gpu.product"
		}, ""},
		{"all its labels and the annotation deleted", onNode("n1"), "n1", func(n *corev1.Node) {
			for _, k := range []string{"nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/mig-1g.10gb.count"} {
				delete(n.Labels, k)
			}
			delete(n.Annotations, nodelabels.Annotation)
		}, ""},
		{"nothing changed", onNode("n1"), "n1", func(*corev1.Node) {}, ""},
		{"another user, anything", other, "n1", func(n *corev1.Node) {
			n.Labels["nvidia.com/mig.config"] = "all-1g.10gb"
			n.Spec.Unschedulable = true
		}, ""},

		// Who may write.
		{"another node's labels", onNode("n1"), "n2", relabel, "may label only its own Node, not node n2"},
		{"token without a node", onNode(""), "n1", relabel, "the token names no node"},

		// Refused: every other label, annotation and field.
		{"the GPU operator's driver label", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/gpu.deploy.driver"] = "false" },
			notOurs + "label nvidia.com/gpu.deploy.driver"},
		{"the MIG manager's label", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/mig.config"] = "all-1g.10gb" },
			notOurs + "label nvidia.com/mig.config"},
		{"the device plugin config label deleted", onNode("n1"), "n1", func(n *corev1.Node) { delete(n.Labels, "nvidia.com/device-plugin.config") },
			notOurs + "label nvidia.com/device-plugin.config"},
		{"gpu.present", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/gpu.present"] = "false" }, notOurs + "label nvidia.com/gpu.present"},
		{"a GFD label it does not compute", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/gfd.timestamp"] = "1" }, notOurs + "label nvidia.com/gfd.timestamp"},
		{"a kubernetes.io label", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["kubernetes.io/hostname"] = "n2" }, notOurs + "label kubernetes.io/hostname"},
		{"a node role", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["node-role.kubernetes.io/control-plane"] = "" },
			notOurs + "label node-role.kubernetes.io/control-plane"},
		// Several, in the map's order: one of them is enough here.
		{"labels removed", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels = nil }, "label kubernetes.io/hostname"},
		{"an annotation not ours", onNode("n1"), "n1", func(n *corev1.Node) { n.Annotations["example.com/x"] = "y" }, notOurs + "annotation example.com/x"},
		{"an annotation not ours deleted", onNode("n1"), "n1", func(n *corev1.Node) {
			delete(n.Annotations, "volumes.kubernetes.io/controller-managed-attach-detach")
		}, notOurs + "annotation volumes.kubernetes.io/controller-managed-attach-detach"},
		{"taint", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
		}, notOurs + "spec"},
		{"unschedulable", onNode("n1"), "n1", func(n *corev1.Node) { n.Spec.Unschedulable = true }, notOurs + "spec"},
		{"finalizer", onNode("n1"), "n1", func(n *corev1.Node) { n.Finalizers = []string{"example.com/keep"} }, notOurs + "metadata.finalizers"},
		{"owner reference", onNode("n1"), "n1", func(n *corev1.Node) {
			n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
		}, notOurs + "metadata.ownerReferences"},
		{"status", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Phase = corev1.NodeTerminated }, notOurs + "status"},
		{"own labels and a foreign one", onNode("n1"), "n1", func(n *corev1.Node) { relabel(n); n.Labels["nvidia.com/mig.config"] = "x" },
			notOurs + "label nvidia.com/mig.config"},
		{"several at once, each named", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Labels["example.com/a"] = "b"
			n.Annotations["example.com/c"] = "d"
			n.Spec.Unschedulable = true
		}, notOurs + "spec, label example.com/a, annotation example.com/c"},

		// Bounds: how many of our labels, how long a key, the annotation.
		{"as many labels as the plugin can compute", onNode("n1"), "n1", func(n *corev1.Node) { addMIGLabels(n, labels.MaxKeys) }, ""},
		{"one label more", onNode("n1"), "n1", func(n *corev1.Node) { addMIGLabels(n, labels.MaxKeys+1) },
			fmt.Sprintf("may set at most %d GPU labels on its Node, not %d", labels.MaxKeys, labels.MaxKeys+1)},
		{"a key of 74 characters", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/mig-"+strings.Repeat("1", 43)+".engines.decoder"] = "1" }, ""},
		{"a key of 75 characters", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/mig-"+strings.Repeat("1", 44)+".engines.decoder"] = "1" },
			"label keys are at most 74 characters long, not nvidia.com/mig-111"},
		{"the annotation naming another label", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Annotations[nodelabels.Annotation] += ",kubernetes.io/hostname"
		}, "must list GPU label keys, comma-separated"},
		{"the annotation holding other text", onNode("n1"), "n1", func(n *corev1.Node) { n.Annotations[nodelabels.Annotation] = "see https://example.com" },
			"must list GPU label keys, comma-separated"},
		{"the annotation empty", onNode("n1"), "n1", func(n *corev1.Node) { n.Annotations[nodelabels.Annotation] = "" }, ""},
		{"the annotation too long", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Annotations[nodelabels.Annotation] = strings.Repeat("nvidia.com/gpu.count,", labels.MaxKeys*75/21+1) + "nvidia.com/gpu.count"
		}, "must list GPU label keys, comma-separated"},

		// managedFields: no entry but the plugin's may be added or widened.
		{"own labels, with another manager's entry added", onNode("n1"), "n1", func(n *corev1.Node) {
			relabel(n)
			serverWritten(n)
			n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "gpu-operator", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)}})
		}, "may not add or widen the entries of gpu-operator"},
		{"own labels, with the kubelet's entry widened", onNode("n1"), "n1", func(n *corev1.Node) {
			relabel(n)
			n.ManagedFields[0].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:kubernetes.io/hostname":{}}},"f:status":{"f:conditions":{}}}`)}
		}, "may not add or widen the entries of kubelet"},
		// The API server takes from another manager the labels the plugin
		// changes: that entry loses them, which is allowed.
		{"own labels, another manager's entry losing them", onNode("n1"), "n1", func(n *corev1.Node) {
			relabel(n)
			n.ManagedFields[1].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:nvidia.com/gpu.product":{}}}}`)}
		}, ""},
		{"own labels, another manager's entry gone", onNode("n1"), "n1", func(n *corev1.Node) {
			relabel(n)
			n.ManagedFields = n.ManagedFields[:1]
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := nodeWithGPULabels(tc.node)
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

// fakeNodeServer serves one Node to the plugin's API client: GET answers
// it, PATCH records the body.
type fakeNodeServer struct {
	mu      sync.Mutex
	node    []byte
	patches [][]byte
}

func (s *fakeNodeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/n1":
		_, _ = w.Write(s.node)
	case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/n1" && r.Header.Get("Content-Type") == "application/merge-patch+json":
		b, _ := io.ReadAll(r.Body)
		s.patches = append(s.patches, b)
		_, _ = w.Write([]byte("{}"))
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.Path+" ("+r.Header.Get("Content-Type")+")", http.StatusBadRequest)
	}
}

// h100Inventory is a node of H100s, some in MIG mode with profiles, for
// the mixed strategy's labels.
func h100Inventory(profiles ...string) *nvml.Inventory {
	inv := &nvml.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: 13000}
	for i := range 4 {
		g := nvml.GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 85520809984,
			PCIBusID: "0000:1" + string(rune('0'+i)) + ":00.0", MIGCapable: true, CUDAComputeCapability: "9.0"}
		if i == 0 && len(profiles) > 0 {
			g.MIGEnabled = true
			for j, p := range profiles {
				g.MIG = append(g.MIG, nvml.MIGDevice{UUID: "MIG-" + string(rune('a'+j)), Index: j, Profile: p, MemoryBytes: 10 << 30, Multiprocessors: 16,
					Slices: nvml.Slices{GPUInstance: 1, ComputeInstance: 1}, Engines: nvml.Engines{Copy: 1, Decoder: 1, JPEG: 1, OFA: 1}})
			}
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv
}

// The plugin's own writes, as the nodelabels writer sends them through
// kubeapi, applied by the API server's JSON merge patch to a busy Node
// that carries the GPU operator's labels too: allowed, and they change
// exactly the plugin's labels and annotation.
func TestHelmNodeLabelsPolicyAllowsPluginPatch(t *testing.T) {
	p := nodeLabelsPolicy(t)
	u := &user.DefaultInfo{Name: "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin",
		Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}}
	srv := &fakeNodeServer{}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	api, err := kubeapi.New(kubeapi.Config{Server: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	w := nodelabels.NodeWriter{API: api, Node: "n1"}
	compute := func(strategy string, profiles ...string) labels.Labels {
		return labels.Compute(labels.Facts{Inventory: h100Inventory(profiles...), MIGStrategy: strategy, Machine: "DGX H100"})
	}
	operatorLabels := map[string]string{"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/mig.config": "all-disabled", "nvidia.com/gpu.present": "true"}

	node := busyNode("n1")
	maps.Copy(node.Labels, operatorLabels)
	for _, step := range []struct {
		name  string
		edit  func(*corev1.Node) // someone else's change before the plugin's sync
		want  labels.Labels
		wrote bool
	}{
		{"first labels", func(*corev1.Node) {}, compute(config.MIGStrategyNone), true},
		{"at rest", func(*corev1.Node) {}, compute(config.MIGStrategyNone), false},
		{"a label removed by hand comes back", func(n *corev1.Node) { delete(n.Labels, "nvidia.com/gpu.product") }, compute(config.MIGStrategyNone), true},
		{"MIG profiles appear", func(*corev1.Node) {}, compute(config.MIGStrategyMixed, "1g.10gb", "1g.10gb+me", "3g.40gb"), true},
		{"a profile goes: its keys are deleted", func(*corev1.Node) {}, compute(config.MIGStrategyMixed, "1g.10gb"), true},
		{"the annotation edited to name others' labels", func(n *corev1.Node) {
			n.Annotations[nodelabels.Annotation] += ",nvidia.com/mig.config,kubernetes.io/hostname,nvidia.com/gpu.deploy.driver"
		}, compute(config.MIGStrategyNone), true},
		{"on a large Node", bigger, compute(config.MIGStrategySingle, "1g.10gb"), true},
		{"no labels any more", func(*corev1.Node) {}, nil, true},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.edit(node)
			old := node.DeepCopy()
			oldJSON, err := json.Marshal(old)
			if err != nil {
				t.Fatal(err)
			}
			srv.mu.Lock()
			srv.node, srv.patches = oldJSON, nil
			srv.mu.Unlock()
			wrote, err := w.Sync(context.Background(), step.want)
			if err != nil || wrote != step.wrote {
				t.Fatalf("sync: wrote %v, %v; want wrote %v", wrote, err, step.wrote)
			}
			if !wrote {
				if len(srv.patches) != 0 {
					t.Fatalf("patched at rest: %s", srv.patches)
				}
				return
			}
			if len(srv.patches) != 1 {
				t.Fatalf("%d patches, want one", len(srv.patches))
			}
			patch := srv.patches[0]
			newJSON, err := jsonpatch.MergePatch(oldJSON, patch)
			if err != nil {
				t.Fatalf("applying the plugin's patch %s: %v", patch, err)
			}
			obj := &corev1.Node{}
			if err := json.Unmarshal(newJSON, obj); err != nil {
				t.Fatal(err)
			}
			// Ours exactly as computed, the operator's and the rest as they were.
			for k, v := range step.want {
				if obj.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, obj.Labels[k], v)
				}
			}
			for k, v := range obj.Labels {
				if _, ours := step.want[k]; !ours && labels.IsKey(k) {
					t.Errorf("label %s=%s left over", k, v)
				}
			}
			for k, v := range old.Labels {
				if !labels.IsKey(k) && obj.Labels[k] != v {
					t.Errorf("another agent's label %s changed to %q", k, obj.Labels[k])
				}
			}
			if got, want := obj.Annotations[nodelabels.Annotation], strings.Join(step.want.Keys(), ","); got != want {
				t.Errorf("annotation %q, want %q", got, want)
			}
			serverWritten(obj)
			if got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), "n1", "", admission.Update, u, obj, old); got != "" {
				t.Errorf("the plugin's patch %s denied: %s", patch, got)
			}
			node = obj
		})
	}
}

// With nodeLabels.mode node, in either kubeletAPI mode, the pod gets a
// ServiceAccount with its token and its node's name, no NFD folder, and a
// ClusterRole of exactly nodes get and patch beside what else is on.
func TestHelmNodeLabelsNodeMode(t *testing.T) {
	for _, mode := range []string{"device-plugin", "dra"} {
		t.Run(mode, func(t *testing.T) {
			vals := nodeLabelsValues(chartutil.Values{"kubeletAPI": mode})
			if mode == "dra" {
				vals = draValues(vals)
			}
			objs := renderWith(t, vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			roles := map[string][]rbacv1.PolicyRule{"gpu-device-plugin-labels": wantLabelsRules}
			if mode == "dra" {
				roles["gpu-device-plugin"] = wantDRARules
			}
			checkRBAC(t, objs, releaseNamespace, "gpu-device-plugin", roles)
			names := map[string]bool{}
			for _, p := range objs.Policies {
				names[p.Name] = true
			}
			if !names["gpu-device-plugin-node-labels"] || len(names) != map[string]int{"device-plugin": 1, "dra": 3}[mode] {
				t.Errorf("policies %v", names)
			}
			ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
			checkHealthPod(t, ds.Spec.Template.Spec, mode == "dra", false, false)
			t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
		})
	}
}

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

	"helm.sh/helm/v3/pkg/chartutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// nodeFeatureValues is vals with nodeLabels.mode nodefeature.
func nodeFeatureValues(vals chartutil.Values) chartutil.Values {
	out := chartutil.Values{"nodeLabels": map[string]any{"mode": "nodefeature"}}
	maps.Copy(out, vals)
	return out
}

// wantNodeFeatureRules is nodeLabels mode nodefeature's Role, exactly: what
// FeatureWriter calls (get, then create or a PUT; no patch, list, watch or
// delete) and its own Pod's read for the owners. No daemonsets: the Pod's
// ownerReferences name the DaemonSet.
var wantNodeFeatureRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"nfd.k8s-sigs.io"}, Resources: []string{"nodefeatures"}, Verbs: []string{"get", "create", "update"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
}

var nodeFeatureGVR = schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeatures"}

// nodeFeaturePolicy renders the chart with nodeLabels.mode nodefeature and
// returns its NodeFeature policy, checking what it applies to and that it
// holds the Go side's naming, key pattern and bound.
func nodeFeaturePolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	objs := renderWith(t, nodeFeatureValues(nil))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	if len(objs.Policies) != 1 || len(objs.PolicyBindings) != 1 {
		t.Fatalf("%d ValidatingAdmissionPolicies and %d bindings, want one each", len(objs.Policies), len(objs.PolicyBindings))
	}
	p, b := objs.Policies[0], objs.PolicyBindings[0]
	if p.Name != "gpu-device-plugin-nodefeature" || b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("policy %s, binding to %s with %v; want gpu-device-plugin-nodefeature, Deny", p.Name, b.Spec.PolicyName, b.Spec.ValidationActions)
	}
	if b.Spec.MatchResources != nil || b.Spec.ParamRef != nil {
		t.Errorf("binding narrows the policy: %+v", b.Spec)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail: a policy that cannot run must not let writes through", p.Spec.FailurePolicy)
	}
	r := p.Spec.MatchConstraints.ResourceRules
	if len(r) != 1 || !slices.Equal(r[0].Resources, []string{"nodefeatures"}) || !slices.Equal(r[0].APIGroups, []string{nodeFeatureGVR.Group}) ||
		!slices.Equal(r[0].APIVersions, []string{"*"}) ||
		!slices.Equal(opStrings(r[0].Operations), []string{"CREATE", "UPDATE"}) {
		t.Errorf("rules %+v, want CREATE and UPDATE of nodefeatures in %s, any version", r, nodeFeatureGVR.Group)
	}
	var exprs strings.Builder
	for _, v := range p.Spec.Variables {
		exprs.WriteString(v.Expression + "\n")
	}
	for _, v := range p.Spec.Validations {
		exprs.WriteString(v.Expression + "\n")
	}
	// The Go side's pattern, as a CEL raw string, and its naming: a label
	// or object the plugin writes must never be refused.
	for _, want := range []string{`r"` + labels.KeyPattern + `"`, `"` + nodelabels.NodeFeaturePrefix + `" + variables.tokenNode`, `"` + nodelabels.NodeNameLabel + `"`,
		fmt.Sprintf("size(variables.wanted) <= %d", labels.MaxKeys)} {
		if !strings.Contains(exprs.String(), want) {
			t.Errorf("the policy does not hold %s", want)
		}
	}
	return p
}

// nodeFeatureObject is a NodeFeature as the API server holds it: the
// plugin's shape for node, with labels l, and the plugin's managedFields
// entry.
func nodeFeatureObject(node string, l map[string]string) map[string]any {
	spec := map[string]any{}
	for k, v := range l {
		spec[k] = v
	}
	return map[string]any{
		"apiVersion": kubeapi.NodeFeatureAPIVersion,
		"kind":       kubeapi.NodeFeatureKind,
		"metadata": map[string]any{
			"name":            nodelabels.NodeFeaturePrefix + node,
			"namespace":       releaseNamespace,
			"resourceVersion": "100",
			"labels":          map[string]any{nodelabels.NodeNameLabel: node},
			"ownerReferences": []any{
				map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-device-plugin", "uid": "ds-uid", "controller": true},
				map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "gpu-device-plugin-x7k2p", "uid": "pod-uid"},
			},
			"managedFields": []any{managedEntry(fieldManager, "2026-05-01T12:00:00Z", map[string]any{"f:spec": map[string]any{"f:labels": map[string]any{}}})},
		},
		"spec": map[string]any{
			"features": map[string]any{"flags": map[string]any{}, "attributes": map[string]any{}, "instances": map[string]any{}},
			"labels":   spec,
		},
	}
}

// managedEntry is a managedFields entry, as JSON has it.
func managedEntry(manager, at string, fields map[string]any) map[string]any {
	return map[string]any{"manager": manager, "operation": "Update", "apiVersion": kubeapi.NodeFeatureAPIVersion, "time": at, "fieldsType": "FieldsV1", "fieldsV1": fields}
}

// gpuLabels are labels the plugin computes on a node of H100s.
func gpuLabels() map[string]string {
	return labels.Compute(labels.Facts{Inventory: h100Inventory(), MIGStrategy: config.MIGStrategyNone, Machine: "DGX H100"})
}

// unstructuredOf is m as the admission plugin is given a custom resource.
func unstructuredOf(t *testing.T, m map[string]any) runtime.Object {
	t.Helper()
	if m == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := runtime.Decode(unstructured.UnstructuredJSONScheme, b)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// nodeFeatureVerdict is the policy's verdict on one write of a NodeFeature
// (old nil on CREATE), "" for admit.
func nodeFeatureVerdict(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy, op admission.Operation, u user.Info, obj, old map[string]any) string {
	t.Helper()
	name := ""
	if md, ok := obj["metadata"].(map[string]any); ok {
		name, _ = md["name"].(string)
	}
	return policyVerdictOn(t, p, nodeFeatureGVR, nodeFeatureGVR.GroupVersion().WithKind(kubeapi.NodeFeatureKind), name, "", op, u, unstructuredOf(t, obj), unstructuredOf(t, old))
}

// TestHelmNodeFeaturePolicy: with nodeLabels.mode nodefeature, the
// plugin's ServiceAccount may create and replace only its own node's
// NodeFeature, labelled for that node, asking only for the GPU labels it
// computes and no features; evaluated as the API server's admission plugin
// does.
func TestHelmNodeFeaturePolicy(t *testing.T) {
	p := nodeFeaturePolicy(t)
	own := func(edit ...func(map[string]any)) map[string]any {
		o := nodeFeatureObject("n1", gpuLabels())
		for _, e := range edit {
			e(o)
		}
		return o
	}
	meta := func(o map[string]any) map[string]any { return o["metadata"].(map[string]any) }
	spec := func(o map[string]any) map[string]any { return o["spec"].(map[string]any) }
	wanted := func(o map[string]any) map[string]any { return spec(o)["labels"].(map[string]any) }
	setLabel := func(k, v string) func(map[string]any) { return func(o map[string]any) { wanted(o)[k] = v } }
	nodeLabel := func(v string) func(map[string]any) {
		return func(o map[string]any) { meta(o)["labels"].(map[string]any)[nodelabels.NodeNameLabel] = v }
	}
	relabel := func(o map[string]any) {
		wanted(o)["nvidia.com/gpu.count"] = "7"
		delete(wanted(o), "nvidia.com/gpu.machine")
	}
	// GFD wrote the object before the plugin took it over: its own entry
	// and an annotation someone added stay.
	byGFD := func(o map[string]any) {
		meta(o)["managedFields"] = []any{managedEntry("gpu-feature-discovery", "2026-04-01T10:00:00Z", map[string]any{"f:spec": map[string]any{"f:labels": map[string]any{}}})}
		meta(o)["annotations"] = map[string]any{"example.com/note": "kept"}
	}
	forged := func(o map[string]any) {
		meta(o)["managedFields"] = append(meta(o)["managedFields"].([]any),
			managedEntry("nfd-master", "2026-05-01T11:00:00Z", map[string]any{"f:spec": map[string]any{"f:labels": map[string]any{}}}))
	}
	other := &user.DefaultInfo{Name: "system:serviceaccount:node-feature-discovery:nfd-worker"}
	const notGPU = "may ask only for its GPU labels (GPU Feature Discovery's names under nvidia.com/) in spec.labels, not "
	const onlyOurs = "writes only spec.labels and an empty spec.features of its NodeFeature, not "

	for _, tc := range []struct {
		name     string
		op       admission.Operation
		u        user.Info
		obj, old map[string]any
		deny     string // part of the message; "" admits
	}{
		// Allowed: its own object, created, replaced, taken over.
		{"create own", admission.Create, pluginOn("n1"), own(), nil, ""},
		{"create own, no labels", admission.Create, pluginOn("n1"), nodeFeatureObject("n1", nil), nil, ""},
		{"update own labels", admission.Update, pluginOn("n1"), own(relabel), own(), ""},
		{"update own, nothing changed", admission.Update, pluginOn("n1"), own(), own(), ""},
		{"take over GFD's object", admission.Update, pluginOn("n1"), own(byGFD), own(byGFD, setLabel("nvidia.com/gfd.timestamp", "1700000000")), ""},
		{"clear features another writer set", admission.Update, pluginOn("n1"), own(), own(func(o map[string]any) {
			spec(o)["features"].(map[string]any)["flags"] = map[string]any{"cpu.cpuid": map[string]any{"elements": map[string]any{"AVX": map[string]any{}}}}
		}), ""},
		{"fix a node-name label someone changed", admission.Update, pluginOn("n1"), own(), own(nodeLabel("n2")), ""},
		{"as many labels as the plugin can compute", admission.Create, pluginOn("n1"), own(func(o map[string]any) {
			for i := len(wanted(o)); i < labels.MaxKeys; i++ {
				wanted(o)[fmt.Sprintf("nvidia.com/mig-%dg.%dgb.count", i%8, i)] = "1"
			}
		}), nil, ""},
		{"a key of 74 characters", admission.Create, pluginOn("n1"), own(setLabel("nvidia.com/mig-"+strings.Repeat("1", 43)+".engines.decoder", "1")), nil, ""},

		// Who may write what: only its own node's object.
		{"create another node's", admission.Create, pluginOn("n1"), nodeFeatureObject("n2", gpuLabels()), nil,
			"a plugin on node n1 may write only its own NodeFeature, " + nodelabels.NodeFeaturePrefix + "n1, not " + nodelabels.NodeFeaturePrefix + "n2"},
		{"update another node's", admission.Update, pluginOn("n1"), nodeFeatureObject("n2", gpuLabels()), nodeFeatureObject("n2", nil), "may write only its own NodeFeature"},
		{"own name, labelled for another node", admission.Create, pluginOn("n1"), own(nodeLabel("n2")), nil,
			"the NodeFeature's label " + nodelabels.NodeNameLabel + " must be n1, not n2"},
		{"own object moved to another node", admission.Update, pluginOn("n1"), own(nodeLabel("n2")), own(), "must be n1, not n2"},
		{"own name, no node-name label", admission.Create, pluginOn("n1"), own(func(o map[string]any) { delete(meta(o), "labels") }), nil, "must be n1, not missing"},
		{"another name of its own", admission.Create, pluginOn("n1"), own(func(o map[string]any) { meta(o)["name"] = "gpu-labels-n1" }), nil,
			"may write only its own NodeFeature, " + nodelabels.NodeFeaturePrefix + "n1, not gpu-labels-n1"},
		{"token without a node", admission.Create, pluginOn(""), nodeFeatureObject("", gpuLabels()), nil, "the token names no node"},

		// What it may ask for: GPU labels only.
		{"a label outside nvidia.com/", admission.Create, pluginOn("n1"), own(setLabel("node-role.kubernetes.io/gpu", "")), nil, notGPU + "node-role.kubernetes.io/gpu"},
		{"an NFD feature label", admission.Update, pluginOn("n1"), own(setLabel("feature.node.kubernetes.io/pci-10de.present", "true")), own(),
			notGPU + "feature.node.kubernetes.io/pci-10de.present"},
		{"the GPU operator's driver label", admission.Update, pluginOn("n1"), own(setLabel("nvidia.com/gpu.deploy.driver", "false")), own(), notGPU + "nvidia.com/gpu.deploy.driver"},
		{"the MIG manager's label", admission.Update, pluginOn("n1"), own(setLabel("nvidia.com/mig.config", "all-1g.10gb")), own(), notGPU + "nvidia.com/mig.config"},
		{"one label more", admission.Create, pluginOn("n1"), own(func(o map[string]any) {
			for i := len(wanted(o)); i <= labels.MaxKeys; i++ {
				wanted(o)[fmt.Sprintf("nvidia.com/mig-%dg.%dgb.count", i%8, i)] = "1"
			}
		}), nil, fmt.Sprintf("may ask for at most %d GPU labels, not %d", labels.MaxKeys, labels.MaxKeys+1)},
		{"a key of 75 characters", admission.Create, pluginOn("n1"), own(setLabel("nvidia.com/mig-"+strings.Repeat("1", 44)+".engines.decoder", "1")), nil,
			"label keys are at most 74 characters long, not nvidia.com/mig-111"},

		// Nothing else: features (which NodeFeatureRules match on), other
		// fields of spec, fields beside spec.
		{"a feature", admission.Update, pluginOn("n1"), own(func(o map[string]any) {
			spec(o)["features"].(map[string]any)["attributes"] = map[string]any{"kernel.version": map[string]any{"elements": map[string]any{"major": "6"}}}
		}), own(), onlyOurs + "spec.features.attributes"},
		{"a field spec does not have", admission.Create, pluginOn("n1"), own(func(o map[string]any) { spec(o)["taints"] = []any{} }), nil, onlyOurs + "spec.taints"},
		{"a status", admission.Create, pluginOn("n1"), own(func(o map[string]any) { o["status"] = map[string]any{} }), nil, onlyOurs + "status"},

		// managedFields: no entry but the plugin's may be added or widened.
		{"create with another manager's entry", admission.Create, pluginOn("n1"), own(forged), nil, "may not add or widen the entries of nfd-master"},
		{"update adding another manager's entry", admission.Update, pluginOn("n1"), own(forged), own(), "may not add or widen the entries of nfd-master"},
		{"update keeping another manager's entry", admission.Update, pluginOn("n1"), own(forged), own(forged), ""},

		// Not the plugin's account: the policy does not apply.
		{"another service account", admission.Create, other, nodeFeatureObject("n2", map[string]string{"example.com/x": "y"}), nil, ""},
		{"the same name in another namespace", admission.Create,
			&user.DefaultInfo{Name: "system:serviceaccount:default:gpu-device-plugin", Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}},
			nodeFeatureObject("n2", nil), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := nodeFeatureVerdict(t, p, tc.op, tc.u, tc.obj, tc.old)
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

// fakeFeatureServer is the API server as FeatureWriter sees it: one Pod
// (owned by the DaemonSet), and NodeFeatures kept as JSON, each write
// stored as the API server would (a new resourceVersion, the writer's
// managedFields entry) and recorded with what it replaced.
type fakeFeatureServer struct {
	mu       sync.Mutex
	features map[string]map[string]any
	writes   []featureWrite
	rv       int
}

type featureWrite struct {
	op       admission.Operation
	obj, old map[string]any
}

const (
	fakePod     = "gpu-device-plugin-x7k2p"
	featuresAPI = "/apis/" + kubeapi.NodeFeatureAPIVersion + "/namespaces/" + releaseNamespace + "/nodefeatures"
)

func (s *fakeFeatureServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	name, item := strings.CutPrefix(r.URL.Path, featuresAPI+"/")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/"+releaseNamespace+"/pods/"+fakePod:
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{
			"name": fakePod, "namespace": releaseNamespace, "uid": "pod-uid",
			"ownerReferences": []any{map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-device-plugin", "uid": "ds-uid", "controller": true, "blockOwnerDeletion": true}},
		}})
	case r.Method == http.MethodGet && item:
		f, ok := s.features[name]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
			return
		}
		_ = json.NewEncoder(w).Encode(f)
	case r.Method == http.MethodPost && r.URL.Path == featuresAPI:
		s.store(w, r, admission.Create, "")
	case r.Method == http.MethodPut && item:
		s.store(w, r, admission.Update, name)
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
	}
}

// store keeps a written object as the API server would before admission:
// its own fields set (resourceVersion, the writer's managedFields entry),
// the rest as sent.
func (s *fakeFeatureServer) store(w http.ResponseWriter, r *http.Request, op admission.Operation, name string) {
	var obj map[string]any
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &obj); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil || (name != "" && md["name"] != name) {
		http.Error(w, "no metadata, or another name", http.StatusBadRequest)
		return
	}
	s.rv++
	md["resourceVersion"] = fmt.Sprint(s.rv)
	manager := r.URL.Query().Get("fieldManager")
	var entries []any
	for _, e := range asList(md["managedFields"]) {
		if e.(map[string]any)["manager"] != manager {
			entries = append(entries, e)
		}
	}
	md["managedFields"] = append(entries, managedEntry(manager, fmt.Sprintf("2026-05-01T12:%02d:00Z", s.rv), map[string]any{"f:spec": map[string]any{"f:labels": map[string]any{}}}))
	key := md["name"].(string)
	s.writes = append(s.writes, featureWrite{op: op, obj: obj, old: s.features[key]})
	s.features[key] = obj
	_ = json.NewEncoder(w).Encode(obj)
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// The plugin's own writes, as FeatureWriter sends them through kubeapi to
// the API server, as the admission plugin sees them: its node's object
// created, replaced when the labels change, and GFD's object taken over,
// all allowed; the same writer on another node than its token's, refused.
func TestHelmNodeFeaturePolicyAllowsPluginWrites(t *testing.T) {
	p := nodeFeaturePolicy(t)
	srv := &fakeFeatureServer{features: map[string]map[string]any{}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	api, err := kubeapi.New(kubeapi.Config{Server: hs.URL, FieldManager: fieldManager})
	if err != nil {
		t.Fatal(err)
	}
	compute := func(strategy string, profiles ...string) labels.Labels {
		return labels.Compute(labels.Facts{Inventory: h100Inventory(profiles...), MIGStrategy: strategy, Machine: "DGX H100"})
	}
	// n2's object is GFD's, as GFD writes it: its manager, a timestamp label
	// the plugin does not compute.
	gfd := nodeFeatureObject("n2", map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gfd.timestamp": "1700000000"})
	gfd["metadata"].(map[string]any)["managedFields"] = []any{managedEntry("gpu-feature-discovery", "2026-04-01T10:00:00Z", map[string]any{"f:spec": map[string]any{}})}
	delete(gfd["metadata"].(map[string]any), "ownerReferences")
	srv.features[nodelabels.NodeFeaturePrefix+"n2"] = gfd

	for _, step := range []struct {
		name      string
		node      string // the writer's node; the token's is n1 unless token says
		token     string
		want      labels.Labels
		op        admission.Operation // the write; "" for none
		deny      string
		wantOwner bool
	}{
		{"first labels: created", "n1", "n1", compute(config.MIGStrategyNone), admission.Create, "", true},
		{"at rest: no write", "n1", "n1", compute(config.MIGStrategyNone), "", "", true},
		{"MIG profiles appear: replaced", "n1", "n1", compute(config.MIGStrategyMixed, "1g.10gb", "1g.10gb+me", "3g.40gb"), admission.Update, "", true},
		{"no labels any more", "n1", "n1", nil, admission.Update, "", true},
		{"GFD's object taken over", "n2", "n2", compute(config.MIGStrategySingle, "1g.10gb"), admission.Update, "", true},
		{"a writer on n3 with n1's token", "n3", "n1", compute(config.MIGStrategyNone), admission.Create, "may write only its own NodeFeature", true},
		{"a writer on n2 with n1's token", "n2", "n1", compute(config.MIGStrategyNone), admission.Update, "may write only its own NodeFeature", true},
	} {
		t.Run(step.name, func(t *testing.T) {
			srv.mu.Lock()
			srv.writes = nil
			srv.mu.Unlock()
			w := &nodelabels.FeatureWriter{API: api, Namespace: releaseNamespace, Node: step.node, Pod: fakePod}
			wrote, err := w.Sync(context.Background(), step.want)
			if err != nil || wrote != (step.op != "") {
				t.Fatalf("sync: wrote %v, %v; want wrote %v", wrote, err, step.op != "")
			}
			srv.mu.Lock()
			writes := slices.Clone(srv.writes)
			srv.mu.Unlock()
			if step.op == "" {
				if len(writes) != 0 {
					t.Fatalf("wrote at rest: %v", writes)
				}
				return
			}
			if len(writes) != 1 || writes[0].op != step.op {
				t.Fatalf("%d writes (%v), want one %s", len(writes), writes, step.op)
			}
			wr := writes[0]
			got := nodeFeatureVerdict(t, p, wr.op, pluginOn(step.token), wr.obj, wr.old)
			switch {
			case step.deny == "" && got != "":
				t.Errorf("the plugin's %s denied: %s", wr.op, got)
			case step.deny != "" && !strings.Contains(got, step.deny):
				t.Errorf("verdict %q, want denied with %q", got, step.deny)
			}
			owners := asList(wr.obj["metadata"].(map[string]any)["ownerReferences"])
			if step.wantOwner && (len(owners) != 2 || owners[0].(map[string]any)["kind"] != "DaemonSet") {
				t.Errorf("owners %v, want the DaemonSet read from the Pod, and the Pod", owners)
			}
		})
	}
}

// With nodeLabels.mode nodefeature, in either kubeletAPI mode, the pod
// gets a ServiceAccount with its token, its node's name, its own name and
// namespace from the downward API, no NFD folder, and exactly the Role
// wantNodeFeatureRules in the release namespace (no ClusterRole of its
// own); the plugin accepts what the chart gives it.
func TestHelmNodeFeatureMode(t *testing.T) {
	for _, mode := range []string{"device-plugin", "dra"} {
		t.Run(mode, func(t *testing.T) {
			vals := nodeFeatureValues(chartutil.Values{"kubeletAPI": mode})
			if mode == "dra" {
				vals = draValues(vals)
			}
			objs := renderWith(t, vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			cluster := map[string][]rbacv1.PolicyRule{}
			if mode == "dra" {
				cluster["gpu-device-plugin"] = wantDRARules
			}
			checkAccess(t, objs, releaseNamespace, "gpu-device-plugin", cluster, map[string][]rbacv1.PolicyRule{"gpu-device-plugin-nodefeature": wantNodeFeatureRules})
			names := map[string]bool{}
			for _, p := range objs.Policies {
				names[p.Name] = true
			}
			if !names["gpu-device-plugin-nodefeature"] || names["gpu-device-plugin-node-labels"] || len(names) != map[string]int{"device-plugin": 1, "dra": 3}[mode] {
				t.Errorf("policies %v, want gpu-device-plugin-nodefeature and not the Node's", names)
			}
			ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
			spec := ds.Spec.Template.Spec
			checkHealthPod(t, spec, mode == "dra", false, false)
			c := spec.Containers[0]
			if !hasArg(c.Args, "--node-labels=nodefeature") {
				t.Errorf("args %q, want --node-labels=nodefeature", c.Args)
			}
			if v, ok := flagValue(c.Args, "nfd-features-dir"); ok || hasVolume(spec.Volumes, "nfd-features") {
				t.Errorf("--nfd-features-dir=%s or the nfd-features volume with mode nodefeature", v)
			}
			checkPodEnv(t, c, true)
			t.Run("accepted by the plugin", func(t *testing.T) { checkAcceptedByPlugin(t, ds, cm) })
		})
	}
}

// checkPodEnv pins the pod's own name and namespace, each once from the
// downward API, under the names the plugin's podName and podNamespace
// settings read; or neither.
func checkPodEnv(t *testing.T, c corev1.Container, want bool) {
	t.Helper()
	byKey := map[string]config.Setting{}
	for _, s := range config.Settings() {
		byKey[s.Key] = s
	}
	for key, field := range map[string]string{"podName": "metadata.name", "podNamespace": "metadata.namespace"} {
		s, ok := byKey[key]
		if !ok {
			t.Fatalf("no setting %s", key)
		}
		var found []corev1.EnvVar
		for _, e := range c.Env {
			if e.Name == s.Env {
				found = append(found, e)
			}
		}
		switch {
		case !want && len(found) > 0:
			t.Errorf("%s set without nodeLabels.mode nodefeature: %+v", s.Env, found)
		case want && (len(found) != 1 || found[0].ValueFrom == nil || found[0].ValueFrom.FieldRef == nil || found[0].ValueFrom.FieldRef.FieldPath != field):
			t.Errorf("%s is %+v, want it once, from the downward API's %s", s.Env, found, field)
		}
	}
}

// Without nodeLabels.mode nodefeature the chart renders none of its
// access: no Role, no NodeFeature policy, no pod name or namespace.
func TestHelmNodeFeatureOff(t *testing.T) {
	for _, mode := range []string{"nfd", "node", "none"} {
		t.Run(mode, func(t *testing.T) {
			objs := renderWith(t, chartutil.Values{"nodeLabels": map[string]any{"mode": mode}})
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			if len(objs.Roles) != 0 || len(objs.RoleBindings) != 0 {
				t.Errorf("%d Roles, %d RoleBindings, want none", len(objs.Roles), len(objs.RoleBindings))
			}
			for _, p := range objs.Policies {
				for _, r := range p.Spec.MatchConstraints.ResourceRules {
					if slices.Contains(r.Resources, "nodefeatures") {
						t.Errorf("policy %s matches nodefeatures", p.Name)
					}
				}
			}
			for _, cr := range objs.ClusterRoles {
				if g := strings.Join(grants(t, cr.Rules), " "); strings.Contains(g, "nodefeatures") || strings.Contains(g, "/pods[") {
					t.Errorf("ClusterRole %s grants %s", cr.Name, g)
				}
			}
			checkPodEnv(t, objs.DaemonSets[0].Spec.Template.Spec.Containers[0], false)
		})
	}
}

// A mode the plugin does not know is refused in one line naming the key
// and the modes.
func TestHelmNodeLabelsModeRefused(t *testing.T) {
	_, err := renderValues(t, loadChart(t), chartutil.Values{"nodeLabels": map[string]any{"mode": "nodefeatures"}})
	if err == nil || !strings.Contains(err.Error(), `nodeLabels.mode "nodefeatures"`) || !strings.Contains(err.Error(), "nodefeature (") || strings.Contains(err.Error(), "\n") {
		t.Errorf("nodeLabels.mode nodefeatures: %v, want one line naming the key and the modes", err)
	}
}

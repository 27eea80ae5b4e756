package deploy

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// gpuNodeLabels mark a node with an NVIDIA GPU, each set to "true" by
// someone else: Node Feature Discovery (10de is NVIDIA's PCI vendor ID, the
// label NVIDIA's chart matches too), the GPU Operator, and ours, which a
// person sets where neither runs. The chart's default required node
// affinity has one term for each, so any one of them will do.
var gpuNodeLabels = []string{
	"feature.node.kubernetes.io/pci-10de.present",
	"nvidia.com/gpu.present",
	"gpu-device-plugin.github.io/present",
}

// checkGPUNodeAffinity pins the default placement: one required term per
// GPU node label, ORed, and nothing else required.
func checkGPUNodeAffinity(t *testing.T, a *corev1.Affinity) {
	t.Helper()
	var want []corev1.NodeSelectorTerm
	for _, k := range gpuNodeLabels {
		want = append(want, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}})
	}
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("no required node affinity (%v): the plugin would run on nodes without a GPU", a)
		return
	}
	if got := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; toYAML(t, got) != toYAML(t, want) {
		t.Errorf("required node affinity terms\n%s\nwant one per GPU node label\n%s", toYAML(t, got), toYAML(t, want))
	}
}

// node is a Node with labels.
func node(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}}
}

// schedules says whether the scheduler's own node affinity check puts a pod
// of ds on n.
func schedules(t *testing.T, ds *appsv1.DaemonSet, n *corev1.Node) bool {
	t.Helper()
	pod := &corev1.Pod{Spec: ds.Spec.Template.Spec}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(n)
	if err != nil {
		t.Fatalf("%s: node affinity: %v", ds.Name, err)
	}
	return ok
}

// Both DaemonSets, the plugin's and the MPS launcher's, run on a node that
// any one of the GPU node labels marks, and on no other, in the chart and
// in the static manifests alike: a cluster with only NFD, only the GPU
// Operator or only a person's label gets pods.
func TestGPUNodeAffinity(t *testing.T) {
	chart, notes := render(t, "")
	draChart, draNotes := renderNotes(t, draValues(nil))
	nodes := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"no label", map[string]string{"kubernetes.io/os": "linux"}, false},
		{"nvidia.com/gpu.present=false", map[string]string{"nvidia.com/gpu.present": "false"}, false},
		{"NFD's pci-10de.present (another vendor's)", map[string]string{"feature.node.kubernetes.io/pci-15b3.present": "true"}, false},
	}
	for _, k := range gpuNodeLabels {
		nodes = append(nodes, struct {
			name   string
			labels map[string]string
			want   bool
		}{k + " only", map[string]string{k: "true"}, true})
	}
	for _, src := range []struct {
		name string
		objs objects
	}{
		{"chart", chart}, {"chart, DRA mode", draChart},
		{"manifest", readManifest(t)}, {"DRA manifest", readDRAManifest(t)},
	} {
		t.Run(src.name, func(t *testing.T) {
			dss := append(slices.Clone(src.objs.DaemonSets), src.objs.Launchers...)
			if len(dss) != 2 {
				t.Fatalf("%d DaemonSets, want the plugin's and the launcher's", len(dss))
			}
			for _, ds := range dss {
				checkGPUNodeAffinity(t, ds.Spec.Template.Spec.Affinity)
				if len(ds.Spec.Template.Spec.NodeSelector) != 0 {
					t.Errorf("%s: nodeSelector %v, want none", ds.Name, ds.Spec.Template.Spec.NodeSelector)
				}
				for _, n := range nodes {
					if got := schedules(t, ds, node(n.labels)); got != n.want {
						t.Errorf("%s on a node with %s: %v, want %v", ds.Name, n.name, got, n.want)
					}
				}
			}
		})
	}
	// NOTES.txt names the labels and the one a person sets.
	for _, n := range []string{notes, draNotes} {
		if !strings.Contains(n, "runs on nodes labelled "+strings.Join(gpuNodeLabels, "=true or ")+"=true.") ||
			!strings.Contains(n, "kubectl label node NODE gpu-device-plugin.github.io/present=true\n") {
			t.Errorf("NOTES.txt does not name the GPU node labels and the command to set ours:\n%s", n)
		}
	}
}

// values.yaml's gpuNodeSelectorTerms is the default and nothing more:
// a list of one's own replaces it, [] runs everywhere, a required node
// affinity in affinity is used instead, nodeSelector narrows it, and
// config.map's node label is ANDed into it, while the launcher keeps to
// every node of every plugin DaemonSet.
func TestGPUNodeAffinityOverrides(t *testing.T) {
	ownTerms := []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "example.com/gpu", "operator": "Exists"}}}}
	ownAffinity := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "example.com/pool", "operator": "In", "values": []any{"gpu"}}}}},
	}}}
	nfd := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}
	for _, tc := range []struct {
		name   string
		vals   chartutil.Values
		nodes  map[string]map[string]string // name: labels
		want   map[string][]string          // DaemonSet: the nodes it runs on
		noteOn string                       // NOTES.txt's "runs on" line
	}{
		{
			name:   "a list of one's own",
			vals:   chartutil.Values{"gpuNodeSelectorTerms": ownTerms},
			nodes:  map[string]map[string]string{"nfd": nfd, "own": {"example.com/gpu": ""}},
			want:   map[string][]string{"gpu-device-plugin": {"own"}, "gpu-device-plugin-mps-launcher": {"own"}},
			noteOn: "runs on nodes labelled example.com/gpu Exists.",
		},
		{
			name:   "empty: every node",
			vals:   chartutil.Values{"gpuNodeSelectorTerms": []any{}},
			nodes:  map[string]map[string]string{"nfd": nfd, "bare": nil},
			want:   map[string][]string{"gpu-device-plugin": {"bare", "nfd"}, "gpu-device-plugin-mps-launcher": {"bare", "nfd"}},
			noteOn: "runs on every node.",
		},
		{
			name:   "affinity's own required node affinity",
			vals:   chartutil.Values{"affinity": ownAffinity},
			nodes:  map[string]map[string]string{"nfd": nfd, "pool": {"example.com/pool": "gpu"}},
			want:   map[string][]string{"gpu-device-plugin": {"pool"}, "gpu-device-plugin-mps-launcher": {"pool"}},
			noteOn: "runs on nodes labelled example.com/pool=gpu.",
		},
		{
			name:   "nodeSelector too",
			vals:   chartutil.Values{"nodeSelector": map[string]any{"example.com/zone": "a"}},
			nodes:  map[string]map[string]string{"nfd": nfd, "nfd-a": {"feature.node.kubernetes.io/pci-10de.present": "true", "example.com/zone": "a"}},
			want:   map[string][]string{"gpu-device-plugin": {"nfd-a"}, "gpu-device-plugin-mps-launcher": {"nfd-a"}},
			noteOn: "runs on nodes labelled " + strings.Join(gpuNodeLabels, "=true or ") + "=true, and example.com/zone=a.",
		},
		{
			name: "config.map",
			vals: chartutil.Values{"config": map[string]any{"map": map[string]any{"a100": map[string]any{"deviceIDStrategy": "index"}}}},
			nodes: map[string]map[string]string{
				"nfd":      nfd,
				"nfd-a100": {"feature.node.kubernetes.io/pci-10de.present": "true", nvidiaConfigLabel: "a100"},
				"a100":     {nvidiaConfigLabel: "a100"},
			},
			want: map[string][]string{"gpu-device-plugin": {"nfd"}, "gpu-device-plugin-a100": {"nfd-a100"}, "gpu-device-plugin-mps-launcher": {"nfd", "nfd-a100"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, notes := renderNotes(t, tc.vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			got := map[string][]string{}
			for _, ds := range append(slices.Clone(objs.DaemonSets), objs.Launchers...) {
				got[ds.Name] = []string{}
				for name, labels := range tc.nodes {
					if schedules(t, ds, node(labels)) {
						got[ds.Name] = append(got[ds.Name], name)
					}
				}
				slices.Sort(got[ds.Name])
			}
			if toYAML(t, got) != toYAML(t, tc.want) {
				t.Errorf("DaemonSets on nodes\n%s\nwant\n%s", toYAML(t, got), toYAML(t, tc.want))
			}
			if tc.noteOn != "" && !strings.Contains(notes, tc.noteOn) {
				t.Errorf("NOTES.txt does not say %q:\n%s", tc.noteOn, notes)
			}
		})
	}
}

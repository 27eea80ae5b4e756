package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// nodeStatusPolicy renders the chart with the node condition on and
// returns its node-status policy, checking what it applies to.
func nodeStatusPolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	objs := renderWith(t, withHealth(chartutil.Values{}, false, true))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	var p *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, x := range objs.Policies {
		if strings.HasSuffix(x.Name, "-node-status") {
			p = x
		}
	}
	if p == nil || len(objs.PolicyBindings) != 1 || objs.PolicyBindings[0].Spec.PolicyName != p.Name {
		t.Fatalf("want one node-status policy and its binding; policies %d, bindings %d", len(objs.Policies), len(objs.PolicyBindings))
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", p.Spec.FailurePolicy)
	}
	r := p.Spec.MatchConstraints.ResourceRules
	if len(r) != 1 || !slices.Equal(r[0].Resources, []string{"nodes/status"}) || !slices.Equal(r[0].APIGroups, []string{""}) {
		t.Errorf("rules %+v, want nodes/status in the core group", r)
	}
	if off := renderWith(t, withHealth(chartutil.Values{"nodeCondition": map[string]any{"enabled": true, "restrictToOwnNode": false,
		"restrictToOwnNodeAcknowledged": "a stolen token can patch every Node's status"}}, false, true)); len(off.Policies) != 0 {
		t.Errorf("restrictToOwnNode=false still renders %d policies", len(off.Policies))
	}
	return p
}

// busyNode is a Node as a running cluster has it: every part of metadata,
// spec and status set, so that a policy comparing only some of them lets
// a change to the others through.
func busyNode(name string) *corev1.Node {
	at := metav1.NewTime(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	gpus := resource.MustParse("8")
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1000", CreationTimestamp: at,
			Labels:      map[string]string{"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
			Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &at,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{}}}`)}, Subresource: "status",
			}},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}, ProviderID: "kind://docker/kind/" + name},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"cpu": resource.MustParse("64"), "nvidia.com/gpu": gpus},
			Allocatable: corev1.ResourceList{"cpu": resource.MustParse("63"), "nvidia.com/gpu": gpus},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: at, LastTransitionTime: at},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: at, LastTransitionTime: at},
				{Type: "GPUHealthy", Status: corev1.ConditionTrue, Reason: "AllGPUsHealthy", LastHeartbeatTime: at, LastTransitionTime: at},
			},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID: "m-" + name, BootID: "b-" + name, KernelVersion: "6.8.0", OSImage: "Ubuntu 24.04",
				ContainerRuntimeVersion: "containerd://2.1.0", KubeletVersion: "v1.37.0", OperatingSystem: "linux", Architecture: "amd64",
			},
			Images:           []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320000}},
			RuntimeHandlers:  []corev1.NodeRuntimeHandler{{Name: "runc", Features: &corev1.NodeRuntimeHandlerFeatures{RecursiveReadOnlyMounts: ptr.To(true)}}},
			Features:         &corev1.NodeFeatures{SupplementalGroupsPolicy: ptr.To(true)},
			DeclaredFeatures: []string{"InPlacePodVerticalScaling"},
		},
	}
}

// condition returns n's condition of type typ, adding it if absent.
func condition(n *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: typ})
	return &n.Status.Conditions[len(n.Status.Conditions)-1]
}

func withoutCondition(n *corev1.Node, typ corev1.NodeConditionType) {
	n.Status.Conditions = slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == typ })
}

// The write the API server admits for a status update: resourceVersion and
// managedFields are its own (the field manager records the writer's entry
// before admission).
func serverWritten(n *corev1.Node) {
	at := metav1.NewTime(time.Date(2026, 5, 1, 12, 5, 0, 0, time.UTC))
	n.ResourceVersion = "1001"
	n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{
		Manager: "gpu-device-plugin", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &at,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"GPUHealthy\"}":{}}}}`)}, Subresource: "status",
	})
}

// bigger fills n well past what a busy node reports (the kubelet lists at
// most 50 images): the comparison must stay within the API server's CEL
// cost budget, or every write of the condition would fail.
func bigger(n *corev1.Node) {
	for i := range 200 {
		n.Labels[fmt.Sprintf("example.com/label-%d", i)] = strings.Repeat("v", 63)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: int64(i), Names: []string{
			fmt.Sprintf("registry.example.com/team/image-%d@sha256:%064d", i, i), fmt.Sprintf("registry.example.com/team/image-%d:v1.2.3", i)}})
		v := corev1.UniqueVolumeName(fmt.Sprintf("kubernetes.io/csi/csi.example.com^vol-%d", i))
		n.Status.VolumesInUse = append(n.Status.VolumesInUse, v)
		n.Status.VolumesAttached = append(n.Status.VolumesAttached, corev1.AttachedVolume{Name: v, DevicePath: fmt.Sprintf("/dev/sd%d", i)})
	}
	for i := range 30 {
		n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: fmt.Sprintf("agent-%d", i), Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{}}}`)}})
	}
}

// TestHelmNodeStatusPolicy: with the node condition on, the plugin's
// ServiceAccount may change only its own Node's GPUHealthy and NICHealthy
// conditions; nothing else a status update stores (metadata, spec, the
// rest of status), evaluated as the API server's admission plugin does.
func TestHelmNodeStatusPolicy(t *testing.T) {
	p := nodeStatusPolicy(t)
	sa := "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin"
	onNode := func(node string) user.Info {
		extra := map[string][]string{}
		if node != "" {
			extra["authentication.kubernetes.io/node-name"] = []string{node}
		}
		return &user.DefaultInfo{Name: sa, Extra: extra}
	}
	kubelet := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes"}}
	later := metav1.NewTime(time.Date(2026, 5, 1, 12, 5, 0, 0, time.UTC))
	gpuBad := func(n *corev1.Node) {
		c := condition(n, "GPUHealthy")
		c.Status, c.Reason, c.Message, c.LastTransitionTime, c.LastHeartbeatTime = corev1.ConditionFalse, "GPUUnhealthy", "GPU-a (index 0): xid=79", later, later
	}
	const notOurs = "may change only the GPUHealthy and NICHealthy conditions of its Node, not "

	for _, tc := range []struct {
		name   string
		u      user.Info
		node   string
		change func(*corev1.Node) // what the update changes
		deny   string             // what the refusal says; "" when allowed
	}{
		// Allowed: our conditions, in every field, added and removed, as
		// the API server sees the write.
		{"own GPUHealthy set", onNode("n1"), "n1", gpuBad, ""},
		{"own GPUHealthy reason and message", onNode("n1"), "n1", func(n *corev1.Node) {
			c := condition(n, "GPUHealthy")
			c.Reason, c.Message = "GPUsRecovered", "GPU-a (index 0) healthy again"
		}, ""},
		{"own GPUHealthy heartbeat", onNode("n1"), "n1", func(n *corev1.Node) { condition(n, "GPUHealthy").LastHeartbeatTime = later }, ""},
		{"own GPUHealthy transition time", onNode("n1"), "n1", func(n *corev1.Node) { condition(n, "GPUHealthy").LastTransitionTime = later }, ""},
		{"own NICHealthy added", onNode("n1"), "n1", func(n *corev1.Node) {
			*condition(n, "NICHealthy") = corev1.NodeCondition{Type: "NICHealthy", Status: corev1.ConditionTrue, Reason: "AllNICsHealthy", LastTransitionTime: later}
		}, ""},
		{"own GPUHealthy removed", onNode("n1"), "n1", func(n *corev1.Node) { withoutCondition(n, "GPUHealthy") }, ""},
		{"own GPUHealthy set, as stored: new resourceVersion and managedFields", onNode("n1"), "n1", func(n *corev1.Node) { gpuBad(n); serverWritten(n) }, ""},
		{"the kubelet, anything", kubelet, "n1", func(n *corev1.Node) {
			condition(n, corev1.NodeReady).Status = corev1.ConditionFalse
			n.Labels["x"] = "y"
		}, ""},

		// Who may write.
		{"another node's", onNode("n1"), "n2", gpuBad, "not node n2's"},
		{"token without a node", onNode(""), "n1", gpuBad, "the token names no node"},

		// Refused: everything else the Node holds.
		{"label", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["nvidia.com/gpu.present"] = "false" }, notOurs + "metadata.labels"},
		{"node-restriction label", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels["node-restriction.kubernetes.io/x"] = "y" }, notOurs + "metadata.labels"},
		{"labels removed", onNode("n1"), "n1", func(n *corev1.Node) { n.Labels = nil }, notOurs + "metadata.labels"},
		{"annotation", onNode("n1"), "n1", func(n *corev1.Node) { n.Annotations["x"] = "y" }, notOurs + "metadata.annotations"},
		{"finalizer", onNode("n1"), "n1", func(n *corev1.Node) { n.Finalizers = []string{"example.com/keep"} }, notOurs + "metadata.finalizers"},
		{"owner reference", onNode("n1"), "n1", func(n *corev1.Node) {
			n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
		}, notOurs + "metadata.ownerReferences"},
		{"taint", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoSchedule}}
		}, notOurs + "spec"},
		{"unschedulable", onNode("n1"), "n1", func(n *corev1.Node) { n.Spec.Unschedulable = true }, notOurs + "spec"},
		{"podCIDR", onNode("n1"), "n1", func(n *corev1.Node) { n.Spec.PodCIDR = "10.244.9.0/24" }, notOurs + "spec"},
		{"providerID", onNode("n1"), "n1", func(n *corev1.Node) { n.Spec.ProviderID = "x" }, notOurs + "spec"},
		{"capacity", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Capacity["nvidia.com/gpu"] = resource.MustParse("16") }, notOurs + "status.capacity"},
		{"allocatable", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("0") }, notOurs + "status.allocatable"},
		{"addresses", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Addresses[0].Address = "192.0.2.1" }, notOurs + "status.addresses"},
		{"phase", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Phase = corev1.NodeTerminated }, notOurs + "status.phase"},
		{"nodeInfo", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.NodeInfo.KubeletVersion = "v1.99.0" }, notOurs + "status.nodeInfo"},
		{"kubelet port", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.DaemonEndpoints.KubeletEndpoint.Port = 8080 }, notOurs + "status.daemonEndpoints"},
		{"volumesInUse", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.VolumesInUse = []corev1.UniqueVolumeName{"kubernetes.io/csi/x^y"} }, notOurs + "status.volumesInUse"},
		{"volumesAttached", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Status.VolumesAttached = []corev1.AttachedVolume{{Name: "kubernetes.io/csi/x^y", DevicePath: "/dev/sdz"}}
		}, notOurs + "status.volumesAttached"},
		{"images", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Images[0].Names = []string{"example.com/trusted:latest"} }, notOurs + "status.images"},
		{"config", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Config = &corev1.NodeConfigStatus{Error: "x"} }, notOurs + "status.config"},
		{"runtimeHandlers", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.RuntimeHandlers = nil }, notOurs + "status.runtimeHandlers"},
		{"features", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.Features.SupplementalGroupsPolicy = ptr.To(false) }, notOurs + "status.features"},
		{"declaredFeatures", onNode("n1"), "n1", func(n *corev1.Node) { n.Status.DeclaredFeatures = append(n.Status.DeclaredFeatures, "X") }, notOurs + "status.declaredFeatures"},
		{"Ready", onNode("n1"), "n1", func(n *corev1.Node) {
			c := condition(n, corev1.NodeReady)
			c.Status, c.Reason = corev1.ConditionFalse, "Hacked"
		}, notOurs + "status.conditions other than GPUHealthy and NICHealthy"},
		{"a foreign condition added", onNode("n1"), "n1", func(n *corev1.Node) { condition(n, "DiskPressure").Status = corev1.ConditionTrue },
			notOurs + "status.conditions other than"},
		{"a foreign condition removed", onNode("n1"), "n1", func(n *corev1.Node) { withoutCondition(n, corev1.NodeMemoryPressure) },
			notOurs + "status.conditions other than"},
		{"own GPUHealthy and a label", onNode("n1"), "n1", func(n *corev1.Node) { gpuBad(n); serverWritten(n); n.Labels["x"] = "y" }, notOurs + "metadata.labels"},
		{"several at once, each named", onNode("n1"), "n1", func(n *corev1.Node) {
			n.Annotations = nil
			n.Status.Images = nil
		}, notOurs + "metadata.annotations, status.images"},
		// managedFields: the kubelet's entry widened to own the labels
		// makes its next apply remove them; a made-up entry the same.
		{"the kubelet's entry widened", onNode("n1"), "n1", func(n *corev1.Node) {
			gpuBad(n)
			serverWritten(n)
			n.ManagedFields[0].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{}},"f:status":{"f:conditions":{}}}`)}
		}, "may not add or widen the entries of kubelet"},
		{"another manager's entry added", onNode("n1"), "n1", func(n *corev1.Node) {
			gpuBad(n)
			serverWritten(n)
			n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "gpu-operator", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:nvidia.com/gpu.present":{}}}}`)}})
		}, "may not add or widen the entries of gpu-operator"},
		{"the kubelet's entry with a new time", onNode("n1"), "n1", func(n *corev1.Node) {
			gpuBad(n)
			n.ManagedFields[0].Time = &later
		}, "may not add or widen the entries of kubelet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := busyNode(tc.node)
			obj := old.DeepCopy()
			tc.change(obj)
			got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), tc.node, "status", admission.Update, tc.u, obj, old)
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("verdict %q, want denied with %q", got, tc.deny)
			}
		})
	}
}

// The plugin's own write, as kubeapi sends it, applied by the API server's
// strategic merge to a Node: allowed, whether it changes the condition,
// adds it, or only renews its heartbeat.
func TestHelmNodeStatusPolicyAllowsPluginPatch(t *testing.T) {
	p := nodeStatusPolicy(t)
	u := &user.DefaultInfo{Name: "system:serviceaccount:" + releaseNamespace + ":gpu-device-plugin",
		Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}}

	var patch []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPatch || r.URL.Path != "/api/v1/nodes/n1/status" || r.Header.Get("Content-Type") != "application/strategic-merge-patch+json" {
			t.Errorf("plugin sent %s %s (%s), want a strategic merge patch of nodes/n1/status", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		patch, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	api, err := kubeapi.New(kubeapi.Config{Server: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := kubeapi.NewTime(time.Date(2026, 5, 1, 12, 5, 0, 0, time.UTC))

	for _, tc := range []struct {
		name string
		old  func(*corev1.Node)
		cond kubeapi.NodeCondition
	}{
		{"GPUHealthy turns False", func(*corev1.Node) {}, kubeapi.NodeCondition{Type: "GPUHealthy", Status: "False", Reason: "GPUUnhealthy", Message: "GPU-a (index 0): xid=79", LastHeartbeatTime: now, LastTransitionTime: now}},
		{"GPUHealthy heartbeat", func(*corev1.Node) {}, kubeapi.NodeCondition{Type: "GPUHealthy", Status: "True", Reason: "AllGPUsHealthy", LastHeartbeatTime: now, LastTransitionTime: kubeapi.NewTime(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))}},
		{"GPUHealthy first set", func(n *corev1.Node) { withoutCondition(n, "GPUHealthy") }, kubeapi.NodeCondition{Type: "GPUHealthy", Status: "True", Reason: "AllGPUsHealthy", LastHeartbeatTime: now, LastTransitionTime: now}},
		{"NICHealthy first set", func(*corev1.Node) {}, kubeapi.NodeCondition{Type: "NICHealthy", Status: "True", Reason: "AllNICsHealthy", LastHeartbeatTime: now, LastTransitionTime: now}},
		// Within the API server's CEL cost limits with room to spare.
		{"on a large Node", bigger, kubeapi.NodeCondition{Type: "GPUHealthy", Status: "False", Reason: "GPUUnhealthy", LastHeartbeatTime: now, LastTransitionTime: now}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := busyNode("n1")
			tc.old(old)
			if err := api.PatchNodeCondition(context.Background(), "n1", tc.cond); err != nil {
				t.Fatal(err)
			}
			oldJSON, err := json.Marshal(old)
			if err != nil {
				t.Fatal(err)
			}
			newJSON, err := strategicpatch.StrategicMergePatch(oldJSON, patch, &corev1.Node{})
			if err != nil {
				t.Fatalf("applying the plugin's patch %s: %v", patch, err)
			}
			obj := &corev1.Node{}
			if err := json.Unmarshal(newJSON, obj); err != nil {
				t.Fatal(err)
			}
			if got := condition(obj, corev1.NodeConditionType(tc.cond.Type)); string(got.Status) != tc.cond.Status || got.Reason != tc.cond.Reason {
				t.Fatalf("after the patch %s: %+v, want the plugin's condition", patch, got)
			}
			serverWritten(obj)
			if got := policyVerdictOn(t, p, corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node"), "n1", "status", admission.Update, u, obj, old); got != "" {
				t.Errorf("the plugin's patch %s denied: %s", patch, got)
			}
		})
	}
}

package computedomain

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

const driver = "gpu-device-plugin.github.io"

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func domain(numNodes int, nodes ...cd.Node) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cd.APIVersion, "kind": cd.Kind,
		"metadata": map[string]any{"name": "job", "namespace": "team", "uid": "uid-1"},
		"spec": map[string]any{"numNodes": int64(numNodes),
			"channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": "job-channel"}}},
	}}
	if len(nodes) > 0 {
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cd.Status{Nodes: nodes})
		if err != nil {
			panic(err)
		}
		u.Object["status"] = st
	}
	return u
}

func slice(node string, clique string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node, Devices: []resourcev1.Device{{
			Name: "channel-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{CliqueAttribute: {StringValue: &clique}}}}},
	}
}

func setup(t *testing.T, objs ...runtime.Object) (*Controller, *dynfake.FakeDynamicClient, *kfake.Clientset, []runtime.Object) {
	var dyn, kube []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dyn = append(dyn, o)
		} else {
			kube = append(kube, o)
		}
	}
	dc := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{GVR: "ComputeDomainList"}, dyn...)
	kc := kfake.NewClientset(kube...)
	applyStatus(t, dc)
	c := New(Options{Dynamic: dc, Kube: kc, DriverName: driver, NodeTimeout: time.Minute, Now: func() time.Time { return now }})
	return c, dc, kc, objs
}

func status(t *testing.T, dc *dynfake.FakeDynamicClient) cd.Status {
	t.Helper()
	u, err := dc.Resource(GVR).Namespace("team").Get(context.Background(), "job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	return d.Status
}

func events(t *testing.T, kc *kfake.Clientset) []corev1.Event {
	t.Helper()
	l, err := kc.CoreV1().Events("team").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func TestTemplateCreatedWithOwnerAndConfig(t *testing.T) {
	c, dc, kc, _ := setup(t, domain(2), slice("n1", "x.1"), slice("n2", "x.1"))
	if err := c.Reconcile(t.Context(), "team", "job"); err != nil {
		t.Fatal(err)
	}
	rct, err := kc.ResourceV1().ResourceClaimTemplates("team").Get(t.Context(), "job-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("template not created: %v", err)
	}
	if len(rct.OwnerReferences) != 1 || rct.OwnerReferences[0].UID != types.UID("uid-1") || rct.OwnerReferences[0].Kind != cd.Kind || !*rct.OwnerReferences[0].Controller {
		t.Errorf("owner: %+v", rct.OwnerReferences)
	}
	req := rct.Spec.Spec.Devices.Requests[0].Exactly
	if req.DeviceClassName != ChannelClass || req.Count != 1 || req.AllocationMode != resourcev1.DeviceAllocationModeExactCount {
		t.Errorf("request: %+v", req)
	}
	op := rct.Spec.Spec.Devices.Config[0].Opaque
	var cfg ChannelConfig
	if err := json.Unmarshal(op.Parameters.Raw, &cfg); err != nil || op.Driver != driver {
		t.Fatal(err, op.Driver)
	}
	if cfg.DomainUID != "uid-1" || cfg.Kind != ChannelConfigKind || cfg.DomainName != "job" {
		t.Errorf("config: %+v", cfg)
	}
	// Keys sorted, as the API server's unstructured round trip writes
	// them: a claim's allocation copies these bytes, and the node's
	// server-side apply of the claim's status must not change them.
	var asMap map[string]any
	if err := json.Unmarshal(op.Parameters.Raw, &asMap); err != nil {
		t.Fatal(err)
	}
	if canon, _ := json.Marshal(asMap); string(canon) != string(op.Parameters.Raw) {
		t.Errorf("parameters %s, want their keys sorted: %s", op.Parameters.Raw, canon)
	}
	st := status(t, dc)
	if st.Status != cd.NotReady || st.Reason != cd.ReasonWaitingForNodes {
		t.Errorf("status: %+v", st)
	}
	// Reconciled again with nothing new: no second Event.
	if err := c.Reconcile(t.Context(), "team", "job"); err != nil {
		t.Fatal(err)
	}
	if ev := events(t, kc); len(ev) != 1 || ev[0].Reason != cd.ReasonWaitingForNodes || ev[0].InvolvedObject.Kind != cd.Kind {
		t.Errorf("events: %+v", ev)
	}
}

func TestReadyWhenNodesReport(t *testing.T) {
	hb := now.Add(-5 * time.Second).Format(time.RFC3339)
	nodes := []cd.Node{{Name: "n1", IPAddress: "10.0.0.1", CliqueID: "x.1", Status: cd.Ready, Heartbeat: hb},
		{Name: "n2", IPAddress: "10.0.0.2", CliqueID: "x.1", Status: cd.Ready, Heartbeat: hb}}
	c, dc, kc, _ := setup(t, domain(2, nodes...), slice("n1", "x.1"), slice("n2", "x.1"))
	if err := c.Reconcile(t.Context(), "team", "job"); err != nil {
		t.Fatal(err)
	}
	st := status(t, dc)
	if st.Status != cd.Ready || len(st.Nodes) != 2 {
		t.Errorf("status: %+v", st)
	}
	if ev := events(t, kc); len(ev) != 1 || ev[0].Type != corev1.EventTypeNormal || ev[0].Reason != cd.ReasonDomainReady {
		t.Errorf("events: %+v", ev)
	}
}

func TestUnsatisfiableIsReportedWithWarning(t *testing.T) {
	hb := now.Format(time.RFC3339)
	for _, c := range []struct {
		name   string
		obj    *unstructured.Unstructured
		reason string
	}{
		{"more nodes than any clique", domain(3), cd.ReasonTooManyNodes},
		{"mixed cliques", domain(2,
			cd.Node{Name: "n1", CliqueID: "x.1", Status: cd.Ready, Heartbeat: hb},
			cd.Node{Name: "n3", CliqueID: "x.2", Status: cd.Ready, Heartbeat: hb}), cd.ReasonMixedCliques},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl, dc, kc, _ := setup(t, c.obj, slice("n1", "x.1"), slice("n2", "x.1"), slice("n3", "x.2"))
			if err := ctl.Reconcile(t.Context(), "team", "job"); err != nil {
				t.Fatal(err)
			}
			if st := status(t, dc); st.Reason != c.reason || st.Status != cd.NotReady {
				t.Errorf("status: %+v", st)
			}
			ev := events(t, kc)
			if len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning || ev[0].Reason != c.reason {
				t.Errorf("events: %+v", ev)
			}
		})
	}
}

func TestForeignTemplateIsNotTaken(t *testing.T) {
	other := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "job-channel", Namespace: "team"}}
	c, dc, kc, _ := setup(t, domain(1), other)
	err := c.Reconcile(t.Context(), "team", "job")
	if err == nil || !strings.Contains(err.Error(), "spec.channel.resourceClaimTemplate.name") {
		t.Fatalf("got %v", err)
	}
	if st := status(t, dc); st.Reason != ReasonTemplate {
		t.Errorf("status: %+v", st)
	}
	if ev := events(t, kc); len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning {
		t.Errorf("events: %+v", ev)
	}
}

func TestGoneDomainNeedsNothing(t *testing.T) {
	c, _, _, _ := setup(t)
	if err := c.Reconcile(t.Context(), "team", "job"); err != nil {
		t.Fatal(err)
	}
}

// applyStatus has the fake serve the controller's server-side apply of
// status: the keys it applies under status replace those of the object,
// status.nodes (the nodes' own) stays as it is unless applied. It
// refuses an apply that is not forced or names no field manager, as the
// controller must never conflict with the nodes.
func applyStatus(t *testing.T, dc *dynfake.FakeDynamicClient) {
	dc.PrependReactor("patch", GVR.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		if pa.GetPatchType() != types.ApplyPatchType || pa.GetSubresource() != "status" {
			return false, nil, nil
		}
		var body struct {
			Status map[string]any `json:"status"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		if _, ok := body.Status["nodes"]; ok {
			t.Errorf("the controller applied status.nodes, which the nodes own: %s", pa.GetPatch())
		}
		o, err := dc.Tracker().Get(GVR, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		u := o.(*unstructured.Unstructured).DeepCopy()
		st, _ := u.Object["status"].(map[string]any)
		if st == nil {
			st = map[string]any{}
		}
		for k, v := range body.Status {
			st[k] = v
		}
		u.Object["status"] = st
		return true, u, dc.Tracker().Update(GVR, u, pa.GetNamespace())
	})
}

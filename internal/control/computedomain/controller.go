// Package computedomain is the ComputeDomain controller: it runs once per
// cluster (one Deployment, one leader through a Lease), creates each
// domain's ResourceClaimTemplate under the name the user gave, and sums
// the nodes' entries into the domain's status with Events. The nodes write
// their own entries (internal/serve/dra); the controller never runs a
// daemon.
package computedomain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

// GVR is the ComputeDomain resource.
var GVR = schema.GroupVersionResource{Group: cd.Group, Version: cd.Version, Resource: cd.Resource}

// ChannelConfig is the opaque config the template's claims carry: which
// domain the channel is for. The kubelet plugin reads it at Prepare.
type ChannelConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// DomainUID, DomainName and DomainNamespace name the ComputeDomain.
	DomainUID       string `json:"domainUID"`
	DomainName      string `json:"domainName"`
	DomainNamespace string `json:"domainNamespace"`
	// AllocationMode is the domain's spec.channel.allocationMode.
	AllocationMode string `json:"allocationMode,omitempty"`
}

// ChannelConfigKind is ChannelConfig's kind.
const ChannelConfigKind = "ComputeDomainChannelConfig"

// ChannelClass is the DeviceClass of IMEX channels, which the chart
// installs: devices of our driver with type "channel".
const ChannelClass = "compute-domain-channel." + cd.Group

// Options configure a Controller.
type Options struct {
	Dynamic dynamic.Interface
	Kube    kubernetes.Interface
	// DriverName is the DRA driver whose ResourceSlices carry the channel
	// devices, and whose opaque config the templates carry.
	DriverName string
	// NodeTimeout: a node entry older than this is reported lost.
	NodeTimeout time.Duration
	Log         *slog.Logger
	Now         func() time.Time
}

// Controller reconciles ComputeDomains.
type Controller struct{ o Options }

// New makes a Controller.
func New(o Options) *Controller {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Controller{o: o}
}

// Domain is a ComputeDomain object as the controller reads it.
type Domain struct {
	Namespace, Name, UID string
	Spec                 cd.Spec
	Status               cd.Status
	obj                  *unstructured.Unstructured
}

// FromUnstructured reads a ComputeDomain object.
func FromUnstructured(u *unstructured.Unstructured) (Domain, error) {
	d := Domain{Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID()), obj: u}
	var body struct {
		Spec   cd.Spec   `json:"spec"`
		Status cd.Status `json:"status"`
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &body); err != nil {
		return d, fmt.Errorf("ComputeDomain %s/%s: %w", d.Namespace, d.Name, err)
	}
	d.Spec, d.Status = body.Spec, body.Status
	return d, nil
}

// Reconcile brings one domain's template and status in line. A domain
// that is gone needs nothing: its template goes with it (owner
// reference), and the nodes stop its daemons when they see it gone.
func (c *Controller) Reconcile(ctx context.Context, namespace, name string) error {
	u, err := c.o.Dynamic.Resource(GVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("getting ComputeDomain %s/%s: %w", namespace, name, err)
	}
	d, err := FromUnstructured(u)
	if err != nil {
		return err
	}
	if u.GetDeletionTimestamp() != nil {
		return nil
	}
	var templateErr error
	if d.Spec.Validate() == nil {
		templateErr = c.ensureTemplate(ctx, d)
	}
	cliques, err := c.cliqueNodes(ctx)
	if err != nil {
		c.o.Log.Warn("ComputeDomain: counting the cliques' nodes", "err", err)
		cliques = nil
	}
	st, unsatisfiable := cd.Evaluate(d.Spec, d.Status.Nodes, cd.Facts{CliqueNodes: cliques, Now: c.o.Now(), NodeTimeout: c.o.NodeTimeout})
	if templateErr != nil {
		st.Status, st.Reason, st.Message = cd.NotReady, ReasonTemplate, templateErr.Error()
	}
	if err := c.writeStatus(ctx, d, st); err != nil {
		return err
	}
	if st.Reason != d.Status.Reason {
		typ := corev1.EventTypeNormal
		if unsatisfiable || templateErr != nil || st.Reason == cd.ReasonNodeLost {
			typ = corev1.EventTypeWarning
		}
		c.event(ctx, d, typ, st.Reason, st.Message)
	}
	return templateErr
}

// ReasonTemplate: the domain's template could not be made (a template of
// that name that is not the domain's, or the API refused).
const ReasonTemplate = "TemplateNotCreated"

// writeStatus applies the domain's top-level status (status, reason,
// message) with the controller's field manager, forced: the nodes own
// their entries in status.nodes (each its own manager), so the controller
// never writes them and never conflicts with a node. A lost node is named
// in the message and the reason; its entry stays as the node wrote it.
func (c *Controller) writeStatus(ctx context.Context, d Domain, st cd.Status) error {
	if st.Status == d.Status.Status && st.Reason == d.Status.Reason && st.Message == d.Status.Message {
		return nil
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": cd.APIVersion, "kind": cd.Kind,
		"metadata": map[string]any{"name": d.Name, "namespace": d.Namespace},
		"status":   map[string]any{"status": st.Status, "reason": st.Reason, "message": st.Message},
	})
	if err != nil {
		return err
	}
	force := true
	if _, err := c.o.Dynamic.Resource(GVR).Namespace(d.Namespace).Patch(ctx, d.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: &force}, "status"); err != nil {
		return fmt.Errorf("writing the status of ComputeDomain %s/%s: %w", d.Namespace, d.Name, err)
	}
	return nil
}

// FieldManager is the controller's field manager.
const FieldManager = "gpu-device-plugin-compute-domain-controller"

// Template is the ResourceClaimTemplate of domain d.
func Template(d Domain, driver string) (*resourcev1.ResourceClaimTemplate, error) {
	mode := resourcev1.DeviceAllocationModeExactCount
	var count int64 = 1
	if d.Spec.Channel.AllocationMode == cd.AllocationAll {
		mode, count = resourcev1.DeviceAllocationModeAll, 0
	}
	params, err := sortedJSON(ChannelConfig{APIVersion: cd.APIVersion, Kind: ChannelConfigKind,
		DomainUID: d.UID, DomainName: d.Name, DomainNamespace: d.Namespace, AllocationMode: d.Spec.Channel.AllocationMode})
	if err != nil {
		return nil, err
	}
	yes := true
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Spec.Channel.ResourceClaimTemplate.Name, Namespace: d.Namespace,
			Labels: map[string]string{DomainLabel: d.UID},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: cd.APIVersion, Kind: cd.Kind,
				Name: d.Name, UID: d.obj.GetUID(), Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "channel", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: ChannelClass, AllocationMode: mode, Count: count}}},
			Config: []resourcev1.DeviceClaimConfiguration{{Requests: []string{"channel"},
				DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{
					Driver: driver, Parameters: runtime.RawExtension{Raw: params}}}}},
		}}},
	}, nil
}

// sortedJSON is v as JSON with its object keys sorted, as the API server
// writes an unstructured object. A claim's allocation copies the template's
// opaque parameters byte for byte, and a server-side apply of the claim's
// status (the node's device status) round-trips them through such an
// object: in struct order the bytes differ, and the API server refuses the
// apply as a change of the allocation ("field cannot be modified once
// set").
func sortedJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// DomainLabel marks the templates the controller made with their
// domain's UID.
const DomainLabel = cd.Group + "/compute-domain"

func (c *Controller) ensureTemplate(ctx context.Context, d Domain) error {
	want, err := Template(d, c.o.DriverName)
	if err != nil {
		return err
	}
	api := c.o.Kube.ResourceV1().ResourceClaimTemplates(d.Namespace)
	got, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := api.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return fmt.Errorf("creating ResourceClaimTemplate %s/%s: %w", d.Namespace, want.Name, err)
		}
		c.o.Log.Info("ComputeDomain: template created", "namespace", d.Namespace, "domain", d.Name, "template", want.Name)
		return nil
	case err != nil:
		return fmt.Errorf("getting ResourceClaimTemplate %s/%s: %w", d.Namespace, want.Name, err)
	case !metav1.IsControlledBy(got, d.obj):
		return fmt.Errorf("ResourceClaimTemplate %s/%s exists and is not this ComputeDomain's; delete it or name another in spec.channel.resourceClaimTemplate.name", d.Namespace, want.Name)
	}
	// A template's spec is immutable: one made for another spec of this
	// domain stays until the domain is made again.
	return nil
}

// cliqueNodes counts the nodes of each clique from the channel devices
// the nodes publish (attribute cliqueID).
func (c *Controller) cliqueNodes(ctx context.Context) (map[string]int, error) {
	list, err := c.o.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + c.o.DriverName})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	seen := map[string]map[string]bool{}
	for _, s := range list.Items {
		if s.Spec.Driver != c.o.DriverName || s.Spec.NodeName == nil {
			continue
		}
		for _, dev := range s.Spec.Devices {
			a, ok := dev.Attributes[CliqueAttribute]
			if !ok || a.StringValue == nil {
				continue
			}
			if seen[*a.StringValue] == nil {
				seen[*a.StringValue] = map[string]bool{}
			}
			seen[*a.StringValue][*s.Spec.NodeName] = true
		}
	}
	out := map[string]int{}
	for k, v := range seen {
		out[k] = len(v)
	}
	return out, nil
}

// CliqueAttribute is the channel devices' attribute naming their clique.
const CliqueAttribute resourcev1.QualifiedName = "cliqueID"

func (c *Controller) event(ctx context.Context, d Domain, typ, reason, msg string) {
	now := metav1.NewTime(c.o.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: d.Name + ".", Namespace: d.Namespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: cd.APIVersion, Kind: cd.Kind,
			Namespace: d.Namespace, Name: d.Name, UID: d.obj.GetUID()},
		Type: typ, Reason: reason, Message: msg, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source: corev1.EventSource{Component: "compute-domain-controller"},
	}
	if _, err := c.o.Kube.CoreV1().Events(d.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.o.Log.Warn("ComputeDomain: Event not written", "namespace", d.Namespace, "domain", d.Name, "reason", reason, "err", err)
	}
}

// ErrNotLeader is returned by Run's callers when leadership is lost.
var ErrNotLeader = errors.New("compute-domain-controller: lost the lease")

package nodelabels

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
)

// NodeFeature naming, as GPU Feature Discovery has it, so that the plugin
// takes GFD's object over (and GFD the plugin's) rather than both asking
// nfd-master for the same labels: nvidia-features-for-<node>, in the
// plugin's namespace, with NFD's node-name label saying which Node its
// labels go on.
const (
	NodeFeaturePrefix = "nvidia-features-for-"
	NodeNameLabel     = "nfd.node.kubernetes.io/node-name"
)

// FeatureAPI is what the NodeFeature writer needs of the API server;
// *kubeapi.Client has it.
type FeatureAPI interface {
	GetPod(ctx context.Context, namespace, name string) (kubeapi.Pod, error)
	GetNodeFeature(ctx context.Context, namespace, name string) (kubeapi.NodeFeature, error)
	CreateNodeFeature(ctx context.Context, f kubeapi.NodeFeature) error
	UpdateNodeFeature(ctx context.Context, f kubeapi.NodeFeature) error
}

// FeatureWriter keeps the labels in an NFD NodeFeature object, which
// nfd-master turns into the Node's labels: no Node access, and no
// nfd-worker or host folder needed on the node.
type FeatureWriter struct {
	API       FeatureAPI
	Namespace string
	Node      string
	// Pod is the plugin's Pod, in Namespace; empty: the object has no
	// owner. With it the object is owned by the Pod's DaemonSet (its
	// controller) and the Pod, as GFD's is, so that deleting the
	// DaemonSet deletes it.
	Pod string

	// owners are the owner references, read once from the Pod.
	owners   []kubeapi.OwnerReference
	resolved bool
}

// Name is the object's name.
func (w *FeatureWriter) Name() string { return NodeFeaturePrefix + w.Node }

// Sync reads the object and creates it when it is missing, or replaces it
// when its labels, node-name label, owners or features differ from what
// they should be; at rest it only reads. It says whether it wrote.
func (w *FeatureWriter) Sync(ctx context.Context, l labels.Labels) (bool, error) {
	if err := w.resolveOwners(ctx); err != nil {
		return false, err
	}
	want := w.object(l)
	got, err := w.API.GetNodeFeature(ctx, w.Namespace, w.Name())
	switch {
	case kubeapi.IsNotFound(err):
		if err := w.API.CreateNodeFeature(ctx, want); err != nil {
			return false, fmt.Errorf("creating NodeFeature %s/%s: %w", w.Namespace, w.Name(), err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading NodeFeature %s/%s: %w", w.Namespace, w.Name(), err)
	}
	if current(got, want) {
		return false, nil
	}
	// Whatever else its metadata holds (annotations, finalizers) is kept;
	// the resourceVersion read makes a write that raced another a 409.
	next := got
	next.Metadata.Labels = want.Metadata.Labels
	next.Metadata.OwnerReferences = want.Metadata.OwnerReferences
	next.Spec = want.Spec
	if err := w.API.UpdateNodeFeature(ctx, next); err != nil {
		return false, fmt.Errorf("updating NodeFeature %s/%s: %w", w.Namespace, w.Name(), err)
	}
	return true, nil
}

// object is the NodeFeature holding l.
func (w *FeatureWriter) object(l labels.Labels) kubeapi.NodeFeature {
	spec := map[string]string{}
	maps.Copy(spec, l)
	return kubeapi.NodeFeature{
		APIVersion: kubeapi.NodeFeatureAPIVersion,
		Kind:       kubeapi.NodeFeatureKind,
		Metadata: kubeapi.ObjectMeta{
			Name:            w.Name(),
			Namespace:       w.Namespace,
			Labels:          map[string]string{NodeNameLabel: w.Node},
			OwnerReferences: w.owners,
		},
		Spec: kubeapi.NodeFeatureSpec{
			Features: kubeapi.NodeFeatureFeatures{Flags: map[string]json.RawMessage{}, Attributes: map[string]json.RawMessage{}, Instances: map[string]json.RawMessage{}},
			Labels:   spec,
		},
	}
}

// current says whether got already is want, as far as the writer owns it.
func current(got, want kubeapi.NodeFeature) bool {
	f := got.Spec.Features
	return maps.Equal(got.Metadata.Labels, want.Metadata.Labels) &&
		maps.Equal(got.Spec.Labels, want.Spec.Labels) &&
		reflect.DeepEqual(got.Metadata.OwnerReferences, want.Metadata.OwnerReferences) &&
		len(f.Flags)+len(f.Attributes)+len(f.Instances) == 0
}

// resolveOwners reads the Pod once: the DaemonSet controlling it (as the
// controller) and the Pod itself. A Pod no DaemonSet controls gives none.
func (w *FeatureWriter) resolveOwners(ctx context.Context) error {
	if w.resolved || w.Pod == "" {
		return nil
	}
	p, err := w.API.GetPod(ctx, w.Namespace, w.Pod)
	if err != nil {
		return fmt.Errorf("reading pod %s/%s for the NodeFeature's owners: %w", w.Namespace, w.Pod, err)
	}
	w.resolved = true
	for _, o := range p.Metadata.OwnerReferences {
		if o.Kind != "DaemonSet" {
			continue
		}
		controller := true
		w.owners = []kubeapi.OwnerReference{
			{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID, Controller: &controller},
			{APIVersion: "v1", Kind: "Pod", Name: p.Metadata.Name, UID: p.Metadata.UID},
		}
		break
	}
	return nil
}

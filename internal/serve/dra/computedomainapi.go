package dra

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

// domainGVR is the ComputeDomain resource.
var domainGVR = schema.GroupVersionResource{Group: cd.Group, Version: cd.Version, Resource: cd.Resource}

// NodeFieldManager is the field manager of node's entry in the domains'
// status: one per node, so each node owns its entry of the map-typed
// status.nodes and nodes never conflict; the controller's manager owns
// the top-level status fields only.
func NodeFieldManager(node string) string { return "gpu-device-plugin-node-" + node }

// apiDomains is DomainAPI over the API server.
type apiDomains struct {
	client dynamic.Interface
	node   string
}

// NewDomainAPI is DomainAPI over client for node.
func NewDomainAPI(client dynamic.Interface, node string) DomainAPI {
	return apiDomains{client: client, node: node}
}

func (a apiDomains) GetDomain(ctx context.Context, namespace, name string) (Domain, error) {
	u, err := a.client.Resource(domainGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Domain{}, fmt.Errorf("%w: %s/%s", ErrDomainGone, namespace, name)
	}
	if err != nil {
		return Domain{}, fmt.Errorf("reading ComputeDomain %s/%s: %w", namespace, name, err)
	}
	d := Domain{Namespace: namespace, Name: name, UID: string(u.GetUID()), Deleting: u.GetDeletionTimestamp() != nil}
	if st, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(st, &d.Status); err != nil {
			return d, fmt.Errorf("ComputeDomain %s/%s: status: %w", namespace, name, err)
		}
	}
	return d, nil
}

// applyNodes applies status.nodes as nodes, forced, as this node's
// manager: the entries it owned and leaves out are removed.
func (a apiDomains) applyNodes(ctx context.Context, namespace, name string, nodes []cd.Node) error {
	body, err := json.Marshal(map[string]any{
		"apiVersion": cd.APIVersion, "kind": cd.Kind,
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"status":   map[string]any{"nodes": nodes},
	})
	if err != nil {
		return err
	}
	force := true
	_, err = a.client.Resource(domainGVR).Namespace(namespace).Patch(ctx, name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: NodeFieldManager(a.node), Force: &force}, "status")
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s/%s", ErrDomainGone, namespace, name)
	}
	if err != nil {
		return fmt.Errorf("applying node %s's entry in ComputeDomain %s/%s: %w", a.node, namespace, name, err)
	}
	return nil
}

func (a apiDomains) ApplyNode(ctx context.Context, namespace, name string, n cd.Node) error {
	return a.applyNodes(ctx, namespace, name, []cd.Node{n})
}

func (a apiDomains) RemoveNode(ctx context.Context, namespace, name string) error {
	return a.applyNodes(ctx, namespace, name, []cd.Node{})
}

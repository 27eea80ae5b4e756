package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
)

// domainsPath is the path of namespace's ComputeDomains.
func domainPath(namespace, name string) string {
	return "/apis/" + cd.Group + "/" + cd.Version + "/namespaces/" + url.PathEscape(namespace) + "/" + cd.Resource + "/" + url.PathEscape(name)
}

// NodeFieldManager is the field manager of node's entry in the domains'
// status: one per node, so each node owns its entry of the map-typed
// status.nodes and nodes never conflict; the controller's manager owns
// the top-level status fields only.
func NodeFieldManager(node string) string { return "gpu-device-plugin-node-" + node }

// apiDomains is DomainAPI over the API server.
type apiDomains struct {
	api  *draapi.Client
	node string
}

// NewDomainAPI is DomainAPI over api for node.
func NewDomainAPI(api *draapi.Client, node string) DomainAPI {
	return apiDomains{api: api, node: node}
}

func (a apiDomains) GetDomain(ctx context.Context, namespace, name string) (Domain, error) {
	var obj struct {
		Metadata struct {
			UID               string       `json:"uid"`
			DeletionTimestamp *metav1.Time `json:"deletionTimestamp"`
		} `json:"metadata"`
		Status json.RawMessage `json:"status"`
	}
	err := a.api.Get(ctx, domainPath(namespace, name), cd.Resource, &obj)
	if apierrors.IsNotFound(err) {
		return Domain{}, fmt.Errorf("%w: %s/%s", ErrDomainGone, namespace, name)
	}
	if err != nil {
		return Domain{}, fmt.Errorf("reading ComputeDomain %s/%s: %w", namespace, name, err)
	}
	d := Domain{Namespace: namespace, Name: name, UID: obj.Metadata.UID, Deleting: obj.Metadata.DeletionTimestamp != nil}
	if len(obj.Status) > 0 && string(obj.Status) != "null" {
		if err := json.Unmarshal(obj.Status, &d.Status); err != nil {
			return d, fmt.Errorf("ComputeDomain %s/%s: status: %w", namespace, name, err)
		}
	}
	return d, nil
}

// applyNodes applies status.nodes as nodes, forced, as this node's
// manager: the entries it owned and leaves out are removed.
func (a apiDomains) applyNodes(ctx context.Context, namespace, name string, nodes []cd.Node) error {
	body := map[string]any{
		"apiVersion": cd.APIVersion, "kind": cd.Kind,
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"status":   map[string]any{"nodes": nodes},
	}
	err := a.api.ApplyStatus(ctx, domainPath(namespace, name), cd.Resource+"/status", NodeFieldManager(a.node), body)
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

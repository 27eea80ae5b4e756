// Package draapi is the DRA daemon's side of the API server: ResourceClaims,
// ResourceSlices, the Node's UID and ComputeDomains, as JSON over
// kubeapi's client. It links no client-go: client-go's clientset registers
// every API group, which made gpu-device-plugin-dra three times the size
// of the device-plugin daemon (docs/architecture.md, "Where the memory
// goes").
//
// Like client-go's defaults it holds the daemon to a request rate (QPS,
// Burst) and waits out a 429's or 5xx's Retry-After, up to 10 tries.
// Errors the server answered are *apierrors.StatusError, so
// apierrors.IsNotFound and the rest read them.
package draapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"golang.org/x/time/rate"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// Resource paths of resource.k8s.io/v1.
const (
	resourcePrefix = "/apis/" + resourceapi.GroupName + "/v1"
	slicesPath     = resourcePrefix + "/resourceslices"
)

// maxTries is how often a request the server asked us to retry later (a
// 429 or 5xx with Retry-After) is made, as client-go.
const maxTries = 10

// maxRetryWait bounds one wait a Retry-After asks for.
const maxRetryWait = time.Minute

// Client makes the DRA daemon's API calls. It is safe for concurrent use.
type Client struct {
	kube    *kubeapi.Client
	limit   *rate.Limiter
	manager string
}

// New is a Client over kube holding requests to qps a second, bursts of
// burst; manager is the field manager of its writes.
func New(kube *kubeapi.Client, qps float64, burst int, manager string) *Client {
	return &Client{kube: kube, limit: rate.NewLimiter(rate.Limit(qps), burst), manager: manager}
}

// do makes r within the request limit, retrying as the server asks.
func (c *Client) do(ctx context.Context, r kubeapi.Request, out any) error {
	for try := 1; ; try++ {
		if err := c.limit.Wait(ctx); err != nil {
			return fmt.Errorf("%s %s: %w", r.Method, r.Path, err)
		}
		err := c.kube.Do(ctx, r, out)
		wait, retry := retryable(err)
		if !retry || try >= maxTries {
			return apiError(err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return apiError(err)
		case <-t.C:
		}
	}
}

// retryable says whether err is an answer asking to be retried later, and
// after how long.
func retryable(err error) (time.Duration, bool) {
	var se *kubeapi.StatusError
	if !errors.As(err, &se) || se.RetryAfter <= 0 {
		return 0, false
	}
	if se.Code != http.StatusTooManyRequests && se.Code < 500 {
		return 0, false
	}
	return min(se.RetryAfter, maxRetryWait), true
}

// apiError makes an API answer an *apierrors.StatusError wrapped with the
// request, so that apierrors' predicates read it; other errors pass as
// they are.
func apiError(err error) error {
	var se *kubeapi.StatusError
	if !errors.As(err, &se) {
		return err
	}
	// As client-go reads an answer that was no Status: by its code.
	st := apierrors.NewGenericServerResponse(se.Code, se.Method, schema.GroupResource{}, "", se.Message, 0, false).ErrStatus
	if len(se.Status) > 0 {
		var full metav1.Status
		if json.Unmarshal(se.Status, &full) == nil {
			st = full
			st.Code = int32(se.Code)
		}
	}
	if se.RetryAfter > 0 {
		if st.Details == nil {
			st.Details = &metav1.StatusDetails{}
		}
		st.Details.RetryAfterSeconds = int32(se.RetryAfter / time.Second)
	}
	return fmt.Errorf("%s %s: %w", se.Method, se.Path, &apierrors.StatusError{ErrStatus: st})
}

// GetClaim reads a ResourceClaim: the namespaced GET the chart's RBAC
// grants (resourceclaims get).
func (c *Client) GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	var out resourceapi.ResourceClaim
	err := c.do(ctx, kubeapi.Request{Method: http.MethodGet, Resource: "resourceclaims", Path: claimPath(namespace, name)}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

func claimPath(namespace, name string) string {
	return resourcePrefix + "/namespaces/" + url.PathEscape(namespace) + "/resourceclaims/" + url.PathEscape(name)
}

// ApplyClaimStatus server-side-applies status as the claim's status,
// forced, as the client's field manager; uid, when set, makes the server
// refuse a claim made again under the same name.
func (c *Client) ApplyClaimStatus(ctx context.Context, namespace, name string, uid types.UID, status any) error {
	meta := map[string]any{"name": name, "namespace": namespace}
	if uid != "" {
		meta["uid"] = uid
	}
	body := map[string]any{
		"apiVersion": resourceapi.SchemeGroupVersion.String(), "kind": "ResourceClaim",
		"metadata": meta, "status": status,
	}
	return c.ApplyStatus(ctx, claimPath(namespace, name), "resourceclaims/status", "", body)
}

// ApplyStatus server-side-applies body to the status subresource of the
// object at path, forced, as field manager manager (empty: the client's);
// resource names the request for the metrics.
func (c *Client) ApplyStatus(ctx context.Context, path, resource, manager string, body any) error {
	q := url.Values{"force": {"true"}, "fieldManager": {cmp.Or(manager, c.manager)}}
	return c.do(ctx, kubeapi.Request{
		Method: http.MethodPatch, Resource: resource, Path: path + "/status", Query: q,
		ContentType: "application/apply-patch+yaml", Body: body,
	}, nil)
}

// Get reads the object at path into out.
func (c *Client) Get(ctx context.Context, path, resource string, out any) error {
	return c.do(ctx, kubeapi.Request{Method: http.MethodGet, Resource: resource, Path: path}, out)
}

// SliceSelector is the field selector of a node's slices of a driver:
// the Node authorizer lets a node's credentials list no others.
func SliceSelector(driver, node string) string {
	return resourceapi.ResourceSliceSelectorDriver + "=" + driver + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node
}

// ListSlices lists the ResourceSlices that selector selects; fromCache
// lets the API server answer from its watch cache (resourceVersion 0).
func (c *Client) ListSlices(ctx context.Context, selector string, fromCache bool) (*resourceapi.ResourceSliceList, error) {
	q := url.Values{"fieldSelector": {selector}}
	if fromCache {
		q.Set("resourceVersion", "0")
	}
	var out resourceapi.ResourceSliceList
	if err := c.do(ctx, kubeapi.Request{Method: http.MethodGet, Resource: "resourceslices", Path: slicesPath, Query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SliceEvent is one change a watch of slices saw. Type is ADDED, MODIFIED,
// DELETED or BOOKMARK (Slice then carries only the resourceVersion).
type SliceEvent struct {
	Type  string
	Slice *resourceapi.ResourceSlice
}

// watchTimeout is how long the server keeps one watch open; a new one
// follows. client-go picks 5–10 minutes.
const watchTimeout = 8 * time.Minute

// WatchSlices watches the slices selector selects from resourceVersion
// rv and hands fn each event, until the server ends the watch (nil), ctx
// ends or an error. An ERROR event (a 410 Gone: rv is too old) is
// returned as an *apierrors.StatusError.
func (c *Client) WatchSlices(ctx context.Context, selector, rv string, fn func(SliceEvent) error) error {
	q := url.Values{
		"fieldSelector": {selector}, "watch": {"true"}, "resourceVersion": {rv},
		"allowWatchBookmarks": {"true"}, "timeoutSeconds": {fmt.Sprint(int(watchTimeout / time.Second))},
	}
	if err := c.limit.Wait(ctx); err != nil {
		return err
	}
	r := kubeapi.Request{Method: http.MethodGet, Resource: "resourceslices", Path: slicesPath, Query: q}
	err := c.kube.Watch(ctx, r, func(ev kubeapi.WatchEvent) error {
		if ev.Type == "ERROR" {
			var st metav1.Status
			if err := json.Unmarshal(ev.Object, &st); err != nil {
				return fmt.Errorf("watching ResourceSlices: an ERROR event that is no Status: %w", err)
			}
			return &apierrors.StatusError{ErrStatus: st}
		}
		var s resourceapi.ResourceSlice
		if err := json.Unmarshal(ev.Object, &s); err != nil {
			return fmt.Errorf("watching ResourceSlices: a %s event: %w", ev.Type, err)
		}
		return fn(SliceEvent{Type: ev.Type, Slice: &s})
	})
	return apiError(err)
}

// CreateSlice creates s (its generateName named by the server) and
// returns it as stored.
func (c *Client) CreateSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	return c.writeSlice(ctx, http.MethodPost, slicesPath, s)
}

// UpdateSlice replaces s; its resourceVersion makes the server refuse it
// (409) when another write came in between.
func (c *Client) UpdateSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	return c.writeSlice(ctx, http.MethodPut, slicesPath+"/"+url.PathEscape(s.Name), s)
}

func (c *Client) writeSlice(ctx context.Context, method, path string, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	in := *s
	in.APIVersion, in.Kind = resourceapi.SchemeGroupVersion.String(), "ResourceSlice"
	var out resourceapi.ResourceSlice
	if err := c.do(ctx, kubeapi.Request{Method: method, Resource: "resourceslices", Path: path, ContentType: "application/json", Body: &in}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSlice deletes slice name if it still has uid and resourceVersion
// rv (the server answers 409 otherwise).
func (c *Client) DeleteSlice(ctx context.Context, name string, uid types.UID, rv string) error {
	opts := metav1.DeleteOptions{
		TypeMeta:      metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"},
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	}
	return c.do(ctx, kubeapi.Request{
		Method: http.MethodDelete, Resource: "resourceslices", Path: slicesPath + "/" + url.PathEscape(name),
		ContentType: "application/json", Body: &opts,
	}, nil)
}

// NodeUID reads the UID of Node name: the owner of its slices.
func (c *Client) NodeUID(ctx context.Context, name string) (types.UID, error) {
	var n struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
	}
	if err := c.Get(ctx, "/api/v1/nodes/"+url.PathEscape(name), "nodes", &n); err != nil {
		return "", err
	}
	if n.Metadata.UID == "" {
		return "", fmt.Errorf("Node %s: the API server gave no UID", name)
	}
	return n.Metadata.UID, nil
}

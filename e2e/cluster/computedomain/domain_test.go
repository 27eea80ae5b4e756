package computedomain

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// domainStatus is a ComputeDomain's status as docs/compute-domains.md
// documents its keys.
type domainStatus struct {
	Status  string        `json:"status"`
	Reason  string        `json:"reason"`
	Message string        `json:"message"`
	Nodes   []domainEntry `json:"nodes"`
}

type domainEntry struct {
	Name      string `json:"name"`
	IPAddress string `json:"ipAddress"`
	CliqueID  string `json:"cliqueID"`
	Status    string `json:"status"`
	Reason    string `json:"reason"`
	Heartbeat string `json:"heartbeat"`
}

func (s domainStatus) entry(node string) (domainEntry, bool) {
	for _, e := range s.Nodes {
		if e.Name == node {
			return e, true
		}
	}
	return domainEntry{}, false
}

func (s domainStatus) String() string {
	var nodes []string
	for _, e := range s.Nodes {
		nodes = append(nodes, fmt.Sprintf("%s=%s/%s@%s", e.Name, e.Status, e.CliqueID, e.Heartbeat))
	}
	return fmt.Sprintf("%s %s (%s) nodes [%s]", s.Status, s.Reason, s.Message, strings.Join(nodes, " "))
}

// createDomain makes a ComputeDomain of numNodes whose template is
// template.
func createDomain(ctx context.Context, c cluster, name, template string, numNodes int) (types.UID, error) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1alpha1", "kind": "ComputeDomain",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec": map[string]any{"numNodes": int64(numNodes),
			"channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": template}}},
	}}
	got, err := c.dyn.Resource(domainGVR).Namespace(namespace).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating ComputeDomain %s: %w", name, err)
	}
	return got.GetUID(), nil
}

func getDomain(ctx context.Context, c cluster, name string) (domainStatus, error) {
	var st domainStatus
	u, err := c.dyn.Resource(domainGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return st, err
	}
	if m, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st); err != nil {
			return st, fmt.Errorf("ComputeDomain %s: status: %w", name, err)
		}
	}
	return st, nil
}

// awaitDomain polls the domain until ok holds, and returns that status.
func awaitDomain(ctx context.Context, c cluster, name string, timeout time.Duration, what string, ok func(domainStatus) bool) (domainStatus, error) {
	var last domainStatus
	err := poll(ctx, timeout, func() (bool, error) {
		st, err := getDomain(ctx, c, name)
		if err != nil {
			return false, err
		}
		last = st
		return ok(st), nil
	})
	if err != nil {
		return last, fmt.Errorf("ComputeDomain %s not %s: %w; last status: %s", name, what, err, last)
	}
	return last, nil
}

// transition is a change of a domain's status or reason, and when the
// test saw it.
type transition struct {
	at             time.Time
	status, reason string
}

// timeline follows a domain's status and reason by polling every 100 ms.
type timeline struct {
	mu   sync.Mutex
	seen []transition
}

func follow(ctx context.Context, c cluster, name string) *timeline {
	tl := &timeline{}
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if st, err := getDomain(ctx, c, name); err == nil || apierrors.IsNotFound(err) {
				status, reason := st.Status, st.Reason
				if apierrors.IsNotFound(err) {
					status, reason = "deleted", ""
				}
				tl.mu.Lock()
				if n := len(tl.seen); n == 0 || tl.seen[n-1].status != status || tl.seen[n-1].reason != reason {
					tl.seen = append(tl.seen, transition{at: time.Now(), status: status, reason: reason})
				}
				tl.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return tl
}

// since is what the timeline saw from t on.
func (tl *timeline) since(t time.Time) []transition {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var out []transition
	for _, s := range tl.seen {
		if !s.at.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

func (tl *timeline) all() []transition {
	return tl.since(time.Time{})
}

// awaitTemplate waits for the controller's ResourceClaimTemplate.
func awaitTemplate(ctx context.Context, c cluster, name string) (*resourceapi.ResourceClaimTemplate, error) {
	var tmpl *resourceapi.ResourceClaimTemplate
	err := poll(ctx, 30*time.Second, func() (bool, error) {
		got, err := c.kube.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		tmpl = got
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no ResourceClaimTemplate %s/%s from the controller: %w", namespace, name, err)
	}
	return tmpl, nil
}

// allocateClaim does what the kubelet's ResourceClaim controller and the
// scheduler do for a pod of the job: a claim from the template, allocated
// the channel device of node, reserved for a pod.
func allocateClaim(ctx context.Context, c cluster, tmpl *resourceapi.ResourceClaimTemplate, name, node string) (*resourceapi.ResourceClaim, error) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       *tmpl.Spec.Spec.DeepCopy(),
	}
	claim, err := c.kube.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating claim %s: %w", name, err)
	}
	var configs []resourceapi.DeviceAllocationConfiguration
	for _, cfg := range claim.Spec.Devices.Config {
		configs = append(configs, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: cfg.Requests, DeviceConfiguration: cfg.DeviceConfiguration})
	}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Spec.Devices.Requests {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: r.Name, Driver: driverName, Pool: node, Device: channelDevice})
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: results, Config: configs},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{
		Resource: "pods", Name: name, UID: types.UID("pod-" + string(claim.UID))}}
	claim, err = c.kube.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("allocating claim %s the channel of %s: %w", name, node, err)
	}
	return claim, nil
}

// domainEvents lists the Events about a domain, by reason and type.
func domainEvents(ctx context.Context, c cluster, name string) ([]corev1.Event, error) {
	l, err := c.kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=ComputeDomain,involvedObject.name=" + name})
	if err != nil {
		return nil, fmt.Errorf("listing ComputeDomain %s's Events: %w", name, err)
	}
	return l.Items, nil
}

// awaitEvent waits for an Event of type typ and reason about the domain.
func awaitEvent(ctx context.Context, c cluster, name, typ, reason string) (corev1.Event, error) {
	var got corev1.Event
	var seen []string
	err := poll(ctx, 30*time.Second, func() (bool, error) {
		evs, err := domainEvents(ctx, c, name)
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range evs {
			seen = append(seen, e.Type+"/"+e.Reason)
			if e.Type == typ && e.Reason == reason {
				got = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return got, fmt.Errorf("no %s Event %s for ComputeDomain %s: %w (seen: %s)", typ, reason, name, err, strings.Join(slices.Compact(seen), ", "))
	}
	return got, nil
}

package dra

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// reservations are the pods each claim the kubelet asked to prepare is
// reserved for (status.reservedFor), by claim UID. They give the UIDs of
// the pods holding a device, for their Events: the plugin may not read
// pods from the API server. The zero value is ready to use.
type reservations struct {
	mu     sync.Mutex
	claims map[types.UID]claimPods
}

type claimPods struct {
	namespace string
	pods      map[string]types.UID // by name
}

// record takes the pods each claim is reserved for now; a claim prepared
// again (another pod sharing it) replaces what it had.
func (r *reservations) record(claims []*resourceapi.ResourceClaim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range claims {
		if c == nil {
			continue
		}
		pods := map[string]types.UID{}
		for _, ref := range c.Status.ReservedFor {
			if ref.APIGroup == "" && ref.Resource == "pods" && ref.Name != "" && ref.UID != "" {
				pods[ref.Name] = ref.UID
			}
		}
		if r.claims == nil {
			r.claims = map[types.UID]claimPods{}
		}
		r.claims[c.UID] = claimPods{namespace: c.Namespace, pods: pods}
	}
}

// forget drops unprepared claims.
func (r *reservations) forget(claims []kubelet.NamespacedObject) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range claims {
		delete(r.claims, c.UID)
	}
}

// podUID is the UID of pod namespace/name from the claims' reservations;
// "" when none names it, or two name it with different UIDs (a pod made
// again under the same name while an old claim still lists the old one).
func (r *reservations) podUID(namespace, name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var uid types.UID
	for _, c := range r.claims {
		if c.namespace != namespace {
			continue
		}
		if u, ok := c.pods[name]; ok {
			if uid != "" && uid != u {
				return ""
			}
			uid = u
		}
	}
	return string(uid)
}

// PodUID is the UID of pod namespace/name, from the reservations of the
// claims prepared for it; "" when unknown (claims prepared before a
// restart and not prepared again).
func (d *Driver) PodUID(namespace, name string) string { return d.pods.podUID(namespace, name) }

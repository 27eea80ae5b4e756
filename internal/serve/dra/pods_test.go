package dra

import (
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A pod's UID comes from the reservedFor of the claims prepared for it,
// until they are unprepared.
func TestReservationsPodUID(t *testing.T) {
	claim := func(uid, ns string, refs ...resourceapi.ResourceClaimConsumerReference) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: ns, Name: "c-" + uid},
			Status: resourceapi.ResourceClaimStatus{ReservedFor: refs}}
	}
	pod := func(name, uid string) resourceapi.ResourceClaimConsumerReference {
		return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: types.UID(uid)}
	}
	var r reservations
	if got := r.podUID("ml", "a"); got != "" {
		t.Fatalf("empty: %q", got)
	}
	r.record([]*resourceapi.ResourceClaim{
		claim("c1", "ml", pod("a", "uid-a")),
		claim("c2", "ml", pod("b", "uid-b"), resourceapi.ResourceClaimConsumerReference{APIGroup: "example.com", Resource: "pods", Name: "x", UID: "uid-x"}),
		claim("c3", "other", pod("a", "uid-other-a")),
	})
	for _, tc := range []struct{ ns, name, want string }{
		{"ml", "a", "uid-a"},
		{"ml", "b", "uid-b"},
		{"other", "a", "uid-other-a"},
		{"ml", "x", ""}, // not a core pod
		{"ml", "c", ""},
	} {
		if got := r.podUID(tc.ns, tc.name); got != tc.want {
			t.Errorf("podUID(%s/%s) = %q, want %q", tc.ns, tc.name, got, tc.want)
		}
	}
	// Shared: prepared again for a second pod.
	r.record([]*resourceapi.ResourceClaim{claim("c1", "ml", pod("a", "uid-a"), pod("a2", "uid-a2"))})
	if got := r.podUID("ml", "a2"); got != "uid-a2" {
		t.Errorf("second pod of a shared claim: %q", got)
	}
	// A pod made again under the same name, the old claim still listed.
	r.record([]*resourceapi.ResourceClaim{claim("c4", "ml", pod("a", "uid-a-new"))})
	if got := r.podUID("ml", "a"); got != "" {
		t.Errorf("two UIDs for one name: %q, want none", got)
	}
	r.forget([]kubelet.NamespacedObject{{UID: "c1"}})
	if got := r.podUID("ml", "a"); got != "uid-a-new" {
		t.Errorf("after the old claim went: %q", got)
	}
}

package kubelet

import (
	"testing"

	"google.golang.org/protobuf/proto"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// FuzzRequests: no request bytes make the readers panic, and what they
// read agrees with k8s.io/kubelet's generated code where both read it.
// Each is stricter than the other somewhere: grpcwire.EachField skips a
// field number past protobuf's range, and a known field of the wrong wire
// type is an error here and an unknown field there.
func FuzzRequests(f *testing.F) {
	for _, m := range []proto.Message{
		&drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "u"}, {}}},
		&registerapi.RegistrationStatus{PluginRegistered: true, Error: "e"},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if refs, err := readClaims(b); err == nil {
			var want drapbv1.NodePrepareResourcesRequest
			if proto.Unmarshal(b, &want) != nil {
				want.Claims = nil
				refs = nil
			}
			if len(refs) != len(want.Claims) {
				t.Fatalf("read %d claims, the generated code %d", len(refs), len(want.Claims))
			}
			for i, c := range want.Claims {
				if r := refs[i]; r.Namespace != c.Namespace || r.Name != c.Name || r.UID != c.Uid {
					t.Fatalf("claim %d: read %+v, the generated code %v", i, r, c)
				}
			}
		}
		var st RegistrationStatus
		if err := st.unmarshal(b); err == nil {
			var want registerapi.RegistrationStatus
			if proto.Unmarshal(b, &want) != nil {
				return
			}
			if st.PluginRegistered != want.PluginRegistered || st.Error != want.Error {
				t.Fatalf("read %+v, the generated code %v", st, &want)
			}
		}
	})
}

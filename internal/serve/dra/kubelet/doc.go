// Package kubelet is the DRA driver's side of the kubelet: the plugin
// registration service, the DRAPlugin services (v1 and v1beta1) and the
// DRAResourceHealth services (v1 and v1alpha1), served by internal/grpcwire
// on Unix sockets, and the device metadata files of KEP-5304. It behaves
// towards the kubelet as k8s.io/dynamic-resource-allocation's kubeletplugin
// helper v0.37.0 does (same socket names, services, messages, lock file and
// metadata files, so a release built on that helper hands over to this one
// in a rolling update), and its types carry the helper's names so a driver
// changes only its import.
//
// It must not link client-go, grpc-go, protobuf's runtime or k8s.io/kubelet:
// the API server half (ResourceClaims, ResourceSlices) is the caller's,
// reached through ClaimReader. deps_test.go keeps it so.
package kubelet

// Package podresources reads the kubelet's PodResources API (v1) to say
// which container holds each device: those handed out through the
// device-plugin API (a resource name and device IDs) and those prepared
// through DRA (a driver, pool and device name). The kubelet device
// manager's checkpoint (Checkpoint) adds the pod UIDs that the API leaves
// out, which Events need: the plugin may not read pods from the API server.
//
// It calls List through internal/grpcwire and decodes the answer's fields
// it needs with protowire (DecodeList): neither the API's generated code
// nor the Kubernetes client is linked, so the device-plugin executable
// stays lean. Tests decode what k8s.io/kubelet's generated code encodes.
package podresources

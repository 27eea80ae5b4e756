// Package podresources reads the kubelet's PodResources API (v1) to say
// which container holds each device: those handed out through the
// device-plugin API (a resource name and device IDs) and those prepared
// through DRA (a driver, pool and device name). The kubelet device
// manager's checkpoint (Checkpoint) adds the pod UIDs that the API leaves
// out, which Events need: the plugin may not read pods from the API server.
//
// It uses the API's generated protobuf and gRPC code only, not the
// Kubernetes client, so the device-plugin executable stays lean.
package podresources

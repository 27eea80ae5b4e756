// Package conformance proves the plugin against the kubelet's own
// device-plugin code, in process: the registration server and the
// ListAndWatch client from k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1,
// talking over real unix sockets in a temporary plugin directory to our
// deviceplugin.Server serving a gpu.Resource discovered from a mock
// DGX A100. In DRA mode (dra_test.go) it is the kubelet's DRA manager
// and plugin manager (harness.DRAKubelet) against daemon.Run, with a fake
// API server between them for ResourceSlices and ResourceClaims.
//
// It has tests only. It must not stub either side of the socket: a
// behaviour pinned here is one a real kubelet would see.
package conformance

// Package harness runs the real gpu-device-plugin binary against the
// kubelet's own device-plugin code, for whole-binary tests and the
// scenario benchmark.
//
// BuildPlugin and BuildMock build the binary and the mock NVML library;
// StartPlugin runs the binary on a mock machine profile with private
// sysfs, /dev and device-plugin roots and a fault-injection FIFO; Kubelet
// is the kubelet's registration server and ListAndWatch client from
// k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1, with a
// handler that records what the device manager would. DRAKubelet is the
// kubelet's DRA manager and plugin manager from
// k8s.io/kubernetes/pkg/kubelet/cm/dra and pkg/kubelet/pluginmanager, on
// a fake API server (FakeAPIServer).
//
// It treats the plugin as a black box: it must not import the plugin's
// packages, only talk to the process over its socket, flags, environment,
// log and /proc, as a node would.
package harness

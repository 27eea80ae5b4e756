// Package healthstatus proves that GPU health the plugin detects reaches a
// pod's status.containerStatuses[].allocatedResourcesStatus through the
// kubelet's own device manager, devicemanager.ManagerImpl from
// k8s.io/kubernetes, as the kubelet drives it: a health change on
// ListAndWatch puts the pod's UID on the manager's Updates channel, and the
// kubelet then calls UpdateAllocatedResourcesStatus to fill the status.
//
// It has tests only, and stubs neither side: the plugin is daemon.Run over
// a mock DGX A100, the kubelet side is the real ManagerImpl. ManagerImpl
// only listens in the fixed directory /var/lib/kubelet/device-plugins, so
// each test re-runs itself in a private mount namespace with a tmpfs over
// that path. The host's directory is never touched; without root or mount
// namespaces the tests skip.
package healthstatus

package harness

import (
	"testing"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
)

// StartDeviceManager builds and starts the kubelet's own device manager as
// its container manager does, on machine (nil: no NUMA topology) with tm
// as its topology affinity store, counting the pods active returns as
// running. It listens in the fixed pluginapi.DevicePluginPath, so the test
// must own that directory (see Isolated); it stops when the test ends.
func StartDeviceManager(t *testing.T, log klog.Logger, machine []cadvisorapi.Node, tm topologymanager.Manager, active func() []*v1.Pod) *devicemanager.ManagerImpl {
	t.Helper()
	m, err := devicemanager.NewManagerImpl(log, machine, tm)
	if err != nil {
		t.Fatal(err)
	}
	ready := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := m.Start(log, active, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatalf("starting the device manager: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Stop(log); err != nil {
			t.Errorf("stopping the device manager: %v", err)
		}
	})
	return m
}

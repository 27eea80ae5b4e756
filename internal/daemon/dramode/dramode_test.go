package dramode

import (
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// The DRA front-end gets the driver's name and field manager, the Node's
// name and the settings it reads, copied.
func TestSettings(t *testing.T) {
	c := config.Default()
	c.KubeletAPI = config.KubeletAPIDRA
	c.NodeName, c.Kubeconfig, c.PodUID = "n1", "/etc/kubeconfig", "uid-1"
	c.Sharing.TimeSlicing.Resources = []config.SharedResource{{Name: "nvidia.com/gpu", Replicas: 2}}
	c.NICResources = []config.NICResource{{Name: "example.com/rdma"}}
	c.Sharing.MemoryShares = config.MemoryShares{Enabled: true, Devices: []string{"1"}, Minimum: "2Gi"}
	c.Sharing.MIGPartitions = config.MIGPartitions{Enabled: true, Devices: []string{"0"}}
	s, err := Settings(c)
	if err != nil {
		t.Fatal(err)
	}
	if s.DriverName != config.DRADriverName || s.FieldManager != config.FieldManager || s.Node != "n1" || s.Kubeconfig != c.Kubeconfig ||
		s.PluginDir != c.DRAPluginDir || s.PluginRegistryDir != c.PluginRegistryDir || s.PodUID != "uid-1" || s.PodResourcesSocket != c.PodResourcesSocket ||
		s.SysfsRoot != c.SysfsRoot || s.DevRoot != c.DevRoot || s.ProcRoot != c.ProcRoot || s.MPSRoot != c.MPSRoot ||
		s.NICPools != 1 || s.IgnoredTimeSlicing != 1 {
		t.Errorf("settings = %+v", s)
	}
	g0, g1 := nvml.GPU{Index: 0, UUID: "GPU-0"}, nvml.GPU{Index: 1, UUID: "GPU-1"}
	if s.MemoryShares.Selects == nil || s.MemoryShares.Selects(g0) || !s.MemoryShares.Selects(g1) || s.MemoryShares.Minimum != 2<<30 {
		t.Errorf("memory shares: %+v", s.MemoryShares)
	}
	if !s.MIGPartitioned(g0) || s.MIGPartitioned(g1) {
		t.Error("MIGPartitioned picks the wrong GPU")
	}
	c.Sharing.MemoryShares.Enabled = false
	if daemon.MemoryShares(c).Selects != nil {
		t.Error("memory shares off: a selection")
	}
}

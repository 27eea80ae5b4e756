package deviceplugin

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// apiDevice is d as ListAndWatch sends it. A device with no known NUMA
// node (device.NoNUMANode) gets no topology.
func apiDevice(d device.Device) *pluginapi.Device {
	out := &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy}
	if !d.Healthy {
		out.Health = pluginapi.Unhealthy
	}
	if d.NUMANode >= 0 {
		out.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
	}
	return out
}

// snapshot is an immutable view of a resource's devices. A new snapshot
// replaces the old one on every change and closes the old one's changed
// channel, which wakes every ListAndWatch stream at once without the
// server keeping a list of subscribers.
type snapshot struct {
	devices []device.Device
	byID    map[string]int
	resp    *pluginapi.ListAndWatchResponse
	changed chan struct{}
}

func newSnapshot(devices []device.Device) *snapshot {
	s := &snapshot{
		devices: devices,
		byID:    make(map[string]int, len(devices)),
		resp:    &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, len(devices))},
		changed: make(chan struct{}),
	}
	for i, d := range devices {
		s.byID[d.ID] = i
		s.resp.Devices[i] = apiDevice(d)
	}
	return s
}

func (s *snapshot) lookup(id string) (device.Device, bool) {
	i, ok := s.byID[id]
	if !ok {
		return device.Device{}, false
	}
	return s.devices[i], true
}

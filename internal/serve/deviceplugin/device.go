package deviceplugin

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// apiDevice is d as ListAndWatch sends it. A device with no known NUMA
// node (device.NoNUMANode) gets no topology.
func apiDevice(d device.Device) api.Device {
	out := api.Device{ID: d.ID, Health: api.Healthy}
	if !d.Healthy {
		out.Health = api.Unhealthy
	}
	if d.NUMANode >= 0 {
		out.NUMANodes = []int64{int64(d.NUMANode)}
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
	// resp is the ListAndWatch answer, encoded once for every stream.
	resp    encoded
	changed chan struct{}
}

func newSnapshot(devices []device.Device) *snapshot {
	s := &snapshot{
		devices: devices,
		byID:    make(map[string]int, len(devices)),
		changed: make(chan struct{}),
	}
	list := api.ListAndWatchResponse{Devices: make([]api.Device, len(devices))}
	for i, d := range devices {
		s.byID[d.ID] = i
		list.Devices[i] = apiDevice(d)
	}
	s.resp = list.AppendProto(nil)
	return s
}

func (s *snapshot) lookup(id string) (device.Device, bool) {
	i, ok := s.byID[id]
	if !ok {
		return device.Device{}, false
	}
	return s.devices[i], true
}

// encoded is a message already in its wire form.
type encoded []byte

func (e encoded) AppendProto(b []byte) []byte { return append(b, e...) }

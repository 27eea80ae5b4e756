package metrics

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// NICRecorder records the members of NIC pools: their facts and health.
// The NIC rescans take it through an interface of their own, so node
// services name no reporting package.
type NICRecorder struct{ m *Metrics }

// NICs is m's recorder of NIC pools; nil m gives nil.
func (m *Metrics) NICs() *NICRecorder {
	if m == nil {
		return nil
	}
	return &NICRecorder{m: m}
}

// Pool is where the health of resource's devices goes.
func (r *NICRecorder) Pool(resource string) health.Recorder { return r.m.For(resource) }

// NIC sets n's gpu_device_plugin_device_info under resource: no UUID or
// index, and its PCI IDs as the model.
func (r *NICRecorder) NIC(resource string, n sysfs.NIC) {
	r.m.SetInfo(resource, n.Address, DeviceInfo{
		Model: n.Vendor + ":" + n.Device, PCIBusID: n.Address, NUMANode: n.NUMANode,
		DRAName: draslice.NICDeviceName(n.Address),
	})
}

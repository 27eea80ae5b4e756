package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// metadataVersions are the versions of the device metadata file
// (KEP-5304) the helper writes, newest first. The helper refuses to start
// without its latest one, so a library update that brings a newer version
// fails the tests here rather than a node.
func metadataVersions() []schema.GroupVersion {
	return []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}
}

// resultLocked is the answer to the kubelet for prepared claim p: its
// devices' CDI IDs and, with Options.DeviceMetadata, what the container's
// metadata file says of each (metadataLocked).
func (d *Driver) resultLocked(p preparedClaim) []kubelet.Device {
	out := p.result()
	if !d.o.DeviceMetadata {
		return out
	}
	for i, dv := range p.Devices {
		out[i].Metadata = d.metadataLocked(dv)
	}
	return out
}

// metadataLocked is one prepared device as its claim's containers read
// it: the attributes its ResourceSlice entry publishes now, a MIG instance's
// own UUID and IDs where the claim created it on a placement, and a NIC's
// network interface in the host's namespace as it is at Prepare. A device
// no longer published (a claim prepared again after its GPU went away) has
// no attributes: the file then names only the driver, pool and device.
func (d *Driver) metadataLocked(dv preparedDevice) *kubelet.DeviceMetadata {
	e, ok := d.byName[dv.Device]
	if !ok {
		return nil
	}
	attrs := e.Attributes
	if m := dv.MIG; m != nil && m.UUID != "" {
		attrs = make(map[string]draslice.Attribute, len(e.Attributes)+3)
		for k, a := range e.Attributes {
			attrs[k] = a
		}
		for k, a := range draslice.InstanceAttributes(m.UUID, m.GPUInstance, m.ComputeInstance) {
			attrs[k] = a
		}
	}
	out := &kubelet.DeviceMetadata{Attributes: make(map[string]resourceapi.DeviceAttribute, len(attrs))}
	for k, a := range apiAttributes(attrs) {
		out.Attributes[string(k)] = a
	}
	if e.Type == draslice.TypeNIC {
		// As the claim's status says it (status.go); none is no error.
		if nd, _ := sysfs.FirstNetdev(d.o.SysfsRoot, e.ID); nd.Name != "" {
			out.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: nd.Name, HardwareAddress: nd.HardwareAddress}
		}
	}
	return out
}

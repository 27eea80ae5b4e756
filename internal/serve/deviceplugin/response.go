package deviceplugin

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// Response is a backend's answer as the kubelet gets it for one
// container. It is the one place the device model meets v1beta1. A nil
// field of the answer stays nil and an empty one stays empty, so the
// message is what a backend building it directly would have sent. The
// maps are shared with the answer, not copied. A nil answer is an empty
// response: the container gets nothing beyond what it asked for.
func Response(a *device.Answer) *pluginapi.ContainerAllocateResponse {
	resp := &pluginapi.ContainerAllocateResponse{}
	if a == nil {
		return resp
	}
	resp.Envs = a.Env
	resp.Annotations = a.Annotations
	if a.Nodes != nil {
		// One backing array: a response is built per container per pod.
		specs := make([]pluginapi.DeviceSpec, len(a.Nodes))
		resp.Devices = make([]*pluginapi.DeviceSpec, len(a.Nodes))
		for i, n := range a.Nodes {
			specs[i] = pluginapi.DeviceSpec{ContainerPath: n.ContainerPath, HostPath: n.HostPath, Permissions: n.Permissions}
			resp.Devices[i] = &specs[i]
		}
	}
	if a.Mounts != nil {
		mounts := make([]pluginapi.Mount, len(a.Mounts))
		resp.Mounts = make([]*pluginapi.Mount, len(a.Mounts))
		for i, m := range a.Mounts {
			mounts[i] = pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly}
			resp.Mounts[i] = &mounts[i]
		}
	}
	if a.CDIDevices != nil {
		cdis := make([]pluginapi.CDIDevice, len(a.CDIDevices))
		resp.CdiDevices = make([]*pluginapi.CDIDevice, len(a.CDIDevices))
		for i, name := range a.CDIDevices {
			cdis[i] = pluginapi.CDIDevice{Name: name}
			resp.CdiDevices[i] = &cdis[i]
		}
	}
	return resp
}

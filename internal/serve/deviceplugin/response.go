package deviceplugin

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// Response is a backend's answer as the kubelet gets it for one
// container. It is the one place the device model meets v1beta1. A nil
// field of the answer stays nil and an empty one stays empty, so the
// message is what a backend building it directly would have sent. The
// maps and the CDI names are shared with the answer, not copied. A nil answer is an empty
// response: the container gets nothing beyond what it asked for.
func Response(a *device.Answer) api.ContainerAllocateResponse {
	if a == nil {
		return api.ContainerAllocateResponse{}
	}
	resp := api.ContainerAllocateResponse{Envs: a.Env, Annotations: a.Annotations, CDIDevices: a.CDIDevices}
	if a.Nodes != nil {
		resp.Devices = make([]api.DeviceSpec, len(a.Nodes))
		for i, n := range a.Nodes {
			resp.Devices[i] = api.DeviceSpec{ContainerPath: n.ContainerPath, HostPath: n.HostPath, Permissions: n.Permissions}
		}
	}
	if a.Mounts != nil {
		resp.Mounts = make([]api.Mount, len(a.Mounts))
		for i, m := range a.Mounts {
			resp.Mounts[i] = api.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly}
		}
	}
	return resp
}

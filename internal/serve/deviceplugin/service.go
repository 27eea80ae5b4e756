package deviceplugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// service implements the DevicePlugin gRPC API over a Server's state.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	s *Server
}

func (v *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return v.s.options(), nil
}

// ListAndWatch sends the whole list at once and again after every change.
// Changes that land while a send is in flight coalesce into one send of
// the newest list: the kubelet only ever needs the latest state.
func (v *service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		snap := v.s.current()
		if err := stream.Send(snap.resp); err != nil {
			return fmt.Errorf("sending device list for %s: %w", v.s.resource, err)
		}
		select {
		case <-snap.changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation is a hint: the kubelet fails the pod if it
// errs, and falls back to its own choice for whatever the answer lacks. So
// it answers every request best effort: unknown and repeated IDs are
// dropped, the size is clamped to what can be had, a backend that cannot
// choose is replaced by the first available devices, and what was ignored
// is logged.
func (v *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	pref, ok := v.s.backend.(PreferredAllocator)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "%s does not offer preferred allocation", v.s.resource)
	}
	snap := v.s.current()
	resp := &pluginapi.PreferredAllocationResponse{ContainerResponses: make([]*pluginapi.ContainerPreferredAllocationResponse, 0, len(req.GetContainerRequests()))}
	for i, creq := range req.GetContainerRequests() {
		h := snap.hint(creq)
		ids := h.must
		if h.size > len(h.must) {
			var err error
			ids, err = pref.Preferred(h.available, h.must, h.size)
			if err == nil {
				err = h.check(ids)
			}
			if err != nil {
				v.s.log.Warn("preferred allocation: backend gave no usable answer; preferring the first available devices", "container", i, "size", h.size, "err", err)
				ids = h.fallback()
			}
		}
		if h.ignored() {
			v.s.log.Info("preferred allocation: ignored part of the request", h.attrs(i)...)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate refuses the whole request if any container names a device that
// is unknown or unhealthy: a container must not start with fewer or
// broken devices than the scheduler counted.
func (v *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	snap := v.s.current()
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.GetContainerRequests()))}
	for _, creq := range req.GetContainerRequests() {
		if len(creq.GetDevicesIds()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: allocate request names no device", v.s.resource)
		}
		if err := snap.usable(creq.GetDevicesIds()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", v.s.resource, err)
		}
		answer, err := v.s.backend.Allocate(creq.GetDevicesIds())
		if err != nil {
			code := codes.Internal
			switch {
			case errors.Is(err, device.ErrNotReady):
				code = codes.Unavailable
			case errors.Is(err, device.ErrBadRequest):
				code = codes.InvalidArgument
			}
			return nil, status.Errorf(code, "%s: allocating %v: %v", v.s.resource, creq.GetDevicesIds(), err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, Response(answer))
	}
	return resp, nil
}

func (v *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// usable checks that every ID names a known, healthy device, once: a
// repeated ID would list a device twice in the container's environment
// and device nodes.
func (s *snapshot) usable(ids []string) error {
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		d, ok := s.lookup(id)
		if !ok {
			return fmt.Errorf("unknown device %q", id)
		}
		if _, dup := seen[id]; dup {
			return fmt.Errorf("device %q is requested more than once", id)
		}
		seen[id] = struct{}{}
		if !d.Healthy {
			return fmt.Errorf("device %q is unhealthy: %s", id, d.Reason)
		}
	}
	return nil
}

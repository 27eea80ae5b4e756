package deviceplugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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

func (v *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	pref, ok := v.s.backend.(PreferredAllocator)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "%s does not offer preferred allocation", v.s.resource)
	}
	snap := v.s.current()
	resp := &pluginapi.PreferredAllocationResponse{ContainerResponses: make([]*pluginapi.ContainerPreferredAllocationResponse, 0, len(req.ContainerRequests))}
	for _, creq := range req.ContainerRequests {
		if err := snap.known(creq.AvailableDeviceIDs, creq.MustIncludeDeviceIDs); err != nil {
			return nil, err
		}
		ids, err := pref.Preferred(creq.AvailableDeviceIDs, creq.MustIncludeDeviceIDs, int(creq.AllocationSize))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: preferred allocation of %d: %v", v.s.resource, creq.AllocationSize, err)
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
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.ContainerRequests))}
	for _, creq := range req.ContainerRequests {
		if len(creq.DevicesIds) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: allocate request names no device", v.s.resource)
		}
		if err := snap.usable(creq.DevicesIds); err != nil {
			return nil, err
		}
		cresp, err := v.s.backend.Allocate(creq.DevicesIds)
		if err != nil {
			code := codes.Internal
			if errors.Is(err, ErrNotReady) {
				code = codes.Unavailable
			}
			return nil, status.Errorf(code, "%s: allocating %v: %v", v.s.resource, creq.DevicesIds, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

func (v *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// known checks that every ID names a device of this resource.
func (s *snapshot) known(lists ...[]string) error {
	for _, ids := range lists {
		for _, id := range ids {
			if _, ok := s.lookup(id); !ok {
				return status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
		}
	}
	return nil
}

// usable checks that every ID names a known, healthy device.
func (s *snapshot) usable(ids []string) error {
	for _, id := range ids {
		d, ok := s.lookup(id)
		if !ok {
			return status.Errorf(codes.InvalidArgument, "unknown device %q", id)
		}
		if !d.Healthy {
			return status.Errorf(codes.InvalidArgument, "device %q is unhealthy: %s", id, d.Reason)
		}
	}
	return nil
}

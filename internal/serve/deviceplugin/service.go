package deviceplugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// service implements the DevicePlugin gRPC API over a Server's state.
type service struct {
	s *Server
}

// rpcServer is a gRPC server answering the DevicePlugin service.
func (v *service) rpcServer() *grpcwire.Server {
	rs := grpcwire.NewServer(v.s.log)
	rs.HandleUnary(api.MethodGetDevicePluginOptions, func(context.Context, []byte) (grpcwire.Marshaler, error) {
		return v.s.options(), nil
	})
	rs.HandleStream(api.MethodListAndWatch, func(ctx context.Context, _ []byte, send func(grpcwire.Marshaler) error) error {
		return v.ListAndWatch(ctx, send)
	})
	rs.HandleUnary(api.MethodGetPreferredAllocation, func(ctx context.Context, b []byte) (grpcwire.Marshaler, error) {
		var req api.PreferredAllocationRequest
		if err := req.Unmarshal(b); err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%s: GetPreferredAllocation: %v", v.s.resource, err)
		}
		return v.GetPreferredAllocation(ctx, &req)
	})
	rs.HandleUnary(api.MethodAllocate, func(ctx context.Context, b []byte) (grpcwire.Marshaler, error) {
		var req api.AllocateRequest
		if err := req.Unmarshal(b); err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%s: Allocate: %v", v.s.resource, err)
		}
		return v.Allocate(ctx, &req)
	})
	rs.HandleUnary(api.MethodPreStartContainer, func(context.Context, []byte) (grpcwire.Marshaler, error) {
		return api.Empty{}, nil
	})
	return rs
}

// ListAndWatch sends the whole list at once and again after every change.
// Changes that land while a send is in flight coalesce into one send of
// the newest list: the kubelet only ever needs the latest state.
func (v *service) ListAndWatch(ctx context.Context, send func(grpcwire.Marshaler) error) error {
	for {
		snap := v.s.current()
		if err := send(snap.resp); err != nil {
			return fmt.Errorf("sending device list for %s: %w", v.s.resource, err)
		}
		select {
		case <-snap.changed:
		case <-ctx.Done():
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
func (v *service) GetPreferredAllocation(_ context.Context, req *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	pref, ok := v.s.backend.(PreferredAllocator)
	if !ok {
		return nil, grpcwire.Errorf(grpcwire.Unimplemented, "%s does not offer preferred allocation", v.s.resource)
	}
	snap := v.s.current()
	resp := &api.PreferredAllocationResponse{ContainerResponses: make([][]string, 0, len(req.ContainerRequests))}
	for i := range req.ContainerRequests {
		h := snap.hint(&req.ContainerRequests[i])
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
		resp.ContainerResponses = append(resp.ContainerResponses, ids)
	}
	return resp, nil
}

// Allocate refuses the whole request if any container names a device that
// is unknown or unhealthy: a container must not start with fewer or
// broken devices than the scheduler counted.
func (v *service) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	snap := v.s.current()
	resp := &api.AllocateResponse{ContainerResponses: make([]api.ContainerAllocateResponse, 0, len(req.ContainerRequests))}
	for _, ids := range req.ContainerRequests {
		if len(ids) == 0 {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%s: allocate request names no device", v.s.resource)
		}
		if err := snap.usable(ids); err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%s: %v", v.s.resource, err)
		}
		answer, err := v.s.backend.Allocate(ids)
		if err != nil {
			code := grpcwire.Internal
			switch {
			case errors.Is(err, device.ErrNotReady):
				code = grpcwire.Unavailable
			case errors.Is(err, device.ErrBadRequest):
				code = grpcwire.InvalidArgument
			}
			return nil, grpcwire.Errorf(code, "%s: allocating %v: %v", v.s.resource, ids, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, Response(answer))
	}
	return resp, nil
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

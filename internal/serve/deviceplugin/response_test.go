package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

func TestResponse(t *testing.T) {
	tests := []struct {
		name string
		in   *device.Answer
		want *pluginapi.ContainerAllocateResponse
	}{
		{name: "nil answer", in: nil, want: &pluginapi.ContainerAllocateResponse{}},
		{name: "empty answer", in: &device.Answer{}, want: &pluginapi.ContainerAllocateResponse{}},
		{
			name: "every field",
			in: &device.Answer{
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
				Nodes: []device.Node{
					{ContainerPath: "/dev/nvidia0", HostPath: "/host/dev/nvidia0", Permissions: "rw"},
					{ContainerPath: "/dev/nvidiactl", HostPath: "/host/dev/nvidiactl", Permissions: "r"},
				},
				Mounts:      []device.Mount{{ContainerPath: "/dev/shm", HostPath: "/run/mps/GPU-a/shm"}, {ContainerPath: "/etc/x", HostPath: "/x", ReadOnly: true}},
				CDIDevices:  []string{"nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"},
				Annotations: map[string]string{"cdi.k8s.io/gpu-device-plugin_gpu": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"},
			},
			want: &pluginapi.ContainerAllocateResponse{
				Mounts: []*pluginapi.Mount{{ContainerPath: "/dev/shm", HostPath: "/run/mps/GPU-a/shm"}, {ContainerPath: "/etc/x", HostPath: "/x", ReadOnly: true}},
				Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
				Devices: []*pluginapi.DeviceSpec{
					{ContainerPath: "/dev/nvidia0", HostPath: "/host/dev/nvidia0", Permissions: "rw"},
					{ContainerPath: "/dev/nvidiactl", HostPath: "/host/dev/nvidiactl", Permissions: "r"},
				},
				CdiDevices:  []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-a"}, {Name: "nvidia.com/gpu=GPU-b"}},
				Annotations: map[string]string{"cdi.k8s.io/gpu-device-plugin_gpu": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"},
			},
		},
		{
			// Empty but present stays empty, as a backend building the
			// message itself would have left it.
			name: "empty but not nil",
			in:   &device.Answer{Env: map[string]string{}, Nodes: []device.Node{}, Mounts: []device.Mount{}, CDIDevices: []string{}, Annotations: map[string]string{}},
			want: &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}, Devices: []*pluginapi.DeviceSpec{}, Mounts: []*pluginapi.Mount{}, CdiDevices: []*pluginapi.CDIDevice{}, Annotations: map[string]string{}},
		},
		{
			name: "env only",
			in:   &device.Answer{Env: map[string]string{"EXAMPLE_COM_RDMA": "0000:18:00.0"}},
			want: &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"EXAMPLE_COM_RDMA": "0000:18:00.0"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Response(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Response(%+v) =\n%+v\nwant\n%+v", tt.in, got, tt.want)
			}
			// Nil and empty look alike when printed; DeepEqual told them
			// apart, this says which one was wrong.
			if (got.Envs == nil) != (tt.want.Envs == nil) || (got.Devices == nil) != (tt.want.Devices == nil) ||
				(got.CdiDevices == nil) != (tt.want.CdiDevices == nil) || (got.Annotations == nil) != (tt.want.Annotations == nil) {
				t.Errorf("nil fields: got envs %t devices %t cdi %t annotations %t, want %t %t %t %t",
					got.Envs == nil, got.Devices == nil, got.CdiDevices == nil, got.Annotations == nil,
					tt.want.Envs == nil, tt.want.Devices == nil, tt.want.CdiDevices == nil, tt.want.Annotations == nil)
			}
		})
	}
}

// TestResponseDoesNotAlias checks that two responses to one answer share
// no device spec: the gRPC layer may cache sizes in them.
func TestResponseDoesNotAlias(t *testing.T) {
	a := &device.Answer{Nodes: []device.Node{{ContainerPath: "/dev/x", HostPath: "/dev/x", Permissions: "rw"}}, CDIDevices: []string{"example.com/x=a"}}
	r1, r2 := Response(a), Response(a)
	if r1.Devices[0] == r2.Devices[0] || r1.CdiDevices[0] == r2.CdiDevices[0] {
		t.Error("two responses share a message")
	}
	a.Nodes[0].Permissions = "r"
	if r1.Devices[0].Permissions != "rw" {
		t.Error("a response changed with the answer's nodes")
	}
}

// erringBackend fails every allocation with err.
type erringBackend struct{ err error }

func (b erringBackend) Allocate([]string) (*device.Answer, error) { return nil, b.err }

func TestAllocateErrorCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{name: "not ready is retryable", err: fmt.Errorf("%w: no CDI spec of example.com/gpu yet", device.ErrNotReady), want: codes.Unavailable},
		{name: "not ready wrapped twice", err: fmt.Errorf("outer: %w", fmt.Errorf("%w: inner", device.ErrNotReady)), want: codes.Unavailable},
		{name: "anything else is internal", err: errors.New("building CDI annotations: bad"), want: codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: t.TempDir(), Backend: erringBackend{tt.err}})
			if err != nil {
				t.Fatal(err)
			}
			s.SetDevices(testDevices())
			_, err = (&service{s: s}).Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a"}}},
			})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if msg := status.Convert(err).Message(); !containsAll(msg, "example.com/gpu", "GPU-a", tt.err.Error()) {
				t.Errorf("message %q should name the resource, the devices and the cause", msg)
			}
		})
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

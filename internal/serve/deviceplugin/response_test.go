package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// TestResponse checks each answer as the kubelet decodes it, with
// k8s.io/kubelet's generated code.
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
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "A": ""},
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
				Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "A": ""},
				Devices: []*pluginapi.DeviceSpec{
					{ContainerPath: "/dev/nvidia0", HostPath: "/host/dev/nvidia0", Permissions: "rw"},
					{ContainerPath: "/dev/nvidiactl", HostPath: "/host/dev/nvidiactl", Permissions: "r"},
				},
				CdiDevices:  []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-a"}, {Name: "nvidia.com/gpu=GPU-b"}},
				Annotations: map[string]string{"cdi.k8s.io/gpu-device-plugin_gpu": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"},
			},
		},
		{
			name: "empty but not nil",
			in:   &device.Answer{Env: map[string]string{}, Nodes: []device.Node{}, Mounts: []device.Mount{}, CDIDevices: []string{}, Annotations: map[string]string{}},
			want: &pluginapi.ContainerAllocateResponse{},
		},
		{
			name: "env only",
			in:   &device.Answer{Env: map[string]string{"EXAMPLE_COM_RDMA": "0000:18:00.0"}},
			want: &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"EXAMPLE_COM_RDMA": "0000:18:00.0"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := Response(tt.in).AppendProto(nil)
			got := &pluginapi.ContainerAllocateResponse{}
			if err := proto.Unmarshal(wire, got); err != nil {
				t.Fatalf("the kubelet's code cannot decode the response: %v", err)
			}
			if !proto.Equal(got, tt.want) {
				t.Errorf("Response(%+v) as the kubelet reads it =\n%v\nwant\n%v", tt.in, got, tt.want)
			}
		})
	}
}

// TestResponseDoesNotAlias checks that a response keeps the device specs
// it was built with when the answer's nodes change afterwards.
func TestResponseDoesNotAlias(t *testing.T) {
	a := &device.Answer{Nodes: []device.Node{{ContainerPath: "/dev/x", HostPath: "/dev/x", Permissions: "rw"}}}
	r1 := Response(a)
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
		want grpcwire.Code
	}{
		{name: "not ready is retryable", err: fmt.Errorf("%w: no CDI spec of example.com/gpu yet", device.ErrNotReady), want: grpcwire.Unavailable},
		{name: "not ready wrapped twice", err: fmt.Errorf("outer: %w", fmt.Errorf("%w: inner", device.ErrNotReady)), want: grpcwire.Unavailable},
		{name: "anything else is internal", err: errors.New("building CDI annotations: bad"), want: grpcwire.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: t.TempDir(), Backend: erringBackend{tt.err}})
			if err != nil {
				t.Fatal(err)
			}
			s.SetDevices(testDevices())
			_, err = (&service{s: s}).Allocate(context.Background(), &api.AllocateRequest{
				ContainerRequests: [][]string{{"GPU-a"}},
			})
			if got := grpcwire.CodeOf(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if msg := err.Error(); !containsAll(msg, "example.com/gpu", "GPU-a", tt.err.Error()) {
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

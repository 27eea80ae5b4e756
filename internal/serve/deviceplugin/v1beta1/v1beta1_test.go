package v1beta1_test

import (
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// TestSentAsTheKubeletReads: every message we send, decoded by
// k8s.io/kubelet's generated code, is the message we meant.
func TestSentAsTheKubeletReads(t *testing.T) {
	long := strings.Repeat("x", 300) // a length that needs two varint bytes
	tests := []struct {
		name string
		ours grpcwire.Marshaler
		want proto.Message
		into proto.Message
	}{
		{"empty", api.Empty{}, &pluginapi.Empty{}, &pluginapi.Empty{}},
		{"options", api.DevicePluginOptions{GetPreferredAllocationAvailable: true}, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, &pluginapi.DevicePluginOptions{}},
		{"options both", api.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}, &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}, &pluginapi.DevicePluginOptions{}},
		{
			"register",
			api.RegisterRequest{Version: api.Version, Endpoint: "nvidia.com_gpu.sock", ResourceName: "nvidia.com/gpu", Options: &api.DevicePluginOptions{GetPreferredAllocationAvailable: true}},
			&pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "nvidia.com_gpu.sock", ResourceName: "nvidia.com/gpu", Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}},
			&pluginapi.RegisterRequest{},
		},
		{
			"register with empty options",
			api.RegisterRequest{Version: api.Version, Options: &api.DevicePluginOptions{}},
			&pluginapi.RegisterRequest{Version: pluginapi.Version, Options: &pluginapi.DevicePluginOptions{}},
			&pluginapi.RegisterRequest{},
		},
		{
			"device list",
			api.ListAndWatchResponse{Devices: []api.Device{
				{ID: "GPU-a", Health: api.Healthy, NUMANodes: []int64{1}},
				{ID: "GPU-b", Health: api.Unhealthy},
				{ID: long, Health: api.Healthy, NUMANodes: []int64{0}},
			}},
			&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
				{ID: "GPU-a", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
				{ID: "GPU-b", Health: pluginapi.Unhealthy},
				{ID: long, Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
			}},
			&pluginapi.ListAndWatchResponse{},
		},
		{
			"preferred",
			api.PreferredAllocationResponse{ContainerResponses: [][]string{{"GPU-a", "GPU-b"}, {}, {long}}},
			&pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: []string{"GPU-a", "GPU-b"}}, {}, {DeviceIDs: []string{long}}}},
			&pluginapi.PreferredAllocationResponse{},
		},
		{
			"allocate",
			api.AllocateResponse{ContainerResponses: []api.ContainerAllocateResponse{
				{
					Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a", "EMPTY": "", "LONG": long},
					Mounts:      []api.Mount{{ContainerPath: "/c", HostPath: "/h", ReadOnly: true}, {ContainerPath: "/d", HostPath: "/e"}},
					Devices:     []api.DeviceSpec{{ContainerPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
					Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=GPU-a"},
					CDIDevices:  []string{"nvidia.com/gpu=GPU-a"},
				},
				{},
			}},
			&pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{
				{
					Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a", "EMPTY": "", "LONG": long},
					Mounts:      []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/h", ReadOnly: true}, {ContainerPath: "/d", HostPath: "/e"}},
					Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
					Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=GPU-a"},
					CdiDevices:  []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-a"}},
				},
				{},
			}},
			&pluginapi.AllocateResponse{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := proto.Unmarshal(tt.ours.AppendProto(nil), tt.into); err != nil {
				t.Fatalf("the kubelet's code cannot decode it: %v", err)
			}
			if !proto.Equal(tt.into, tt.want) {
				t.Errorf("decoded as\n%v\nwant\n%v", tt.into, tt.want)
			}
		})
	}
}

// TestReadAsTheKubeletSends: requests encoded by k8s.io/kubelet's
// generated code decode to the same content.
func TestReadAsTheKubeletSends(t *testing.T) {
	pref := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-a", "GPU-b", ""}, MustIncludeDeviceIDs: []string{"GPU-b"}, AllocationSize: 2},
		{AllocationSize: -1},
		{},
	}}
	wire, err := proto.Marshal(pref)
	if err != nil {
		t.Fatal(err)
	}
	var gotPref api.PreferredAllocationRequest
	if err := gotPref.Unmarshal(wire); err != nil {
		t.Fatal(err)
	}
	wantPref := api.PreferredAllocationRequest{ContainerRequests: []api.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-a", "GPU-b", ""}, MustIncludeDeviceIDs: []string{"GPU-b"}, AllocationSize: 2},
		{AllocationSize: -1},
		{},
	}}
	if !reflect.DeepEqual(gotPref, wantPref) {
		t.Errorf("PreferredAllocationRequest read as %+v, want %+v", gotPref, wantPref)
	}

	alloc := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a", "GPU-c"}}, {}}}
	wire, err = proto.Marshal(alloc)
	if err != nil {
		t.Fatal(err)
	}
	var gotAlloc api.AllocateRequest
	if err := gotAlloc.Unmarshal(wire); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"GPU-a", "GPU-c"}, {}}; !reflect.DeepEqual(gotAlloc.ContainerRequests, want) {
		t.Errorf("AllocateRequest read as %q, want %q", gotAlloc.ContainerRequests, want)
	}
}

// FuzzRequests: any bytes either fail to decode or decode to what the
// kubelet's generated code reads from them; never a panic.
func FuzzRequests(f *testing.F) {
	for _, m := range []proto.Message{
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a"}}}},
		&pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"a", "b"}, MustIncludeDeviceIDs: []string{"b"}, AllocationSize: 1}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var ours api.AllocateRequest
		theirs := &pluginapi.AllocateRequest{}
		if err := ours.Unmarshal(b); err == nil {
			if err := (proto.UnmarshalOptions{}).Unmarshal(b, theirs); err == nil {
				if len(ours.ContainerRequests) != len(theirs.ContainerRequests) {
					t.Fatalf("%d containers, the kubelet's code reads %d", len(ours.ContainerRequests), len(theirs.ContainerRequests))
				}
				for i, c := range theirs.ContainerRequests {
					if !reflect.DeepEqual(ours.ContainerRequests[i], append([]string{}, c.DevicesIds...)) {
						t.Fatalf("container %d: %q, the kubelet's code reads %q", i, ours.ContainerRequests[i], c.DevicesIds)
					}
				}
			}
		}
		var pref api.PreferredAllocationRequest
		_ = pref.Unmarshal(b)
	})
}

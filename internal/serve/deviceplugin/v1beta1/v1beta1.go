// Package v1beta1 is the kubelet's device-plugin API v1beta1 as the
// plugin sends and reads it: the messages it uses, their protobuf
// encoding (field numbers from k8s.io/kubelet's api.proto), the method
// names and the API's constants. Tests check every message against
// k8s.io/kubelet's generated code, both ways.
package v1beta1

import (
	"slices"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// The API's constants, as the kubelet defines them.
const (
	Healthy          = "Healthy"
	Unhealthy        = "Unhealthy"
	Version          = "v1beta1"
	DevicePluginPath = "/var/lib/kubelet/device-plugins/"
	KubeletSocket    = DevicePluginPath + "kubelet.sock"
)

// The methods, by their gRPC names.
const (
	MethodRegister               = "/v1beta1.Registration/Register"
	MethodGetDevicePluginOptions = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
	MethodListAndWatch           = "/v1beta1.DevicePlugin/ListAndWatch"
	MethodGetPreferredAllocation = "/v1beta1.DevicePlugin/GetPreferredAllocation"
	MethodAllocate               = "/v1beta1.DevicePlugin/Allocate"
	MethodPreStartContainer      = "/v1beta1.DevicePlugin/PreStartContainer"
)

// Empty is the empty message (also PreStartContainerResponse).
type Empty struct{}

// AppendProto appends nothing: the message has no fields.
func (Empty) AppendProto(b []byte) []byte { return b }

// DevicePluginOptions says which optional calls the plugin answers.
type DevicePluginOptions struct {
	PreStartRequired                bool
	GetPreferredAllocationAvailable bool
}

// AppendProto appends the message's encoding.
func (m DevicePluginOptions) AppendProto(b []byte) []byte {
	b = grpcwire.AppendBool(b, 1, m.PreStartRequired)
	return grpcwire.AppendBool(b, 2, m.GetPreferredAllocationAvailable)
}

// RegisterRequest is what a plugin tells the kubelet's Registration
// service.
type RegisterRequest struct {
	Version      string
	Endpoint     string
	ResourceName string
	Options      *DevicePluginOptions
}

// AppendProto appends the message's encoding.
func (m RegisterRequest) AppendProto(b []byte) []byte {
	b = grpcwire.AppendString(b, 1, m.Version)
	b = grpcwire.AppendString(b, 2, m.Endpoint)
	b = grpcwire.AppendString(b, 3, m.ResourceName)
	if m.Options != nil {
		b = grpcwire.AppendMessage(b, 4, *m.Options)
	}
	return b
}

// Device is one device as ListAndWatch lists it. NUMANodes empty means no
// topology is sent.
type Device struct {
	ID        string
	Health    string
	NUMANodes []int64
}

// AppendProto appends the message's encoding.
func (m Device) AppendProto(b []byte) []byte {
	b = grpcwire.AppendString(b, 1, m.ID)
	b = grpcwire.AppendString(b, 2, m.Health)
	if len(m.NUMANodes) > 0 {
		b = grpcwire.AppendMessage(b, 3, topology(m.NUMANodes))
	}
	return b
}

// topology is TopologyInfo: a list of NUMANode messages.
type topology []int64

func (t topology) AppendProto(b []byte) []byte {
	for _, id := range t {
		b = grpcwire.AppendMessage(b, 1, numaNode(id))
	}
	return b
}

type numaNode int64

func (n numaNode) AppendProto(b []byte) []byte { return grpcwire.AppendInt(b, 1, int64(n)) }

// ListAndWatchResponse is one full device list.
type ListAndWatchResponse struct {
	Devices []Device
}

// AppendProto appends the message's encoding.
func (m ListAndWatchResponse) AppendProto(b []byte) []byte {
	for _, d := range m.Devices {
		b = grpcwire.AppendMessage(b, 1, d)
	}
	return b
}

// ContainerPreferredAllocationRequest is one container's part of a
// GetPreferredAllocation call.
type ContainerPreferredAllocationRequest struct {
	AvailableDeviceIDs   []string
	MustIncludeDeviceIDs []string
	AllocationSize       int32
}

// PreferredAllocationRequest is a GetPreferredAllocation call.
type PreferredAllocationRequest struct {
	ContainerRequests []ContainerPreferredAllocationRequest
}

// Unmarshal reads the message from its encoding.
func (m *PreferredAllocationRequest) Unmarshal(b []byte) error {
	return grpcwire.EachField(b, func(f grpcwire.Field) error {
		if f.Num != 1 {
			return nil
		}
		body, err := f.Message()
		if err != nil {
			return err
		}
		var c ContainerPreferredAllocationRequest
		err = grpcwire.EachField(body, func(f grpcwire.Field) error {
			switch f.Num {
			case 1, 2:
				id, err := f.String()
				if f.Num == 1 {
					c.AvailableDeviceIDs = append(c.AvailableDeviceIDs, id)
				} else {
					c.MustIncludeDeviceIDs = append(c.MustIncludeDeviceIDs, id)
				}
				return err
			case 3:
				n, err := f.Int()
				c.AllocationSize = int32(n)
				return err
			}
			return nil
		})
		m.ContainerRequests = append(m.ContainerRequests, c)
		return err
	})
}

// PreferredAllocationResponse answers GetPreferredAllocation: the device
// IDs preferred for each container, in request order.
type PreferredAllocationResponse struct {
	ContainerResponses [][]string
}

// AppendProto appends the message's encoding.
func (m PreferredAllocationResponse) AppendProto(b []byte) []byte {
	for _, ids := range m.ContainerResponses {
		b = grpcwire.AppendMessage(b, 1, deviceIDs(ids))
	}
	return b
}

// deviceIDs is a message whose field 1 repeats device IDs
// (ContainerPreferredAllocationResponse, ContainerAllocateRequest).
type deviceIDs []string

func (d deviceIDs) AppendProto(b []byte) []byte { return grpcwire.AppendRepeatedString(b, 1, d) }

// AllocateRequest is an Allocate call: each container's device IDs.
type AllocateRequest struct {
	ContainerRequests [][]string
}

// Unmarshal reads the message from its encoding.
func (m *AllocateRequest) Unmarshal(b []byte) error {
	return grpcwire.EachField(b, func(f grpcwire.Field) error {
		if f.Num != 1 {
			return nil
		}
		body, err := f.Message()
		if err != nil {
			return err
		}
		ids := []string{}
		err = grpcwire.EachField(body, func(f grpcwire.Field) error {
			if f.Num != 1 {
				return nil
			}
			id, err := f.String()
			ids = append(ids, id)
			return err
		})
		m.ContainerRequests = append(m.ContainerRequests, ids)
		return err
	})
}

// Mount is a host path mounted into the container.
type Mount struct {
	ContainerPath string
	HostPath      string
	ReadOnly      bool
}

// AppendProto appends the message's encoding.
func (m Mount) AppendProto(b []byte) []byte {
	b = grpcwire.AppendString(b, 1, m.ContainerPath)
	b = grpcwire.AppendString(b, 2, m.HostPath)
	return grpcwire.AppendBool(b, 3, m.ReadOnly)
}

// DeviceSpec is a device node created in the container.
type DeviceSpec struct {
	ContainerPath string
	HostPath      string
	Permissions   string
}

// AppendProto appends the message's encoding.
func (m DeviceSpec) AppendProto(b []byte) []byte {
	b = grpcwire.AppendString(b, 1, m.ContainerPath)
	b = grpcwire.AppendString(b, 2, m.HostPath)
	return grpcwire.AppendString(b, 3, m.Permissions)
}

// cdiDevice is a CDIDevice message: a fully qualified CDI device name.
type cdiDevice string

func (c cdiDevice) AppendProto(b []byte) []byte { return grpcwire.AppendString(b, 1, string(c)) }

// ContainerAllocateResponse is what one container gets. A nil field and
// an empty one encode alike: the kubelet cannot tell them apart.
type ContainerAllocateResponse struct {
	Envs        map[string]string
	Mounts      []Mount
	Devices     []DeviceSpec
	Annotations map[string]string
	CDIDevices  []string
}

// AppendProto appends the message's encoding, map entries sorted by key.
func (m ContainerAllocateResponse) AppendProto(b []byte) []byte {
	b = grpcwire.AppendStringMap(b, 1, sortedKeys(m.Envs), m.Envs)
	for _, mt := range m.Mounts {
		b = grpcwire.AppendMessage(b, 2, mt)
	}
	for _, d := range m.Devices {
		b = grpcwire.AppendMessage(b, 3, d)
	}
	b = grpcwire.AppendStringMap(b, 4, sortedKeys(m.Annotations), m.Annotations)
	for _, name := range m.CDIDevices {
		b = grpcwire.AppendMessage(b, 5, cdiDevice(name))
	}
	return b
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// AllocateResponse answers Allocate, one response per container in
// request order.
type AllocateResponse struct {
	ContainerResponses []ContainerAllocateResponse
}

// AppendProto appends the message's encoding.
func (m AllocateResponse) AppendProto(b []byte) []byte {
	for _, c := range m.ContainerResponses {
		b = grpcwire.AppendMessage(b, 1, c)
	}
	return b
}

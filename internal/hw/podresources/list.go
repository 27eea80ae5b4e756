package podresources

import (
	"fmt"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// methodList is the PodResources API's List, by its gRPC name.
const methodList = "/v1.PodResourcesLister/List"

// Pod is one pod of a List answer, with the parts of the kubelet's
// PodResources message (k8s.io/kubelet's podresources/v1 api.proto) that
// tell who holds which device; CPUs and memory are skipped.
type Pod struct {
	Name       string
	Namespace  string
	Containers []Container
}

// Container is one container's devices: by device-plugin resource, and
// by DRA claim.
type Container struct {
	Name    string
	Devices []Devices
	Claims  []Claim
}

// Devices is the device IDs a container holds of one device-plugin
// resource (ContainerDevices).
type Devices struct {
	Resource string
	IDs      []string
}

// Claim is one DRA claim a container holds (DynamicResource).
type Claim struct {
	Namespace string
	Name      string
	Devices   []ClaimDevice
}

// ClaimDevice is one device of a claim (ClaimResource): its driver, pool
// and name, and the CDI devices the kubelet gave the container for it.
type ClaimDevice struct {
	Driver     string
	Pool       string
	Device     string
	CDIDevices []string
}

// empty is ListPodResourcesRequest, which has no fields.
type empty struct{}

func (empty) AppendProto(b []byte) []byte { return b }

// DecodeList reads a ListPodResourcesResponse's encoding.
func DecodeList(b []byte) ([]Pod, error) {
	var pods []Pod
	err := grpcwire.EachField(b, func(f grpcwire.Field) error {
		if f.Num != 1 { // pod_resources
			return nil
		}
		var p Pod
		err := eachMessage(f, func(f grpcwire.Field) (err error) {
			switch f.Num {
			case 1:
				p.Name, err = f.String()
			case 2:
				p.Namespace, err = f.String()
			case 3:
				var c Container
				err = eachMessage(f, c.field)
				p.Containers = append(p.Containers, c)
			}
			return err
		})
		pods = append(pods, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("decoding the kubelet's List answer: %w", err)
	}
	return pods, nil
}

func (c *Container) field(f grpcwire.Field) (err error) {
	switch f.Num {
	case 1:
		c.Name, err = f.String()
	case 2: // devices
		var d Devices
		err = eachMessage(f, func(f grpcwire.Field) (err error) {
			switch f.Num {
			case 1:
				d.Resource, err = f.String()
			case 2:
				var id string
				id, err = f.String()
				d.IDs = append(d.IDs, id)
			}
			return err
		})
		c.Devices = append(c.Devices, d)
	case 5: // dynamic_resources
		var cl Claim
		err = eachMessage(f, cl.field)
		c.Claims = append(c.Claims, cl)
	}
	return err
}

func (cl *Claim) field(f grpcwire.Field) (err error) {
	switch f.Num {
	case 2:
		cl.Name, err = f.String()
	case 3:
		cl.Namespace, err = f.String()
	case 4: // claim_resources
		var d ClaimDevice
		err = eachMessage(f, func(f grpcwire.Field) (err error) {
			switch f.Num {
			case 1: // cdi_devices: CDIDevice{name = 1}
				err = eachMessage(f, func(f grpcwire.Field) (err error) {
					if f.Num == 1 {
						var name string
						name, err = f.String()
						d.CDIDevices = append(d.CDIDevices, name)
					}
					return err
				})
			case 2:
				d.Driver, err = f.String()
			case 3:
				d.Pool, err = f.String()
			case 4:
				d.Device, err = f.String()
			}
			return err
		})
		cl.Devices = append(cl.Devices, d)
	}
	return err
}

// eachMessage calls fn with each field of the nested message in f.
func eachMessage(f grpcwire.Field, fn func(grpcwire.Field) error) error {
	body, err := f.Message()
	if err != nil {
		return err
	}
	return grpcwire.EachField(body, fn)
}

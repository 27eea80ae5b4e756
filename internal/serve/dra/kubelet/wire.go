package kubelet

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// The methods, by their gRPC names (k8s.io/kubelet's *_grpc.pb.go).
const (
	methodGetInfo                  = "/pluginregistration.Registration/GetInfo"
	methodNotifyRegistrationStatus = "/pluginregistration.Registration/NotifyRegistrationStatus"
	methodPrepareV1                = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
	methodUnprepareV1              = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
	methodPrepareV1beta1           = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
	methodUnprepareV1beta1         = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
	methodWatchHealthV1            = "/v1.DRAResourceHealth/NodeWatchResources"
	methodWatchHealthV1alpha1      = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
)

// The services the registration advertises, in the helper's order: the
// kubelet picks the newest it knows of each.
const (
	serviceDRAV1          = "v1.DRAPlugin"
	serviceDRAV1beta1     = "v1beta1.DRAPlugin"
	serviceHealthV1       = "v1.DRAResourceHealth"
	serviceHealthV1alpha1 = "v1alpha1.DRAResourceHealth"
	pluginTypeDRA         = "DRAPlugin"
)

// pluginInfo is pluginregistration's PluginInfo.
type pluginInfo struct {
	Type, Name, Endpoint string
	SupportedVersions    []string
}

func (m pluginInfo) AppendProto(b []byte) []byte {
	b = grpcwire.AppendString(b, 1, m.Type)
	b = grpcwire.AppendString(b, 2, m.Name)
	b = grpcwire.AppendString(b, 3, m.Endpoint)
	return grpcwire.AppendRepeatedString(b, 4, m.SupportedVersions)
}

// RegistrationStatus is what the kubelet said of the registration.
type RegistrationStatus struct {
	PluginRegistered bool
	Error            string
}

func (m *RegistrationStatus) unmarshal(b []byte) error {
	return grpcwire.EachField(b, func(f grpcwire.Field) error {
		var err error
		switch f.Num {
		case 1:
			var v int64
			v, err = f.Int()
			m.PluginRegistered = v != 0
		case 2:
			m.Error, err = f.String()
		}
		return err
	})
}

// empty is the empty message (InfoRequest, RegistrationStatusResponse,
// NodeWatchResourcesRequest).
type empty struct{}

func (empty) AppendProto(b []byte) []byte { return b }

// checkEmpty vets a message of no fields: any well-formed encoding is
// one (fields it does not know are skipped), garbage is not.
func checkEmpty(b []byte) error {
	return grpcwire.EachField(b, func(grpcwire.Field) error { return nil })
}

// claimRef is the DRA API's Claim: which claim the kubelet means.
type claimRef struct {
	Namespace, UID, Name string
}

// readClaims reads Node(Un)PrepareResourcesRequest: field 1 repeats Claim.
func readClaims(b []byte) ([]claimRef, error) {
	var out []claimRef
	err := grpcwire.EachField(b, func(f grpcwire.Field) error {
		if f.Num != 1 {
			return nil
		}
		body, err := f.Message()
		if err != nil {
			return err
		}
		var c claimRef
		err = grpcwire.EachField(body, func(f grpcwire.Field) error {
			var err error
			switch f.Num {
			case 1:
				c.Namespace, err = f.String()
			case 2:
				c.UID, err = f.String()
			case 3:
				c.Name, err = f.String()
			}
			return err
		})
		out = append(out, c)
		return err
	})
	return out, err
}

// wireDevice is the DRA API's Device. ShareID nil is absent; v1beta1 has
// no such field and never sends it.
type wireDevice struct {
	RequestNames []string
	PoolName     string
	DeviceName   string
	CDIDeviceIDs []string
	ShareID      *string
}

// prepareResponse is NodePrepareResourcesResponse: per claim UID, the
// devices or an error.
type prepareResponse struct {
	v1beta1 bool
	claims  map[string]claimPrepared
}

type claimPrepared struct {
	devices []wireDevice
	err     string
}

func (m prepareResponse) AppendProto(b []byte) []byte {
	for _, uid := range slices.Sorted(maps.Keys(m.claims)) {
		c := m.claims[uid]
		b = appendMapEntry(b, uid, func(b []byte) []byte {
			for _, d := range c.devices {
				b = grpcwire.AppendMessage(b, 1, msg(func(b []byte) []byte {
					b = grpcwire.AppendRepeatedString(b, 1, d.RequestNames)
					b = grpcwire.AppendString(b, 2, d.PoolName)
					b = grpcwire.AppendString(b, 3, d.DeviceName)
					b = grpcwire.AppendRepeatedString(b, 4, d.CDIDeviceIDs)
					if d.ShareID != nil && !m.v1beta1 {
						// optional: present even when empty.
						b = protowire.AppendTag(b, 5, protowire.BytesType)
						b = protowire.AppendString(b, *d.ShareID)
					}
					return b
				}))
			}
			return grpcwire.AppendString(b, 2, c.err)
		})
	}
	return b
}

// unprepareResponse is NodeUnprepareResourcesResponse: per claim UID, an
// error or none.
type unprepareResponse map[string]string

func (m unprepareResponse) AppendProto(b []byte) []byte {
	for _, uid := range slices.Sorted(maps.Keys(m)) {
		e := m[uid]
		b = appendMapEntry(b, uid, func(b []byte) []byte { return grpcwire.AppendString(b, 1, e) })
	}
	return b
}

// appendMapEntry appends one entry of a map<string, Message> in field 1.
func appendMapEntry(b []byte, key string, value func([]byte) []byte) []byte {
	return grpcwire.AppendMessage(b, 1, msg(func(b []byte) []byte {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, key)
		return grpcwire.AppendMessage(b, 2, msg(value))
	}))
}

// msg is a message body written by a function.
type msg func([]byte) []byte

func (f msg) AppendProto(b []byte) []byte { return f(b) }

// healthResponse is NodeWatchResourcesResponse, alike in v1 and v1alpha1.
type healthResponse []wireHealth

type wireHealth struct {
	PoolName, DeviceName string
	Health               int64 // UNKNOWN 0, HEALTHY 1, UNHEALTHY 2
	LastUpdated          int64 // Unix seconds
	TimeoutSeconds       int64
	Message              string
}

func (m healthResponse) AppendProto(b []byte) []byte {
	for _, d := range m {
		b = grpcwire.AppendMessage(b, 1, msg(func(b []byte) []byte {
			b = grpcwire.AppendMessage(b, 1, msg(func(b []byte) []byte {
				b = grpcwire.AppendString(b, 1, d.PoolName)
				return grpcwire.AppendString(b, 2, d.DeviceName)
			}))
			b = grpcwire.AppendInt(b, 2, d.Health)
			b = grpcwire.AppendInt(b, 3, d.LastUpdated)
			b = grpcwire.AppendInt(b, 4, d.TimeoutSeconds)
			return grpcwire.AppendString(b, 5, d.Message)
		}))
	}
	return b
}

package dra

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// prepared prepares c on d and returns its devices by name.
func prepared(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) map[string]kubelet.Device {
	t.Helper()
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || got[c.UID].Err != nil {
		t.Fatalf("Prepare: %v, %v", err, got[c.UID].Err)
	}
	out := map[string]kubelet.Device{}
	for _, dv := range got[c.UID].Devices {
		out[dv.DeviceName] = dv
	}
	return out
}

// metadataAttrs are a device's metadata attributes as the slice keys them.
func metadataAttrs(t *testing.T, dv kubelet.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	if dv.Metadata == nil {
		t.Fatalf("%s: no metadata", dv.DeviceName)
	}
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for k, a := range dv.Metadata.Attributes {
		out[resourceapi.QualifiedName(k)] = a
	}
	return out
}

// Each prepared GPU and NIC carries, for the containers' metadata file,
// exactly the attributes its ResourceSlice entry publishes, and the NIC
// its interface as the claim's status has it; prepared again, the same.
func TestDeviceMetadataIsTheSlice(t *testing.T) {
	c := apiClaim()
	d, _ := statusDriver(t, fake.NewClientset(c), Options{DeviceMetadata: true})
	slice := map[string]resourceapi.Device{}
	for _, dv := range d.Resources().Pools[testNode].Slices[0].Devices {
		slice[dv.Name] = dv
	}
	for round := range 2 {
		devs := prepared(t, d, c)
		if len(devs) != 3 {
			t.Fatalf("round %d: devices %v, want our three", round, slices.Sorted(maps.Keys(devs)))
		}
		for name, dv := range devs {
			if got, want := metadataAttrs(t, dv), slice[name].Attributes; !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("round %d: %s metadata attributes\n got %v\nwant %v (the slice's)", round, name, got, want)
			}
		}
		if a := devs["gpu-0"].Metadata.Attributes["uuid"]; a.StringValue == nil || *a.StringValue != "GPU-a" {
			t.Errorf("gpu-0 metadata uuid = %+v", a)
		}
		if a := devs["gpu-0"].Metadata.Attributes[draslice.AttrPCIBusID]; a.StringValue == nil || *a.StringValue != "0000:07:00.0" {
			t.Errorf("gpu-0 metadata %s = %+v", draslice.AttrPCIBusID, a)
		}
		if nd := devs[testNICDev].Metadata.NetworkData; nd == nil || nd.InterfaceName != "ens1f0np0" || nd.HardwareAddress != testMAC {
			t.Errorf("NIC networkData = %+v, want ens1f0np0 %s", nd, testMAC)
		}
		if devs["gpu-0"].Metadata.NetworkData != nil {
			t.Error("a GPU has networkData")
		}
	}
}

// Off, no device carries metadata: the helper then writes no file.
func TestDeviceMetadataOff(t *testing.T) {
	c := apiClaim()
	d, _ := statusDriver(t, fake.NewClientset(c), Options{})
	for name, dv := range prepared(t, d, c) {
		if dv.Metadata != nil {
			t.Errorf("%s: metadata %+v with DeviceMetadata off", name, dv.Metadata)
		}
	}
}

// A placement's metadata adds the instance the claim's Prepare created:
// its UUID and instance IDs, which the slice cannot know.
func TestDeviceMetadataOfACreatedInstance(t *testing.T) {
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1, DeviceMetadata: true})
	d.SetMIG(newFakeMIG(), (&migSpecs{}).write)
	d.SetGPUs(context.Background(), partitionedGPUs())
	const placement = "gpu-2-3g-40gb-4"
	published := byName(pub.last(t))[placement].Attributes
	if _, ok := published["uuid"]; ok {
		t.Fatalf("placement %s publishes a uuid", placement)
	}
	got := metadataAttrs(t, prepared(t, d, claim("uid-3g", "three", result("mig", placement)))[placement])
	for k, want := range map[resourceapi.QualifiedName]string{"uuid": "MIG-GPU-c-2-1", "gpuInstance": "i2", "computeInstance": "i0", "profile": "3g.40gb", "parentUUID": "GPU-c"} {
		if s := str(got[k]); s != want {
			t.Errorf("metadata %s = %s, want %s", k, s, want)
		}
	}
	for k, a := range published {
		if !equality.Semantic.DeepEqual(got[k], a) {
			t.Errorf("metadata %s = %+v, want the slice's %+v", k, got[k], a)
		}
	}
}

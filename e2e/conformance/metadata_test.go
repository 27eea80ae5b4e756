package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// draMetadataCDIID is the CDI device the kubeletplugin helper adds to a
// request's first device: it mounts the request's metadata file.
func draMetadataCDIID(claimUID, request string) string {
	return draDriver + "/metadata=" + claimUID + "_" + request
}

// TestDRADeviceMetadata (KEP-5304): a prepared claim's container gets,
// through a CDI device the kubelet passes on like ours, a read-only mount
// of one file per request at the path the API fixes. The file is a valid
// metadata.resource.k8s.io/v1beta1 object naming the claim and, for each
// device, exactly the attributes its ResourceSlice entry publishes.
// Unprepare removes the file and its CDI spec. With draDeviceMetadata
// off, the container gets our CDI devices alone.
func TestDRADeviceMetadata(t *testing.T) {
	s := startDRANode(t)
	ctx := s.ctx(t)
	published := s.waitSlices(t, "8 GPUs", func(devs map[string]resourceapi.Device) bool { return len(devs) == 8 })
	pod := s.claimFor(t, "meta", "gpu-2", "gpu-5")
	if err := s.k.Manager.PrepareResources(ctx, pod); err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	ids := s.cdiIDs(t, pod)
	if !slices.Contains(ids, draMetadataCDIID("claim-uid-meta", draRequest)) {
		t.Fatalf("CDI devices %v lack the metadata file's", ids)
	}

	// What the runtime does: resolve the IDs from the spec directory.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(s.cfg.CDISpecDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("the runtime could not resolve %v: %v", unresolved, err)
	}
	want := metadata.ResourceClaimFilePath(draDriver, "meta-gpus", draRequest)
	var host string
	for _, m := range spec.Mounts {
		if m.Destination == want {
			host = m.Source
			if !slices.Contains(m.Options, "ro") {
				t.Errorf("metadata mount options %v, want read-only", m.Options)
			}
		}
	}
	if host == "" {
		t.Fatalf("no mount at %s in %+v", want, spec.Mounts)
	}
	data, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	var md metadata.DeviceMetadata
	var invalid error
	var gvk schema.GroupVersionKind
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &md,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid), devicemetadata.DecodeMetadataStoreGVKResult(&gvk)); err != nil {
		t.Fatalf("decoding %s: %v\n%s", host, err, data)
	}
	if invalid != nil {
		t.Errorf("%s does not validate: %v", host, invalid)
	}
	if gvk.GroupVersion() != metadatav1beta1.SchemeGroupVersion {
		t.Errorf("first object is %s, want %s", gvk, metadatav1beta1.SchemeGroupVersion)
	}
	if md.Name != "meta-gpus" || md.Namespace != draNamespace || md.UID != "claim-uid-meta" || len(md.Requests) != 1 || md.Requests[0].Name != draRequest {
		t.Fatalf("metadata names claim %s/%s (%s), requests %+v", md.Namespace, md.Name, md.UID, md.Requests)
	}
	var names []string
	for _, dv := range md.Requests[0].Devices {
		names = append(names, dv.Name)
		if dv.Driver != draDriver || dv.Pool != draNode {
			t.Errorf("%s: driver %q pool %q", dv.Name, dv.Driver, dv.Pool)
		}
		if !equality.Semantic.DeepEqual(dv.Attributes, published[dv.Name].Attributes) {
			t.Errorf("%s: metadata attributes\n got %v\nwant %v (the ResourceSlice's)", dv.Name, dv.Attributes, published[dv.Name].Attributes)
		}
	}
	if slices.Sort(names); !slices.Equal(names, []string{"gpu-2", "gpu-5"}) {
		t.Errorf("metadata devices %v, want gpu-2 and gpu-5", names)
	}
	t.Logf("%s (%d bytes):\n%s", want, len(data), data)

	s.k.Remove(pod)
	if err := s.k.Manager.UnprepareResources(ctx, pod); err != nil {
		t.Fatalf("UnprepareResources: %v", err)
	}
	if _, err := os.Stat(host); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("metadata file after Unprepare: %v, want gone", err)
	}
	left, _ := filepath.Glob(filepath.Join(s.cfg.CDISpecDir, draDriver+"_metadata_*"))
	if len(left) > 0 {
		t.Errorf("metadata CDI specs after Unprepare: %v", left)
	}
}

func TestDRADeviceMetadataOff(t *testing.T) {
	s := startDRANodeWith(t, func(c *config.Config) { c.DRADeviceMetadata = false })
	pod := s.claimFor(t, "plain", "gpu-0")
	if err := s.k.Manager.PrepareResources(s.ctx(t), pod); err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	if ids, want := s.cdiIDs(t, pod), s.gpuCDIIDs(0); !slices.Equal(ids, want) {
		t.Errorf("CDI devices with draDeviceMetadata off = %v, want %v", ids, want)
	}
	if left, _ := filepath.Glob(filepath.Join(s.cfg.CDISpecDir, draDriver+"_metadata_*")); len(left) > 0 {
		t.Errorf("metadata CDI specs written with draDeviceMetadata off: %v", left)
	}
}

package kubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

// DefaultCDIDir is where the metadata CDI specs go by default.
const DefaultCDIDir = "/var/run/cdi"

// metadataSubDir, under the plugin directory, holds the metadata files:
// <namespace>_<claim>/<request>/metadata.json.
const metadataSubDir = "dra-device-metadata"

// metadataWriter writes the device metadata files of KEP-5304 and the CDI
// specs that mount them, named and encoded as the kubeletplugin helper
// does: a release built on it left files this one replaces and removes.
type metadataWriter struct {
	driver, pluginDir, cdiDir string
	versions                  []schema.GroupVersion
}

func newMetadataWriter(driver, pluginDir, cdiDir string, versions []schema.GroupVersion) (*metadataWriter, error) {
	if len(versions) == 0 {
		return nil, errors.New("metadata versions must be explicitly selected in EnableDeviceMetadata, none chosen")
	}
	latest := false
	for _, v := range versions {
		switch v {
		case metadatav1beta1.SchemeGroupVersion:
			latest = true
		case metadatav1alpha1.SchemeGroupVersion:
		default:
			return nil, fmt.Errorf("metadata version %q is not supported", v)
		}
	}
	if !latest {
		return nil, fmt.Errorf("the latest metadata version is %s (= metadatav1beta1.SchemeGroupVersion) and must be enabled explicitly", metadatav1beta1.SchemeGroupVersion)
	}
	if cdiDir == "" {
		cdiDir = DefaultCDIDir
	}
	return &metadataWriter{driver: driver, pluginDir: pluginDir, cdiDir: cdiDir, versions: slices.Clone(versions)}, nil
}

// metaClaim is a claim as its metadata files name it.
type metaClaim struct {
	namespace, name string
	uid             types.UID
	// podClaimName is the pod's name for a claim made from a template.
	podClaimName *string
}

// writeClaim writes a metadata file and a CDI spec for each request of
// claim that devices serve, and returns each request's CDI device by its
// name (without a subrequest).
func (w *metadataWriter) writeClaim(claim *resourceapi.ResourceClaim, devices []Device) (map[string]string, error) {
	mc := metaClaim{namespace: claim.Namespace, name: claim.Name, uid: claim.UID}
	if v, ok := claim.Annotations[resourceapi.PodResourceClaimAnnotation]; ok {
		mc.podClaimName = &v
	}
	byRequest := map[string][]Device{}
	var order []string
	for _, d := range devices {
		for _, r := range d.Requests {
			if _, ok := byRequest[r]; !ok {
				order = append(order, r)
			}
			byRequest[r] = append(byRequest[r], d)
		}
	}
	ids := make(map[string]string, len(order))
	for _, ref := range order {
		req, _, _ := strings.Cut(ref, "/")
		data, err := w.encode(mc, 1, ref, byRequest[ref])
		if err != nil {
			return nil, err
		}
		if err := writeFile(w.metadataFile(mc.namespace, mc.name, req), data); err != nil {
			return nil, fmt.Errorf("write metadata for request %q: %w", ref, err)
		}
		id, err := w.writeCDISpec(mc, req)
		if err != nil {
			return nil, fmt.Errorf("write CDI spec for request %q: %w", ref, err)
		}
		ids[req] = id
	}
	return ids, nil
}

// updateRequest rewrites one request's metadata file with devices, one
// generation on.
func (w *metadataWriter) updateRequest(mc metaClaim, request string, devices []Device) error {
	req, _, _ := strings.Cut(request, "/")
	path := w.metadataFile(mc.namespace, mc.name, req)
	old, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("request %q not found in prepared claim %s/%s", request, mc.namespace, mc.name)
	}
	if err != nil {
		return fmt.Errorf("read metadata file: %w", err)
	}
	prev, err := w.decodeFirst(old)
	if err != nil {
		return fmt.Errorf("decode existing metadata: %w", err)
	}
	mc.podClaimName = prev.PodClaimName
	data, err := w.encode(mc, prev.Generation+1, request, devices)
	if err != nil {
		return err
	}
	if err := writeFile(path, data); err != nil {
		return fmt.Errorf("write metadata file: %w", err)
	}
	return nil
}

// removeClaim removes a claim's metadata files and CDI specs; none is no
// error.
func (w *metadataWriter) removeClaim(c NamespacedObject) error {
	dir := w.claimDir(c.Namespace, c.Name)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove metadata directory %s: %w", dir, err)
	}
	entries, err := os.ReadDir(w.cdiDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading CDI specs in %s: %w", w.cdiDir, err)
	}
	prefix := w.driver + "_metadata_" + string(c.UID) + "_"
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ".json") {
			if err := os.Remove(filepath.Join(w.cdiDir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove CDI spec %s: %w", n, err)
			}
		}
	}
	return nil
}

// encode is the metadata file: the object once per version, newest
// first, each indented and on lines of its own, as apimachinery's pretty
// JSON serializer writes it. The versions' types are alike field for
// field, so v1beta1's struct serves for each.
func (w *metadataWriter) encode(mc metaClaim, generation int64, request string, devices []Device) ([]byte, error) {
	devs := make([]metadatav1beta1.Device, 0, len(devices))
	for _, d := range devices {
		md := metadatav1beta1.Device{Driver: w.driver, Pool: d.PoolName, Name: d.DeviceName}
		if d.Metadata != nil {
			if d.Metadata.Attributes != nil {
				md.Attributes = make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Metadata.Attributes))
				for k, v := range d.Metadata.Attributes {
					md.Attributes[resourceapi.QualifiedName(k)] = v
				}
			}
			md.NetworkData = d.Metadata.NetworkData
		}
		devs = append(devs, md)
	}
	obj := metadatav1beta1.DeviceMetadata{
		ObjectMeta:   metav1.ObjectMeta{Name: mc.name, Namespace: mc.namespace, UID: mc.uid, Generation: generation},
		PodClaimName: mc.podClaimName,
		Requests:     []metadatav1beta1.DeviceMetadataRequest{{Name: request, Devices: devs}},
	}
	var buf bytes.Buffer
	for _, gv := range w.versions {
		obj.TypeMeta = metav1.TypeMeta{APIVersion: gv.String(), Kind: "DeviceMetadata"}
		b, err := json.MarshalIndent(obj, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("encode metadata for %s: %w", gv, err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// decodeFirst reads the first object of a metadata file in a version
// this package knows; a newer version is skipped.
func (w *metadataWriter) decodeFirst(data []byte) (*metadatav1beta1.DeviceMetadata, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var seen []string
	for {
		var obj metadatav1beta1.DeviceMetadata
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("no metadata object of a known version (found %v)", seen)
		}
		if err != nil {
			return nil, fmt.Errorf("read metadata object from stream: %w", err)
		}
		switch obj.APIVersion {
		case metadatav1beta1.SchemeGroupVersion.String(), metadatav1alpha1.SchemeGroupVersion.String():
			return &obj, nil
		}
		seen = append(seen, obj.APIVersion)
	}
}

// writeCDISpec writes the CDI spec that mounts request's metadata file
// read-only in the containers and returns its device's qualified name.
func (w *metadataWriter) writeCDISpec(mc metaClaim, request string) (string, error) {
	name := string(mc.uid) + "_" + request
	container := metadata.ResourceClaimFilePath(w.driver, mc.name, request)
	if mc.podClaimName != nil && *mc.podClaimName != "" {
		container = metadata.ResourceClaimTemplateFilePath(w.driver, *mc.podClaimName, request)
	}
	spec := &cdispec.Spec{
		Kind: w.driver + "/metadata",
		Devices: []cdispec.Device{{
			Name: name,
			ContainerEdits: cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{
				HostPath: w.metadataFile(mc.namespace, mc.name, request), ContainerPath: container, Options: []string{"ro", "bind"},
			}}},
		}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", fmt.Errorf("determine CDI spec version: %w", err)
	}
	spec.Version = v
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal CDI spec: %w", err)
	}
	if err := writeFile(filepath.Join(w.cdiDir, fmt.Sprintf("%s_metadata_%s_%s.json", w.driver, mc.uid, request)), data); err != nil {
		return "", fmt.Errorf("write CDI spec file: %w", err)
	}
	return w.driver + "/metadata=" + name, nil
}

func (w *metadataWriter) claimDir(namespace, name string) string {
	return filepath.Join(w.pluginDir, metadataSubDir, namespace+"_"+name)
}

func (w *metadataWriter) metadataFile(namespace, name, request string) string {
	return filepath.Join(w.claimDir(namespace, name), request, "metadata.json")
}

// writeFile replaces path durably, 0644 in 0755 directories, as the
// helper writes them: runtimes read them as another user.
func writeFile(path string, data []byte) error {
	_, err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644, Sync: true})
	return err
}

// UpdateRequestMetadata rewrites the metadata file of one request of a
// prepared claim with devices (their Metadata now filled in), one
// generation on: for data known only after Prepare, such as a network
// interface's addresses.
func (h *Helper) UpdateRequestMetadata(_ context.Context, claimNamespace, claimName string, claimUID types.UID, requestName string, devices []Device) error {
	if h.metadata == nil {
		return errors.New("device metadata is not enabled")
	}
	return h.metadata.updateRequest(metaClaim{namespace: claimNamespace, name: claimName, uid: claimUID}, requestName, devices)
}

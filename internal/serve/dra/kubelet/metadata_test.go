package kubelet

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// upstreamPlugin serves a fakePlugin's answers to the kubeletplugin helper.
type upstreamPlugin struct{ p *fakePlugin }

func (u upstreamPlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	res, err := u.p.PrepareResourceClaims(ctx, claims)
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for uid, r := range res {
		out[uid] = kubeletplugin.PrepareResult{Err: r.Err, Devices: upstreamDevices(r.Devices)}
	}
	return out, err
}

func upstreamDevices(ds []Device) []kubeletplugin.Device {
	var out []kubeletplugin.Device
	for _, d := range ds {
		ud := kubeletplugin.Device{Requests: d.Requests, PoolName: d.PoolName, DeviceName: d.DeviceName, CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID}
		if d.Metadata != nil {
			ud.Metadata = &kubeletplugin.DeviceMetadata{Attributes: d.Metadata.Attributes, NetworkData: d.Metadata.NetworkData}
		}
		out = append(out, ud)
	}
	return out
}

func (u upstreamPlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	ours := make([]NamespacedObject, len(claims))
	for i, c := range claims {
		ours[i] = NamespacedObject{NamespacedName: c.NamespacedName, UID: c.UID}
	}
	return u.p.UnprepareResourceClaims(ctx, ours)
}

func (u upstreamPlugin) HandleError(ctx context.Context, err error, msg string) {
	u.p.HandleError(ctx, err, msg)
}

func (u upstreamPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// metadataCase is one claim set prepared with device metadata on.
type metadataCase struct {
	claims  []*resourceapi.ResourceClaim
	results map[types.UID]PrepareResult
}

func newMetadataCase() metadataCase {
	fromTemplate := claim("ns", "pod-gpu-x7k2", "uid-a")
	fromTemplate.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	plain := claim("ns", "shared", "uid-b")
	failing := claim("ns", "failing", "uid-c")
	attrs := map[string]resourceapi.DeviceAttribute{
		"model":                           {StringValue: ptr.To("H100")},
		"index":                           {IntValue: ptr.To[int64](0)},
		"mig":                             {BoolValue: ptr.To(false)},
		"driverVersion":                   {VersionValue: ptr.To("550.54.15")},
		"resource.kubernetes.io/pciBusID": {StringValue: ptr.To("0000:3b:00.0")},
	}
	return metadataCase{
		claims: []*resourceapi.ResourceClaim{fromTemplate, plain, failing},
		results: map[types.UID]PrepareResult{
			"uid-a": {Devices: []Device{
				{Requests: []string{"gpu/big"}, PoolName: "node1", DeviceName: "gpu-0", CDIDeviceIDs: []string{"example.com/gpu=0"}, Metadata: &DeviceMetadata{Attributes: attrs}},
				{Requests: []string{"gpu/big", "nic"}, PoolName: "node1", DeviceName: "nic-0", CDIDeviceIDs: []string{"example.com/nic=0"},
					Metadata: &DeviceMetadata{NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "eth1", HardwareAddress: "02:00:00:00:00:01", IPs: []string{"10.0.0.2/24"}}}},
			}},
			"uid-b": {Devices: []Device{{Requests: []string{"gpu"}, PoolName: "node1", DeviceName: "gpu-1"}}},
			"uid-c": {Err: errorString("device gone")},
		},
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

func (m metadataCase) request() *drapbv1.NodePrepareResourcesRequest {
	req := &drapbv1.NodePrepareResourcesRequest{}
	for _, c := range m.claims {
		req.Claims = append(req.Claims, &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return req
}

// runUpstream prepares m with the kubeletplugin helper in the directories
// of o, then calls more with it.
func runUpstream(t *testing.T, m metadataCase, o Options, more func(*kubeletplugin.Helper)) *drapbv1.NodePrepareResourcesResponse {
	t.Helper()
	client := fake.NewClientset()
	for _, c := range m.claims {
		if _, err := client.ResourceV1().ResourceClaims(c.Namespace).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := kubeletplugin.Start(t.Context(), upstreamPlugin{&fakePlugin{results: m.results}},
		kubeletplugin.DriverName(o.DriverName), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir), kubeletplugin.PluginDataDirectoryPath(o.PluginDir),
		kubeletplugin.EnableDeviceMetadata(true, o.MetadataVersions), kubeletplugin.CDIDirectory(o.CDIDir))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	resp, err := drapbv1.NewDRAPluginClient(dial(t, filepath.Join(o.PluginDir, "dra.sock"))).NodePrepareResources(t.Context(), m.request())
	if err != nil {
		t.Fatal(err)
	}
	if more != nil {
		more(h)
	}
	return resp
}

// tree is every file under the directories of o, by path relative to its
// root, with o's root in their contents replaced by "ROOT".
func tree(t *testing.T, o Options) map[string]string {
	t.Helper()
	root := filepath.Dir(o.PluginDir)
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&fs.ModeSocket != 0 {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		out[rel] = info.Mode().String() + "\n" + strings.ReplaceAll(string(b), root, "ROOT")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, got, want map[string]string) {
	t.Helper()
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s: missing", p)
		} else if g != w {
			t.Errorf("%s:\n%s\nwant (the kubeletplugin helper's)\n%s", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: the kubeletplugin helper writes no such file", p)
		}
	}
}

func TestMetadataAsUpstream(t *testing.T) {
	for _, tt := range []struct {
		name     string
		versions []schema.GroupVersion
	}{
		{"v1beta1", []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}},
		{"v1beta1 and v1alpha1", []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := newMetadataCase()
			update := []Device{{Requests: []string{"gpu/big"}, PoolName: "node1", DeviceName: "gpu-0",
				Metadata: &DeviceMetadata{NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "ib0"}}}}

			up := testDirs(t, Options{DeviceMetadata: true, MetadataVersions: tt.versions})
			wantResp := runUpstream(t, m, up, func(h *kubeletplugin.Helper) {
				if err := h.UpdateRequestMetadata(t.Context(), "ns", "pod-gpu-x7k2", "uid-a", "gpu/big", upstreamDevices(update)); err != nil {
					t.Fatal(err)
				}
			})
			wantTree := tree(t, up)

			p := &fakePlugin{results: m.results}
			h, _ := startHelper(t, p, claimsOf(m.claims...), Options{DeviceMetadata: true, MetadataVersions: tt.versions})
			ours := Options{PluginDir: filepath.Dir(h.draSocket), RegistrarDir: filepath.Dir(h.regSocket)}
			ours.CDIDir = filepath.Join(filepath.Dir(ours.PluginDir), "cdi")
			resp, err := drapbv1.NewDRAPluginClient(dial(t, h.draSocket)).NodePrepareResources(t.Context(), m.request())
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(resp, wantResp) {
				t.Errorf("response\n%v\nwant (the kubeletplugin helper's)\n%v", resp, wantResp)
			}
			if err := h.UpdateRequestMetadata(t.Context(), "ns", "pod-gpu-x7k2", "uid-a", "gpu/big", update); err != nil {
				t.Fatal(err)
			}
			got := tree(t, ours)
			if len(wantTree) < 4 {
				t.Fatalf("the kubeletplugin helper wrote only %d files: %v", len(wantTree), wantTree)
			}
			sameTree(t, got, wantTree)
		})
	}
}

// TestMetadataFromUpstream: the files a release built on the kubeletplugin
// helper left are replaced by the next Prepare and removed by Unprepare.
func TestMetadataFromUpstream(t *testing.T) {
	versions := []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}
	m := newMetadataCase()
	o := testDirs(t, Options{DeviceMetadata: true, MetadataVersions: versions})
	runUpstream(t, m, o, nil)
	left := tree(t, o)

	o.Log = nil
	p := &fakePlugin{results: m.results}
	h, err := Start(t.Context(), p, claimsOf(m.claims...), o)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	c := drapbv1.NewDRAPluginClient(dial(t, h.draSocket))
	if _, err := c.NodePrepareResources(t.Context(), m.request()); err != nil {
		t.Fatal(err)
	}
	sameTree(t, tree(t, o), left)

	// uid-b stays prepared: only uid-a's files go.
	if _, err := c.NodeUnprepareResources(t.Context(), &drapbv1.NodeUnprepareResourcesRequest{
		Claims: []*drapbv1.Claim{{Namespace: "ns", Name: "pod-gpu-x7k2", Uid: "uid-a"}}}); err != nil {
		t.Fatal(err)
	}
	for f := range tree(t, o) {
		if strings.Contains(f, "uid-a") || strings.Contains(f, "pod-gpu-x7k2") {
			t.Errorf("%s left after Unprepare", f)
		}
	}
	if len(tree(t, o)) != 2 {
		t.Errorf("after Unprepare of one claim: %v, want uid-b's metadata file and CDI spec", tree(t, o))
	}
}

func TestMetadataVersions(t *testing.T) {
	for _, tt := range []struct {
		name     string
		versions []schema.GroupVersion
		want     string
	}{
		{"none", nil, "none chosen"},
		{"without the latest", []schema.GroupVersion{metadatav1alpha1.SchemeGroupVersion}, "must be enabled explicitly"},
		{"unknown", []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, {Group: "metadata.resource.k8s.io", Version: "v9"}}, `"metadata.resource.k8s.io/v9" is not supported`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Start(t.Context(), &fakePlugin{}, fakeClaims{}, testDirs(t, Options{DeviceMetadata: true, MetadataVersions: tt.versions}))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want %q", err, tt.want)
			}
		})
	}
}

package kubelet

import (
	"log/slog"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// BenchmarkNodePrepareResources is one claim's Prepare as the kubelet
// makes it (grpc-go, v1), through this package and through the
// kubeletplugin helper it replaces, each reading the claim from memory
// (a fake clientset for the helper): the wire and the helper, not the API
// server's GET, which costs the same in both.
func BenchmarkNodePrepareResources(b *testing.B) {
	c := claim("team-a", "train", "uid-1")
	results := map[types.UID]PrepareResult{"uid-1": {Devices: []Device{{
		Requests: []string{"gpu"}, PoolName: "node-a", DeviceName: "gpu-0", CDIDeviceIDs: []string{testDriver + "/gpu=GPU-0"},
	}}}}
	req := &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "team-a", Name: "train", Uid: "uid-1"}}}
	run := func(b *testing.B, cl drapbv1.DRAPluginClient) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cl.NodePrepareResources(b.Context(), req)
			if err != nil || resp.Claims["uid-1"].GetError() != "" {
				b.Fatal(err, resp)
			}
		}
	}
	b.Run("ours", func(b *testing.B) {
		o := testDirs(b, Options{})
		o.Log = slog.New(slog.DiscardHandler)
		h, err := Start(b.Context(), &fakePlugin{results: results}, claimsOf(c), o)
		if err != nil {
			b.Fatal(err)
		}
		defer h.Stop()
		run(b, drapbv1.NewDRAPluginClient(dial(b, h.draSocket)))
	})
	b.Run("kubeletplugin", func(b *testing.B) {
		o := testDirs(b, Options{})
		h, err := kubeletplugin.Start(b.Context(), upstreamPlugin{&fakePlugin{results: results}},
			kubeletplugin.DriverName(o.DriverName), kubeletplugin.KubeClient(fake.NewClientset(c)),
			kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir), kubeletplugin.PluginDataDirectoryPath(o.PluginDir))
		if err != nil {
			b.Fatal(err)
		}
		defer h.Stop()
		run(b, drapbv1.NewDRAPluginClient(dial(b, filepath.Join(o.PluginDir, "dra.sock"))))
	})
}

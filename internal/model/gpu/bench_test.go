package gpu

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

// BenchmarkAllocate measures one Allocate round trip through the plugin's
// gRPC server on a unix socket, as the kubelet makes it.
func BenchmarkAllocate(b *testing.B) {
	gpus, topo := eightGPUs()
	r, err := New(gpus, topo, Options{DevRoot: devRoot(b, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")})
	if err != nil {
		b.Fatal(err)
	}
	_, c := serveOnSocket(b, r)
	ctx := b.Context()

	for _, n := range []int{1, 8} {
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{}}}
		for i := range n {
			req.ContainerRequests[0].DevicesIds = append(req.ContainerRequests[0].DevicesIds, gpus[i].UUID)
		}
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			if _, err := c.Allocate(ctx, req, grpc.WaitForReady(true)); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Allocate(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// serveOnSocket serves r as nvidia.com/gpu on a unix socket until the
// benchmark ends, and returns the server and a client of it, as the
// kubelet dials it.
func serveOnSocket(b *testing.B, r *Resource) (*deviceplugin.Server, pluginapi.DevicePluginClient) {
	b.Helper()
	s, err := deviceplugin.New(deviceplugin.Options{ResourceName: resname.GPU, SocketDir: b.TempDir(), Backend: r})
	if err != nil {
		b.Fatal(err)
	}
	s.SetDevices(r.Devices())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	conn, err := grpc.NewClient("passthrough:///"+s.SocketPath(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return s, pluginapi.NewDevicePluginClient(conn)
}

// BenchmarkAllocateBackend is the plugin's own share of Allocate, without
// gRPC and socket costs: the resource's answer and its translation into
// the device-plugin message.
func BenchmarkAllocateBackend(b *testing.B) {
	gpus, topo := eightGPUs()
	r, err := New(gpus, topo, Options{DevRoot: devRoot(b, "nvidiactl", "nvidia-uvm")})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 8} {
		ids := make([]string, n)
		for i := range n {
			ids[i] = gpus[n-1-i].UUID
		}
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				a, err := r.Allocate(ids)
				if err != nil {
					b.Fatal(err)
				}
				_ = deviceplugin.Response(a)
			}
		})
	}
}

package deviceplugin

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// BenchmarkListAndWatchFanOut measures one health change reaching every
// open ListAndWatch stream: the time from SetHealth until the last
// stream has received the new list.
func BenchmarkListAndWatchFanOut(b *testing.B) {
	for _, streams := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			dir := b.TempDir()
			s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: dir, Backend: recordingBackend{}})
			if err != nil {
				b.Fatal(err)
			}
			devs := make([]device.Device, 8)
			for i := range devs {
				devs[i] = device.Device{ID: fmt.Sprintf("GPU-%d", i), NUMANode: i / 4, Healthy: true}
			}
			s.SetDevices(devs)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { s.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			c := dial(b, s.SocketPath())
			clients := make([]pluginapi.DevicePlugin_ListAndWatchClient, streams)
			for i := range clients {
				clients[i] = listAndWatch(b, c)
				if _, err := clients[i].Recv(); err != nil {
					b.Fatal(err)
				}
			}
			// Each round flips GPU-0 and waits until every stream saw the
			// flip; coalescing never hides the last state.
			healthy := true
			var wg sync.WaitGroup
			b.ReportAllocs()
			for b.Loop() {
				healthy = !healthy
				want := pluginapi.Unhealthy
				if healthy {
					want = pluginapi.Healthy
				}
				s.SetHealth("GPU-0", healthy, "bench")
				for _, st := range clients {
					wg.Go(func() {
						for {
							resp, err := st.Recv()
							if err != nil {
								b.Error(err)
								return
							}
							if resp.Devices[0].Health == want {
								return
							}
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
		})
	}
}

// BenchmarkAllocate is one Allocate round trip as the kubelet makes it
// (grpc-go's client, one call at a time), with a backend that answers at
// once: the cost of the API layer alone.
func BenchmarkAllocate(b *testing.B) {
	for _, size := range []int{1, 4} {
		b.Run(fmt.Sprintf("devices=%d", size), func(b *testing.B) {
			s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: b.TempDir(), Backend: recordingBackend{}})
			if err != nil {
				b.Fatal(err)
			}
			devs := make([]device.Device, 8)
			ids := make([]string, size)
			for i := range devs {
				devs[i] = device.Device{ID: fmt.Sprintf("GPU-%d", i), NUMANode: i / 4, Healthy: true}
			}
			for i := range ids {
				ids[i] = devs[i].ID
			}
			s.SetDevices(devs)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { s.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			c := dial(b, s.SocketPath())
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
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

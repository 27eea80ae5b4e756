package gpu

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// scaleNodes are the shapes the issue sets targets for: 8 GPUs × 48
// replicas (384 devices), and 16 GPUs × 7 MIG devices (112).
func scaleNodes() map[string][]Unit {
	gpus, _ := eightGPUs()
	replicas := WholeGPUs(gpus)
	for i := range replicas {
		replicas[i].Replicas = 48
	}
	var migs []Unit
	for i := range 16 {
		g := nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08d", i), Minor: i, NUMANode: i / 8, MIGEnabled: true}
		for k := range 7 {
			g.MIG = append(g.MIG, nvml.MIGDevice{UUID: fmt.Sprintf("MIG-%02d-%d", i, k), Index: k, GPUInstance: 7 + k, Profile: "1g.10gb", CapMinors: []int{100*i + 2*k, 100*i + 2*k + 1}})
		}
		for k := range g.MIG {
			migs = append(migs, Unit{GPU: g, Pos: i, MIG: &g.MIG[k]})
		}
	}
	return map[string][]Unit{"replicas=8x48": replicas, "mig=16x7": migs}
}

func scaleTopology(n int) nvml.Topology {
	topo := nvml.Topology{Links: make([][]nvml.Link, n)}
	for i := range topo.Links {
		topo.Links[i] = make([]nvml.Link, n)
		for j := range topo.Links[i] {
			level := nvml.LinkCrossCPU
			if i/8 == j/8 {
				level = nvml.LinkSameNUMA
			}
			topo.Links[i][j] = nvml.Link{NVLinks: 18, PCIe: level}
		}
	}
	return topo
}

// p50 runs f b.N times and reports the median as p50-ns: a GC pause or a
// scheduler hiccup moves the mean, not the median.
func p50(b *testing.B, f func()) {
	b.Helper()
	f() // warm: connection, first-use allocations
	var d []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		f()
		d = append(d, time.Since(t0))
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkScale measures, through the plugin's gRPC server on a unix
// socket as the kubelet calls it: an empty RPC (GetDevicePluginOptions,
// the floor), Allocate of one device, GetPreferredAllocation of one and
// of four out of every device, and one unit's health change reaching a
// ListAndWatch stream as the full device list.
func BenchmarkScale(b *testing.B) {
	for name, units := range scaleNodes() {
		b.Run(name, func(b *testing.B) {
			r, err := NewUnits(units, scaleTopology(16), Options{DevRoot: devRoot(b, "nvidiactl", "nvidia-uvm")})
			if err != nil {
				b.Fatal(err)
			}
			s, c := serveOnSocket(b, r)
			ctx := b.Context()
			if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
				b.Fatal(err)
			}
			var all []string
			for _, d := range r.Devices() {
				all = append(all, d.ID)
			}
			must := func(_ any, err error) {
				if err != nil {
					b.Fatal(err)
				}
			}
			b.Run("rpc=empty", func(b *testing.B) {
				p50(b, func() { must(c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})) })
			})
			b.Run("rpc=allocate", func(b *testing.B) {
				req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: all[len(all)/2 : len(all)/2+1]}}}
				p50(b, func() { must(c.Allocate(ctx, req)) })
			})
			for _, size := range []int{1, 4} {
				b.Run(fmt.Sprintf("rpc=preferred/size=%d", size), func(b *testing.B) {
					req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: all, AllocationSize: int32(size)}}}
					p50(b, func() { must(c.GetPreferredAllocation(ctx, req)) })
				})
			}
			b.Run("listandwatch=send", func(b *testing.B) {
				st, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
				if err != nil {
					b.Fatal(err)
				}
				first, err := st.Recv()
				if err != nil {
					b.Fatal(err)
				}
				unit := units[0].UUID()
				ids := r.DeviceIDs(unit)
				// Start from the state an earlier run (-count) left.
				i := slices.IndexFunc(first.Devices, func(d *pluginapi.Device) bool { return d.ID == ids[len(ids)-1] })
				healthy := first.Devices[i].Health == pluginapi.Healthy
				p50(b, func() {
					healthy = !healthy
					s.SetHealthOf(ids, healthy, "bench")
					want := pluginapi.Healthy
					if !healthy {
						want = pluginapi.Unhealthy
					}
					for {
						resp, err := st.Recv()
						if err != nil {
							b.Fatal(err)
						}
						if len(resp.Devices) != len(all) {
							b.Fatalf("sent %d devices, want %d", len(resp.Devices), len(all))
						}
						i := slices.IndexFunc(resp.Devices, func(d *pluginapi.Device) bool { return d.ID == ids[len(ids)-1] })
						if i >= 0 && resp.Devices[i].Health == want {
							return
						}
					}
				})
			})
		})
	}
}

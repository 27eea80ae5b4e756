package allocator_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
)

// BenchmarkChoose times one preferred-allocation answer with every device
// available. Targets (issue 7): under 50µs for 8 GPUs at any size, under
// 1ms for 16, under 5ms for 128 devices.
func BenchmarkChoose(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	random16 := newTopology("random-16", make([]int, 16), func(i, j int) int { return rng.IntN(100) })
	for i := range random16.numa {
		random16.numa[i] = i % 2
	}
	random16.g = allocator.NewGraph(random16.ids, random16.numa, func(i, j int) int { return random16.w[i][j] })
	random128 := randomTopology(rng, 128)
	random128.name = "random-128"

	cases := []struct {
		tp    topology
		sizes []int
	}{
		{dgxH100(), []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{pcie4(), []int{1, 2, 3, 4}},
		{hgx16(), []int{1, 2, 3, 4, 5, 6, 7, 8, 12, 16}},
		{random16, []int{2, 4, 6, 8, 10}},
		{replicas128(), []int{1, 2, 8, 16, 32, 64, 96, 127}},
		{random128, []int{2, 8, 32, 64, 96}},
	}
	for _, c := range cases {
		for _, size := range c.sizes {
			b.Run(fmt.Sprintf("%s/size=%d", c.tp.name, size), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.tp.g.Choose(c.tp.ids, nil, size); err != nil {
						b.Fatal(err)
					}
				}
				if len(c.tp.ids) <= allocator.ExactLimit {
					// Branch-and-bound nodes walked, of the 2^n a full walk visits.
					v, err := allocator.Visits(c.tp.g, c.tp.ids, nil, size)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(v), "nodes/op")
				}
			})
		}
	}
}

// BenchmarkChooseFragmented: half of hgx-16 already taken, scattered; and
// a quarter of replicas-128 (the weights are then copied per request).
func BenchmarkChooseFragmented(b *testing.B) {
	rep := replicas128()
	repAvail := rep.names(rand.New(rand.NewPCG(3, 4)).Perm(128)[:96])
	for _, size := range []int{1, 8, 32, 64} {
		b.Run(fmt.Sprintf("replicas-128-96/size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rep.g.Choose(repAvail, nil, size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	tp := hgx16()
	avail := tp.names([]int{0, 3, 4, 6, 7, 9, 10, 13})
	for _, size := range []int{1, 2, 4, 6} {
		b.Run(fmt.Sprintf("hgx-16-half/size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tp.g.Choose(avail, nil, size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package allocator_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// topology is a graph with the facts it was built from, so the tests can
// score sets without the allocator's help.
type topology struct {
	name string
	ids  []string
	numa []int
	w    [][]int
	g    *allocator.Graph
}

func newTopology(name string, numa []int, weight func(i, j int) int) topology {
	n := len(numa)
	t := topology{name: name, numa: numa, ids: make([]string, n), w: make([][]int, n)}
	for i := range n {
		t.ids[i] = fmt.Sprintf("dev-%03d", i)
		t.w[i] = make([]int, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			t.w[i][j] = weight(i, j)
			t.w[j][i] = t.w[i][j]
		}
	}
	t.g = allocator.NewGraph(t.ids, numa, func(i, j int) int { return t.w[i][j] })
	return t
}

// fromNVML builds the topology the way the plugin does, through
// gpu.NewGraph and gpu.LinkWeight.
func fromNVML(name string, numa []int, link func(i, j int) nvml.Link) topology {
	n := len(numa)
	gpus := make([]nvml.GPU, n)
	topo := nvml.Topology{Links: make([][]nvml.Link, n)}
	for i := range n {
		gpus[i] = nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%03d", i), NUMANode: numa[i]}
		topo.Links[i] = make([]nvml.Link, n)
		for j := range n {
			if i != j {
				topo.Links[i][j] = link(min(i, j), max(i, j))
			}
		}
	}
	t := newTopology(name, numa, func(i, j int) int { return gpu.LinkWeight(topo.Between(i, j)) })
	for i := range n {
		t.ids[i] = gpus[i].UUID
	}
	t.g = gpu.NewGraph(gpus, topo)
	return t
}

// dgxH100 is e2e/profiles/dgx-h100: eight GPUs, all pairs over NVSwitch
// (18 links), 0-3 on NUMA node 0 and 4-7 on node 1, each GPU behind its
// own PCIe switch.
func dgxH100() topology {
	return fromNVML("dgx-h100", []int{0, 0, 0, 0, 1, 1, 1, 1}, func(i, j int) nvml.Link {
		l := nvml.Link{NVLinks: 18, PCIe: nvml.LinkCrossCPU}
		if i/4 == j/4 {
			l.PCIe = nvml.LinkSameNUMA
		}
		return l
	})
}

// pcie4 is e2e/profiles/pcie-4gpu: no NVLink, 0-1 behind one PCIe
// switch on node 0, 2-3 behind another on node 1.
func pcie4() topology {
	return fromNVML("pcie-4gpu", []int{0, 0, 1, 1}, func(i, j int) nvml.Link {
		if i/2 == j/2 {
			return nvml.Link{PCIe: nvml.LinkSingleSwitch}
		}
		return nvml.Link{PCIe: nvml.LinkCrossCPU}
	})
}

// hgx16 is e2e/profiles/hgx-16: two 8-GPU NVSwitch islands, one per NUMA
// node, GPUs in pairs behind one PCIe switch.
func hgx16() topology {
	numa := make([]int, 16)
	for i := range numa {
		numa[i] = i / 8
	}
	return fromNVML("hgx-16", numa, hgx16Link)
}

func hgx16Link(i, j int) nvml.Link {
	switch {
	case i/2 == j/2:
		return nvml.Link{NVLinks: 18, PCIe: nvml.LinkSingleSwitch}
	case i/8 == j/8:
		return nvml.Link{NVLinks: 18, PCIe: nvml.LinkSameNUMA}
	}
	return nvml.Link{PCIe: nvml.LinkCrossCPU}
}

// replicas128 is hgx-16 with every GPU shared eight ways (time-slicing):
// 128 devices; two replicas of one GPU are linked as a GPU is to itself.
func replicas128() topology {
	numa := make([]int, 128)
	for i := range numa {
		numa[i] = i / 64
	}
	return newTopology("replicas-128", numa, func(i, j int) int {
		if i/8 == j/8 {
			return gpu.LinkWeight(nvml.Link{PCIe: nvml.LinkSameBoard})
		}
		return gpu.LinkWeight(hgx16Link(i/8, j/8))
	})
}

// randomTopology draws a graph of n devices: weights from a few levels
// (many ties) or uniformly, NUMA nodes from up to four, some unknown.
func randomTopology(rng *rand.Rand, n int) topology {
	nodes := 1 + rng.IntN(4)
	numa := make([]int, n)
	for i := range numa {
		numa[i] = rng.IntN(nodes)
		if rng.IntN(10) == 0 {
			numa[i] = -1
		}
	}
	levels := []int{0, 1, 11, 21, 31, 41, 51, 1000, 2011, 12011, 18041}
	mode := rng.IntN(3)
	return newTopology(fmt.Sprintf("random-%d", n), numa, func(i, j int) int {
		switch mode {
		case 0:
			return levels[rng.IntN(len(levels))]
		case 1:
			return rng.IntN(100)
		}
		// Islands by NUMA node, with noise.
		w := 1 + rng.IntN(3)
		if numa[i] == numa[j] && numa[i] >= 0 {
			w += 1000 * (1 + rng.IntN(2))
		}
		return w
	})
}

// reference scores set (indices) out of avail without the allocator.
func (t topology) reference(avail, set []int) allocator.Score {
	var s allocator.Score
	in := map[int]bool{}
	nodes := map[int]bool{}
	for k, a := range set {
		in[a] = true
		if t.numa[a] < 0 {
			s.NUMANodes++
		} else if !nodes[t.numa[a]] {
			nodes[t.numa[a]] = true
			s.NUMANodes++
		}
		for _, b := range set[:k] {
			s.Link += int64(t.w[a][b])
			if t.numa[a] >= 0 && t.numa[a] == t.numa[b] {
				s.SameNUMAPairs++
			}
		}
	}
	for k, a := range avail {
		for _, b := range avail[:k] {
			if !in[a] && !in[b] {
				s.Remaining += int64(t.w[a][b])
			}
		}
	}
	return s
}

// brute tries every set: the best score, and of those the first in index
// order (the allocator's tie rule).
func (t topology) brute(avail, must []int, size int) ([]int, allocator.Score) {
	var free []int
	for _, a := range slices.Sorted(slices.Values(avail)) {
		if !slices.Contains(must, a) {
			free = append(free, a)
		}
	}
	var best []int
	var bestScore allocator.Score
	pick := make([]int, 0, size)
	var walk func(from int)
	walk = func(from int) {
		if len(pick) == size-len(must) {
			set := slices.Sorted(slices.Values(append(slices.Clone(must), pick...)))
			if s := t.reference(avail, set); best == nil || s.Compare(bestScore) > 0 {
				best, bestScore = set, s
			}
			return
		}
		for k := from; k <= len(free)-(size-len(must)-len(pick)); k++ {
			pick = append(pick, free[k])
			walk(k + 1)
			pick = pick[:len(pick)-1]
		}
	}
	walk(0)
	return best, bestScore
}

func (t topology) names(idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = t.ids[i]
	}
	return out
}

func (t topology) indices(ids []string) []int {
	out := make([]int, len(ids))
	for k, id := range ids {
		out[k] = slices.Index(t.ids, id)
	}
	return out
}

// request draws an available set, must-includes and a size.
func randomRequest(rng *rand.Rand, n int) (avail, must []int, size int) {
	avail = rng.Perm(n)[:1+rng.IntN(n)]
	size = 1 + rng.IntN(len(avail))
	must = slices.Clone(avail[:rng.IntN(min(size, 3)+1)])
	rng.Shuffle(len(avail), func(i, j int) { avail[i], avail[j] = avail[j], avail[i] })
	return avail, must, size
}

// check asserts the constraints on an answer and returns it as indices.
func check(t *testing.T, tp topology, avail, must []int, size int, c allocator.Choice) []int {
	t.Helper()
	got := tp.indices(c.IDs)
	if len(got) != size {
		t.Fatalf("%s: got %d devices %v, want %d", tp.name, len(got), c.IDs, size)
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != size {
		t.Fatalf("%s: answer %v is not distinct devices in graph order", tp.name, c.IDs)
	}
	for _, a := range got {
		if !slices.Contains(avail, a) {
			t.Fatalf("%s: %s is not available", tp.name, tp.ids[a])
		}
	}
	for _, m := range must {
		if !slices.Contains(got, m) {
			t.Fatalf("%s: answer %v lacks must-include %s", tp.name, c.IDs, tp.ids[m])
		}
	}
	if ref := tp.reference(slices.Sorted(slices.Values(avail)), got); ref != c.Score {
		t.Fatalf("%s: reported score %+v, recomputed %+v", tp.name, c.Score, ref)
	}
	return got
}

// exactCase asserts that the answer equals the brute-force optimum,
// including which of the tied sets.
func exactCase(t *testing.T, tp topology, avail, must []int, size int) {
	t.Helper()
	c, err := tp.g.Choose(tp.names(avail), tp.names(must), size)
	if err != nil {
		t.Fatalf("%s: Choose(%v, %v, %d): %v", tp.name, avail, must, size, err)
	}
	got := check(t, tp, avail, must, size, c)
	want, wantScore := tp.brute(avail, must, size)
	if !c.Exact || c.Score != wantScore || !slices.Equal(got, want) {
		t.Fatalf("%s: Choose(avail %v, must %v, size %d) = %v %+v (exact %v), brute force %v %+v",
			tp.name, avail, must, size, got, c.Score, c.Exact, want, wantScore)
	}
}

func TestProfilesMatchBruteForce(t *testing.T) {
	for _, tp := range []topology{dgxH100(), pcie4(), hgx16()} {
		t.Run(tp.name, func(t *testing.T) {
			n := len(tp.ids)
			all := make([]int, n)
			for i := range all {
				all[i] = i
			}
			rng := rand.New(rand.NewPCG(7, uint64(n)))
			for size := 1; size <= n; size++ {
				exactCase(t, tp, all, nil, size)
				for range 12 {
					avail, must, sz := randomRequest(rng, n)
					exactCase(t, tp, avail, must, sz)
				}
			}
		})
	}
}

func TestRandomTopologiesMatchBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	cases := 400
	if testing.Short() {
		cases = 100
	}
	for range cases {
		n := 1 + rng.IntN(16)
		tp := randomTopology(rng, n)
		avail, must, size := randomRequest(rng, n)
		exactCase(t, tp, avail, must, size)
	}
}

// Beyond 16 devices (up to 64) a request with few candidate sets is still
// answered exactly.
func TestFewCandidateSetsStayExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for range 40 {
		n := 17 + rng.IntN(40)
		tp := randomTopology(rng, n)
		all := rng.Perm(n)
		size := 1 + rng.IntN(2)
		if rng.IntN(2) == 0 {
			size = n - size // few sets to leave out
		}
		exactCase(t, tp, all, nil, size)
	}
}

func TestHeuristicBeatsNUMAGrouping(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 17))
	optimal, compared := 0, 0
	var worst float64 = 1
	for range 150 {
		n := 17 + rng.IntN(60)
		tp := randomTopology(rng, n)
		if rng.IntN(4) == 0 {
			tp = replicas128()
			n = len(tp.ids)
		}
		avail, must, size := randomRequest(rng, n)
		c, err := tp.g.Choose(tp.names(avail), tp.names(must), size)
		if err != nil {
			t.Fatal(err)
		}
		got := check(t, tp, avail, must, size, c)
		base, err := allocator.NUMAGrouping(tp.g, tp.names(avail), tp.names(must), size)
		if err != nil {
			t.Fatal(err)
		}
		if c.Score.Compare(base) < 0 {
			t.Fatalf("%s: answer %v scores %+v, below NUMA grouping %+v", tp.name, got, c.Score, base)
		}
		if binomial(len(avail)-len(must), size-len(must)) <= 50_000 {
			_, best := tp.brute(avail, must, size)
			if c.Score.Compare(best) > 0 || (c.Exact && c.Score != best) {
				t.Fatalf("%s: answer %+v (exact %v), brute-force optimum %+v", tp.name, c.Score, c.Exact, best)
			}
			compared++
			if c.Score == best {
				optimal++
			} else if best.Link > 0 {
				worst = min(worst, float64(c.Score.Link)/float64(best.Link))
			}
		}
	}
	t.Logf("heuristic optimal in %d of %d cases checked by brute force; worst link ratio %.3f", optimal, compared, worst)
}

func binomial(n, k int) int {
	c := 1
	for i := 1; i <= k; i++ {
		c = c * (n - k + i) / i
		if c > 1<<40 {
			return c
		}
	}
	return c
}

// Adding one device, or leaving one out, is exact at any scale.
func TestOneInOrOneOutIsExact(t *testing.T) {
	tp := replicas128()
	rng := rand.New(rand.NewPCG(9, 9))
	for range 10 {
		avail := rng.Perm(128)[:70+rng.IntN(58)]
		must := avail[:rng.IntN(3)]
		for _, size := range []int{len(must) + 1, len(avail) - 1} {
			c, err := tp.g.Choose(tp.names(avail), tp.names(must), size)
			if err != nil {
				t.Fatal(err)
			}
			check(t, tp, avail, must, size, c)
			if _, best := tp.brute(avail, must, size); !c.Exact || c.Score != best {
				t.Fatalf("size %d of %d: %+v (exact %v), brute force %+v", size, len(avail), c.Score, c.Exact, best)
			}
		}
	}
}

func TestReplicasSpreadOverLinkedGPUs(t *testing.T) {
	tp := replicas128()
	c, err := tp.g.Choose(tp.ids, nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	got := check(t, tp, tp.indices(tp.ids), nil, 8, c)
	// Eight replicas on eight NVLinked GPUs beat eight on one GPU.
	gpus, nodes := map[int]bool{}, map[int]bool{}
	for _, d := range got {
		gpus[d/8] = true
		nodes[tp.numa[d]] = true
	}
	if len(gpus) != 8 || len(nodes) != 1 {
		t.Errorf("8 replicas landed on GPUs %v, NUMA nodes %v; want 8 GPUs of one island", gpus, nodes)
	}
}

// A graph is shared by every kubelet call; answers must not interfere.
func TestConcurrentChoose(t *testing.T) {
	tp := hgx16()
	want, err := tp.g.Choose(tp.ids, nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	for range 8 {
		go func() {
			for range 50 {
				got, err := tp.g.Choose(tp.ids, nil, 4)
				if err == nil && !slices.Equal(got.IDs, want.IDs) {
					err = fmt.Errorf("got %v, want %v", got.IDs, want.IDs)
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

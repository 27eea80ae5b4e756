package allocator

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrBadRequest marks a request that no choice can satisfy.
var ErrBadRequest = errors.New("bad allocation request")

// Graph holds the devices of one resource and how well each pair is
// connected. It is built once, when the devices are discovered (and again
// when they change), and is read-only afterwards: any number of goroutines
// may call its methods at once.
type Graph struct {
	ids   []string
	index map[string]int
	numa  []int
	// node is numa compacted: known nodes keep one ID each, and every
	// device whose node is unknown gets an ID of its own.
	node   []int
	nodes  int
	weight []int64 // len(ids)², row-major
}

// NewGraph builds a graph. numa[i] is device i's NUMA node (-1: unknown);
// weight(i, j) is the link quality of devices i and j, higher is better,
// and is called once per pair i < j. Weights are summed, so they should be
// on a scale where sums mean something (see the package doc).
func NewGraph(ids []string, numa []int, weight func(i, j int) int) *Graph {
	n := len(ids)
	g := &Graph{
		ids:    ids,
		index:  make(map[string]int, n),
		numa:   numa,
		node:   make([]int, n),
		weight: make([]int64, n*n),
	}
	known := map[int]int{}
	for i, id := range ids {
		g.index[id] = i
		nu := -1
		if i < len(numa) {
			nu = numa[i]
		}
		if nu < 0 {
			g.node[i] = g.nodes
			g.nodes++
			continue
		}
		k, ok := known[nu]
		if !ok {
			k = g.nodes
			known[nu] = k
			g.nodes++
		}
		g.node[i] = k
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			w := int64(weight(i, j))
			g.weight[i*n+j], g.weight[j*n+i] = w, w
		}
	}
	return g
}

// Len is the number of devices in the graph.
func (g *Graph) Len() int { return len(g.ids) }

// Score is what Choose maximises, compared field by field in this order:
// the first field that differs decides. See the package doc for why.
type Score struct {
	// Link is the sum of the pairwise link weights inside the set.
	Link int64 `json:"link"`
	// NUMANodes is the number of distinct NUMA nodes the set spans (fewer
	// is better); a device whose node is unknown counts as a node of its own.
	NUMANodes int `json:"numaNodes"`
	// SameNUMAPairs is the number of pairs on one known NUMA node (more is
	// better).
	SameNUMAPairs int `json:"sameNUMAPairs"`
	// Remaining is the sum of the pairwise link weights among the
	// available devices left over (more is better): what the next request
	// can still get.
	Remaining int64 `json:"remaining"`
}

// Compare returns a positive number when s is better than o, a negative
// one when it is worse and 0 when they tie.
func (s Score) Compare(o Score) int {
	switch {
	case s.Link != o.Link:
		return cmpInt64(s.Link, o.Link)
	case s.NUMANodes != o.NUMANodes:
		return o.NUMANodes - s.NUMANodes
	case s.SameNUMAPairs != o.SameNUMAPairs:
		return s.SameNUMAPairs - o.SameNUMAPairs
	default:
		return cmpInt64(s.Remaining, o.Remaining)
	}
}

func cmpInt64(a, b int64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}

// Choice is an answer with what it scored.
type Choice struct {
	// IDs are the chosen devices in graph order.
	IDs   []string
	Score Score
	// Exact is true when no other set scores better: the branch-and-bound
	// search ran to the end (or the request left only one way to fill it).
	// False means the bounded heuristic answered.
	Exact bool
}

// Preferred returns size devices from available that include mustInclude,
// in graph order. It is Choose without the score.
func (g *Graph) Preferred(available, mustInclude []string, size int) ([]string, error) {
	c, err := g.Choose(available, mustInclude, size)
	return c.IDs, err
}

// Choose returns the best set of size devices from available that contains
// mustInclude, by Score. Up to ExactLimit available devices (and beyond,
// while the number of candidate sets stays small) the answer is optimal,
// and of equally scored sets the one first in graph order; past that a
// heuristic answers within HeuristicBudget. See the package doc.
func (g *Graph) Choose(available, mustInclude []string, size int) (Choice, error) {
	r, err := g.request(available, mustInclude, size)
	if err != nil {
		return Choice{}, err
	}
	set, score, exact := r.solve()
	return r.choice(set, score, exact), nil
}

// Score scores chosen as a choice out of available, as Choose would.
func (g *Graph) Score(available, chosen []string) (Score, error) {
	r, err := g.request(available, chosen, len(chosen))
	if err != nil {
		return Score{}, err
	}
	set := make([]int, 0, len(chosen))
	for i, m := range r.must {
		if m {
			set = append(set, i)
		}
	}
	return r.score(set), nil
}

// request is one question, in local indices 0..n-1 that follow graph order.
type request struct {
	g     *Graph
	pos   []int // graph index of each local device, ascending
	n     int
	size  int
	must  []bool
	nMust int
	w     []int64 // n×n local weights, read-only (may be the graph's)
	deg   []int64 // deg[i]: sum of i's weights to every other available device
	node  []int   // local NUMA node IDs, 0..nodes-1
	nodes int
	linkA int64 // sum of all pairwise weights among the available devices
}

func (g *Graph) request(available, mustInclude []string, size int) (*request, error) {
	N, n := len(g.ids), len(available)
	// One allocation per element type: this runs on every kubelet call.
	bools := make([]bool, N+n)
	ints := make([]int, 2*n+g.nodes)
	seen := bools[:N]
	pos := ints[:0:n]
	for _, id := range available {
		i, ok := g.index[id]
		if !ok {
			return nil, fmt.Errorf("%w: available device %q is unknown", ErrBadRequest, id)
		}
		if seen[i] {
			return nil, fmt.Errorf("%w: available device %q is listed twice", ErrBadRequest, id)
		}
		seen[i] = true
		pos = append(pos, i)
	}
	switch {
	case size <= 0:
		return nil, fmt.Errorf("%w: size %d must be positive", ErrBadRequest, size)
	case size > n:
		return nil, fmt.Errorf("%w: size %d exceeds the %d available devices", ErrBadRequest, size, n)
	case len(mustInclude) > size:
		return nil, fmt.Errorf("%w: %d must-include devices exceed size %d", ErrBadRequest, len(mustInclude), size)
	}
	slices.Sort(pos)
	m := n
	if n != N {
		m += n * n // a local copy of the weights
	}
	int64s := make([]int64, m)
	r := &request{g: g, pos: pos, n: n, size: size, must: bools[N:], node: ints[n : 2*n], deg: int64s[:n]}
	for _, id := range mustInclude {
		i, ok := g.index[id]
		if !ok {
			return nil, fmt.Errorf("%w: must-include device %q is unknown", ErrBadRequest, id)
		}
		l, ok := slices.BinarySearch(pos, i)
		if !ok {
			return nil, fmt.Errorf("%w: must-include device %q is not available", ErrBadRequest, id)
		}
		if r.must[l] {
			return nil, fmt.Errorf("%w: must-include device %q is listed twice", ErrBadRequest, id)
		}
		r.must[l] = true
		r.nMust++
	}
	local := ints[2*n:]
	for i := range local {
		local[i] = -1
	}
	if n == N {
		// Everything is available: pos is the identity, share the weights.
		r.w = g.weight
	} else {
		r.w = int64s[n:]
		for a, gi := range pos {
			row, out := g.weight[gi*N:(gi+1)*N], r.w[a*n:(a+1)*n]
			for b, gj := range pos {
				out[b] = row[gj]
			}
		}
	}
	for a, gi := range pos {
		gn := g.node[gi]
		if local[gn] < 0 {
			local[gn] = r.nodes
			r.nodes++
		}
		r.node[a] = local[gn]
		var d int64
		for _, w := range r.w[a*n : (a+1)*n] {
			d += w
		}
		r.deg[a] = d
		r.linkA += d
	}
	r.linkA /= 2
	return r, nil
}

// score scores a set of local indices.
func (r *request) score(set []int) Score {
	var s Score
	var deg int64
	counted := make([]bool, r.nodes)
	for k, a := range set {
		deg += r.deg[a]
		if !counted[r.node[a]] {
			counted[r.node[a]] = true
			s.NUMANodes++
		}
		for _, b := range set[:k] {
			s.Link += r.w[a*r.n+b]
			if r.node[a] == r.node[b] {
				s.SameNUMAPairs++
			}
		}
	}
	s.Remaining = r.linkA + s.Link - deg
	return s
}

func (r *request) choice(set []int, score Score, exact bool) Choice {
	ids := make([]string, len(set))
	for k, a := range set {
		ids[k] = r.g.ids[r.pos[a]]
	}
	return Choice{IDs: ids, Score: score, Exact: exact}
}

// Search limits.
const (
	// ExactLimit is the number of available devices up to which every
	// answer is proven optimal, whatever the size.
	ExactLimit = 16
	// exactSets: past ExactLimit (and up to 64 devices, one bitmask), a
	// request with at most this many candidate sets is still solved exactly.
	exactSets = 1 << 13
	// HeuristicBudget bounds the heuristic's local search in wall-clock
	// time; an iteration cap (heuristicEvals) normally ends it first.
	HeuristicBudget = 3 * time.Millisecond
)

// solve returns the chosen set (local indices, ascending), its score, and
// whether it is proven optimal.
func (r *request) solve() ([]int, Score, bool) {
	free := r.n - r.nMust
	need := r.size - r.nMust
	if need == 0 || need == free {
		set := make([]int, 0, r.size)
		for i := range r.n {
			if r.must[i] || need > 0 {
				set = append(set, i)
			}
		}
		return set, r.score(set), true
	}
	if need == 1 {
		set, score := r.bestOne()
		return set, score, true
	}
	if r.n <= ExactLimit || (r.n <= 64 && binomialAtMost(free, need, exactSets)) {
		seed, seedScore := r.heuristic(time.Time{}, false)
		set, score := r.exact(seed, seedScore)
		return set, score, true
	}
	// With one device to leave out, the local search's first round weighs
	// every candidate set.
	set, score := r.heuristic(time.Now().Add(HeuristicBudget), true)
	return set, score, free-need == 1
}

// binomialAtMost reports whether n choose k <= limit.
func binomialAtMost(n, k, limit int) bool {
	k = min(k, n-k)
	c := 1
	for i := 1; i <= k; i++ {
		c = c * (n - k + i) / i
		if c > limit {
			return false
		}
	}
	return true
}

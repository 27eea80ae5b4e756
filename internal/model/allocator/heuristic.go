package allocator

import (
	"slices"
	"time"
)

// heuristicEvals caps the swaps the local search weighs per request, so
// its cost does not depend on the clock: 2^18 is about a millisecond.
const heuristicEvals = 1 << 18

// state is a set under construction, with what adding, removing or
// swapping a device changes kept up to date: each step costs O(n).
type state struct {
	r     *request
	in    []bool
	gain  []int64 // gain[x]: sum of x's weights to the members
	cnt   []int   // members per local NUMA node
	size  int
	link  int64
	same  int
	nodes int
	deg   int64
}

func newState(r *request) *state {
	s := &state{r: r, in: make([]bool, r.n), gain: make([]int64, r.n), cnt: make([]int, r.nodes)}
	s.reset()
	return s
}

// reset empties the set down to the must-include devices.
func (s *state) reset() {
	clear(s.in)
	clear(s.gain)
	clear(s.cnt)
	s.size, s.link, s.same, s.nodes, s.deg = 0, 0, 0, 0, 0
	for x, m := range s.r.must {
		if m {
			s.add(x)
		}
	}
}

// load makes the set in.
func (s *state) load(in []bool) {
	s.reset()
	for x, m := range in {
		if m && !s.r.must[x] {
			s.add(x)
		}
	}
}

func (s *state) add(x int) {
	r := s.r
	s.in[x] = true
	s.size++
	s.link += s.gain[x]
	k := r.node[x]
	if s.cnt[k] == 0 {
		s.nodes++
	}
	s.same += s.cnt[k]
	s.cnt[k]++
	s.deg += r.deg[x]
	for y, w := range r.w[x*r.n : (x+1)*r.n] {
		s.gain[y] += w
	}
}

func (s *state) remove(x int) {
	r := s.r
	s.in[x] = false
	s.size--
	for y, w := range r.w[x*r.n : (x+1)*r.n] {
		s.gain[y] -= w
	}
	s.link -= s.gain[x]
	k := r.node[x]
	s.cnt[k]--
	s.same -= s.cnt[k]
	if s.cnt[k] == 0 {
		s.nodes--
	}
	s.deg -= r.deg[x]
}

func (s *state) score() Score {
	return Score{Link: s.link, NUMANodes: s.nodes, SameNUMAPairs: s.same, Remaining: s.r.linkA + s.link - s.deg}
}

// with scores the set plus x.
func (s *state) with(x int) Score {
	r := s.r
	c := s.cnt[r.node[x]]
	nodes := s.nodes
	if c == 0 {
		nodes++
	}
	link := s.link + s.gain[x]
	return Score{Link: link, NUMANodes: nodes, SameNUMAPairs: s.same + c, Remaining: r.linkA + link - s.deg - r.deg[x]}
}

// swapped scores the set with member i replaced by x.
func (s *state) swapped(i, x int) Score {
	r := s.r
	link := s.link + s.gain[x] - s.gain[i] - r.w[i*r.n+x]
	nodes, same := s.nodes, s.same
	if ki, kx := r.node[i], r.node[x]; ki != kx {
		if s.cnt[ki] == 1 {
			nodes--
		}
		if s.cnt[kx] == 0 {
			nodes++
		}
		same += s.cnt[kx] - (s.cnt[ki] - 1)
	}
	return Score{Link: link, NUMANodes: nodes, SameNUMAPairs: same, Remaining: r.linkA + link - s.deg - r.deg[x] + r.deg[i]}
}

// fill adds the device that scores best until the set is full, from NUMA
// node group first when group >= 0, then from anywhere. Ties go to the
// device first in graph order.
func (s *state) fill(group int) {
	r := s.r
	for s.size < r.size {
		best := -1
		var bs Score
		for x := range r.n {
			if s.in[x] || (group >= 0 && r.node[x] != group) {
				continue
			}
			if sc := s.with(x); best < 0 || sc.Compare(bs) > 0 {
				best, bs = x, sc
			}
		}
		if best < 0 {
			group = -1
			continue
		}
		s.add(best)
	}
}

// improve swaps one member for one non-member, the best swap first, while
// a swap scores strictly better, the budget of evaluations lasts and the
// deadline (if any) has not passed. The first round always runs, so a set
// it returns has been compared with every set one swap away. A swap that
// loses on links is refused before its tie-breaks are worked out.
func (s *state) improve(budget *int, deadline time.Time) {
	r := s.r
	for {
		best := s.score()
		bi, bx := -1, -1
		for i := range r.n {
			if !s.in[i] || r.must[i] {
				continue
			}
			base := s.link - s.gain[i]
			row := r.w[i*r.n : (i+1)*r.n]
			for x, in := range s.in {
				if in {
					continue
				}
				if link := base + s.gain[x] - row[x]; link < best.Link {
					continue
				}
				if sc := s.swapped(i, x); sc.Compare(best) > 0 {
					best, bi, bx = sc, i, x
				}
			}
			*budget -= r.n - s.size
		}
		if bi < 0 {
			return
		}
		s.remove(bi)
		s.add(bx)
		if *budget <= 0 || (!deadline.IsZero() && time.Now().After(deadline)) {
			return
		}
	}
}

func (s *state) members() []int {
	out := make([]int, 0, s.size)
	for x, in := range s.in {
		if in {
			out = append(out, x)
		}
	}
	return out
}

// candidate is a set the heuristic found, with its score.
type candidate struct {
	in    []bool
	score Score
}

func (s *state) candidate() candidate { return candidate{in: slices.Clone(s.in), score: s.score()} }

func (c candidate) members() []int {
	out := make([]int, 0, len(c.in))
	for x, in := range c.in {
		if in {
			out = append(out, x)
		}
	}
	return out
}

// better reports whether a beats b: a higher score, or an equal one with
// the first device where they differ in a.
func better(a, b candidate) bool {
	if c := a.score.Compare(b.score); c != 0 {
		return c > 0
	}
	for x := range a.in {
		if a.in[x] != b.in[x] {
			return a.in[x]
		}
	}
	return false
}

// known reports the local NUMA nodes that are real nodes, not an unknown
// device's own.
func (r *request) known() []bool {
	k := make([]bool, r.nodes)
	for x, gi := range r.pos {
		if gi < len(r.g.numa) && r.g.numa[gi] >= 0 {
			k[r.node[x]] = true
		}
	}
	return k
}

// numaGrouping is the baseline the heuristic never falls below: for each
// NUMA node, the must-include devices plus the best-scoring devices of
// that node, spilling to any node when it runs out; the best of those.
// Without any known node it is plain greedy growth.
func (r *request) numaGrouping(s *state, known []bool) candidate {
	var best candidate
	found := false
	for k, real := range known {
		if !real {
			continue
		}
		s.reset()
		s.fill(k)
		if c := s.candidate(); !found || better(c, best) {
			best, found = c, true
		}
	}
	if !found {
		s.reset()
		s.fill(-1)
		best = s.candidate()
	}
	return best
}

// bestOne answers a request that adds one device: every candidate scored.
func (r *request) bestOne() ([]int, Score) {
	s := newState(r)
	best := -1
	var bs Score
	for x := range r.n {
		if s.in[x] {
			continue
		}
		if sc := s.with(x); best < 0 || sc.Compare(bs) > 0 {
			best, bs = x, sc
		}
	}
	s.add(best)
	return s.members(), bs
}

// heuristic builds candidate sets by NUMA grouping and by greedy growth
// from a few seeds, then (with search) improves them by swaps in order,
// best first, within heuristicEvals evaluations and before deadline
// (zero: none).
func (r *request) heuristic(deadline time.Time, search bool) ([]int, Score) {
	s := newState(r)
	known := r.known()
	cands := []candidate{r.numaGrouping(s, known)}
	s.reset()
	s.fill(-1)
	cands = append(cands, s.candidate())
	if r.nMust == 0 && search {
		// Seed with the best-connected device of each node, and of all:
		// greedy growth from nothing starts at the least connected one,
		// right for one device, a poor start for many.
		seeds := make([]int, r.nodes+1)
		for i := range seeds {
			seeds[i] = -1
		}
		for x := range r.n {
			k := r.node[x]
			if !known[k] {
				k = r.nodes
			}
			if seeds[k] < 0 || r.deg[x] > r.deg[seeds[k]] {
				seeds[k] = x
			}
		}
		top := -1
		for _, x := range seeds {
			if x >= 0 && (top < 0 || r.deg[x] > r.deg[top]) {
				top = x
			}
		}
		for k, x := range seeds {
			if x < 0 || (k == r.nodes && x != top) {
				continue
			}
			s.reset()
			s.add(x)
			s.fill(-1)
			cands = append(cands, s.candidate())
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int {
		switch {
		case better(a, b):
			return -1
		case better(b, a):
			return 1
		}
		return 0
	})
	best := cands[0]
	if search {
		budget := heuristicEvals
		for k, c := range cands {
			if k > 0 && slices.Equal(c.in, cands[k-1].in) {
				continue
			}
			s.load(c.in)
			s.improve(&budget, deadline)
			if c := s.candidate(); better(c, best) {
				best = c
			}
			if budget <= 0 || (!deadline.IsZero() && time.Now().After(deadline)) {
				break
			}
		}
	}
	return best.members(), best.score
}

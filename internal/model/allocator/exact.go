package allocator

import (
	"math/bits"
	"slices"
)

// bnb is a branch-and-bound search over the combinations of the free
// (not must-include) devices, at most 64, as bitmasks. It walks them in
// graph order, each device first taken then left, so the first set found
// with a given score is also the first in graph order; a branch is cut
// when an upper bound on every score below it cannot beat the best found.
type bnb struct {
	r    *request
	cand []int // free devices, ascending
	at   []int // at[x]: x's position in cand
	// top[x*need+q]: the sum of x's q largest weights to other free
	// devices, a bound on what x adds in links to q other picks.
	top   []int64
	need  int
	byDeg []int // free devices by ascending deg
	nmask []uint64

	gain []int64 // gain[x]: sum of x's weights to the chosen devices
	in   uint64
	link int64
	same int
	deg  int64

	best     Score
	bestIn   uint64
	fromWalk bool // best was found by the walk, not given as the seed
	buf      []int64
	visits   int
}

// exact returns the optimal set, given a good set to beat (seed).
func (r *request) exact(seed []int, seedScore Score) ([]int, Score) {
	b := r.newBnb(seed, seedScore)
	b.walk(0, b.need)
	set := make([]int, 0, r.size)
	for x := range r.n {
		if b.bestIn&(1<<x) != 0 {
			set = append(set, x)
		}
	}
	return set, b.best
}

func (r *request) newBnb(seed []int, seedScore Score) *bnb {
	n, free, need := r.n, r.n-r.nMust, r.size-r.nMust
	ints := make([]int, n+2*free)
	int64s := make([]int64, n+free*need+2*free)
	b := &bnb{
		r: r, need: need, best: seedScore,
		at: ints[:n], cand: ints[n : n : n+free], byDeg: ints[n+free:],
		gain: int64s[:n], top: int64s[n : n+free*need], nmask: make([]uint64, r.nodes),
	}
	row := int64s[n+free*need : n+free*need : n+free*need+free]
	b.buf = int64s[n+free*need+free:][:0]
	for _, x := range seed {
		b.bestIn |= 1 << x
	}
	for x := range n {
		b.nmask[r.node[x]] |= 1 << x
		if !r.must[x] {
			b.at[x] = len(b.cand)
			b.cand = append(b.cand, x)
		}
	}
	for x := range n {
		if r.must[x] {
			b.take(x)
		}
	}
	copy(b.byDeg, b.cand)
	slices.SortStableFunc(b.byDeg, func(x, y int) int { return cmpInt64(r.deg[x], r.deg[y]) })
	if need < 2 {
		return b
	}
	for k, x := range b.cand {
		// The need-1 largest weights, descending, by insertion: need is
		// usually small next to the number of candidates.
		row = row[:0]
		for _, y := range b.cand {
			if y == x {
				continue
			}
			w := r.w[x*n+y]
			if len(row) == need-1 {
				if w <= row[len(row)-1] {
					continue
				}
				row = row[:len(row)-1]
			}
			at := len(row)
			for at > 0 && row[at-1] < w {
				at--
			}
			row = slices.Insert(row, at, w)
		}
		var sum int64
		for q, w := range row {
			sum += w
			b.top[k*need+q+1] = sum
		}
	}
	return b
}

func (b *bnb) take(x int) {
	r := b.r
	b.link += b.gain[x]
	b.same += bits.OnesCount64(b.in & b.nmask[r.node[x]])
	b.deg += r.deg[x]
	b.in |= 1 << x
	for y, w := range r.w[x*r.n : (x+1)*r.n] {
		b.gain[y] += w
	}
}

func (b *bnb) drop(x int) {
	r := b.r
	for y, w := range r.w[x*r.n : (x+1)*r.n] {
		b.gain[y] -= w
	}
	b.in &^= 1 << x
	b.deg -= r.deg[x]
	b.same -= bits.OnesCount64(b.in & b.nmask[r.node[x]])
	b.link -= b.gain[x]
}

// walk decides cand[i:], with left devices still to take.
func (b *bnb) walk(i, left int) {
	b.visits++
	if left == 0 {
		b.leaf()
		return
	}
	if len(b.cand)-i < left || !b.promising(i, left) {
		return
	}
	x := b.cand[i]
	b.take(x)
	b.walk(i+1, left-1)
	b.drop(x)
	b.walk(i+1, left)
}

func (b *bnb) nodes(in uint64) int {
	n := 0
	for _, m := range b.nmask {
		if in&m != 0 {
			n++
		}
	}
	return n
}

func (b *bnb) leaf() {
	s := Score{Link: b.link, NUMANodes: b.nodes(b.in), SameNUMAPairs: b.same, Remaining: b.r.linkA + b.link - b.deg}
	if c := s.Compare(b.best); c > 0 || (c == 0 && !b.fromWalk) {
		b.best, b.bestIn, b.fromWalk = s, b.in, true
	}
}

// promising bounds every set that takes left more devices from cand[i:].
// Link: each pick x adds gain[x] to the chosen and at most top[x][left-1]
// (halved, as each pair is counted from both ends) to the other picks.
// The tie-breaks are bounded each on its own: a bound above the best may
// still hide a set that beats it, a bound below cannot.
func (b *bnb) promising(i, left int) bool {
	r := b.r
	b.buf = b.buf[:0]
	for _, x := range b.cand[i:] {
		b.buf = append(b.buf, 2*b.gain[x]+b.top[b.at[x]*b.need+left-1])
	}
	ub := 2 * b.link
	if len(b.buf) > left {
		slices.Sort(b.buf)
		for _, v := range b.buf[len(b.buf)-left:] {
			ub += v
		}
	} else {
		for _, v := range b.buf {
			ub += v
		}
	}
	ubLink := floorHalf(ub)
	switch {
	case ubLink < b.best.Link:
		return false
	case ubLink > b.best.Link:
		return true
	}

	// Link can at best tie: bound the tie-breaks.
	var rest uint64 // undecided devices
	for _, x := range b.cand[i:] {
		rest |= 1 << x
	}
	nodes, covered := 0, uint64(0)
	for _, m := range b.nmask {
		if b.in&m != 0 {
			nodes++
			covered |= m
		}
	}
	if nodes == 0 || bits.OnesCount64(rest&covered) < left {
		nodes++ // some pick must open a node
	}
	same := b.same + left*(left-1)/2
	b.buf = b.buf[:0]
	for _, x := range b.cand[i:] {
		b.buf = append(b.buf, int64(bits.OnesCount64(b.in&b.nmask[r.node[x]])))
	}
	slices.Sort(b.buf)
	for _, v := range b.buf[len(b.buf)-left:] {
		same += int(v)
	}
	deg, k := b.deg, 0
	for _, x := range b.byDeg {
		if k == left {
			break
		}
		if b.at[x] >= i {
			deg += r.deg[x]
			k++
		}
	}
	ubs := Score{Link: b.best.Link, NUMANodes: nodes, SameNUMAPairs: same, Remaining: r.linkA + b.best.Link - deg}
	c := ubs.Compare(b.best)
	return c > 0 || (c == 0 && !b.fromWalk)
}

func floorHalf(v int64) int64 {
	if v >= 0 {
		return v / 2
	}
	return -((-v + 1) / 2)
}

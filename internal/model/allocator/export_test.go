package allocator

import "time"

var zeroTime time.Time

// NUMAGrouping scores the NUMA-grouping baseline the heuristic must never
// fall below.
func NUMAGrouping(g *Graph, available, mustInclude []string, size int) (Score, error) {
	r, err := g.request(available, mustInclude, size)
	if err != nil {
		return Score{}, err
	}
	return r.numaGrouping(newState(r), r.known()).score, nil
}

// Visits counts the branch-and-bound nodes one exact answer walks.
func Visits(g *Graph, available, mustInclude []string, size int) (int, error) {
	r, err := g.request(available, mustInclude, size)
	if err != nil {
		return 0, err
	}
	seed, score := r.heuristic(zeroTime, false)
	b := r.newBnb(seed, score)
	b.walk(0, b.need)
	return b.visits, nil
}

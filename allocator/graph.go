package allocator

import (
	"errors"
	"fmt"
)

// ErrBadRequest marks a request that no choice can satisfy.
var ErrBadRequest = errors.New("bad allocation request")

// Graph holds the devices of one resource and how well each pair is
// connected. Weights are only compared, never interpreted: higher is better.
type Graph struct {
	ids    []string
	index  map[string]int
	numa   []int
	weight [][]int
}

// NewGraph builds a graph. numa[i] is device i's NUMA node (-1: unknown);
// weight(i, j) is the link quality of devices i and j and is called once
// per pair.
func NewGraph(ids []string, numa []int, weight func(i, j int) int) *Graph {
	g := &Graph{
		ids:    ids,
		index:  make(map[string]int, len(ids)),
		numa:   numa,
		weight: make([][]int, len(ids)),
	}
	for i, id := range ids {
		g.index[id] = i
		g.weight[i] = make([]int, len(ids))
	}
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			w := weight(i, j)
			g.weight[i][j], g.weight[j][i] = w, w
		}
	}
	return g
}

// indices resolves IDs, refusing unknown and repeated ones.
func (g *Graph) indices(what string, ids []string) ([]int, error) {
	out := make([]int, 0, len(ids))
	seen := make(map[int]bool, len(ids))
	for _, id := range ids {
		i, ok := g.index[id]
		if !ok {
			return nil, fmt.Errorf("%w: %s device %q is unknown", ErrBadRequest, what, id)
		}
		if seen[i] {
			return nil, fmt.Errorf("%w: %s device %q is listed twice", ErrBadRequest, what, id)
		}
		seen[i] = true
		out = append(out, i)
	}
	return out, nil
}

// Preferred returns size devices from available that include mustInclude.
//
// This is a greedy policy: it starts from mustInclude (or, with nothing
// required, from the NUMA node with the most free devices) and adds the
// device best linked to those already chosen, preferring the same NUMA
// node on ties.
func (g *Graph) Preferred(available, mustInclude []string, size int) ([]string, error) {
	avail, err := g.indices("available", available)
	if err != nil {
		return nil, err
	}
	must, err := g.indices("must-include", mustInclude)
	if err != nil {
		return nil, err
	}
	switch {
	case size <= 0:
		return nil, fmt.Errorf("%w: size %d must be positive", ErrBadRequest, size)
	case size > len(avail):
		return nil, fmt.Errorf("%w: size %d exceeds the %d available devices", ErrBadRequest, size, len(avail))
	case len(must) > size:
		return nil, fmt.Errorf("%w: %d must-include devices exceed size %d", ErrBadRequest, len(must), size)
	}
	free := make(map[int]bool, len(avail))
	for _, i := range avail {
		free[i] = true
	}
	for _, i := range must {
		if !free[i] {
			return nil, fmt.Errorf("%w: must-include device %q is not available", ErrBadRequest, g.ids[i])
		}
		delete(free, i)
	}
	chosen := must
	if len(chosen) == 0 {
		seed := g.seed(avail, size)
		chosen = append(chosen, seed)
		delete(free, seed)
	}
	for len(chosen) < size {
		best, bestScore, bestNUMA := -1, 0, 0
		for _, c := range avail {
			if !free[c] {
				continue
			}
			score, near := 0, 0
			for _, p := range chosen {
				score += g.weight[c][p]
				if g.numa[c] >= 0 && g.numa[c] == g.numa[p] {
					near++
				}
			}
			if best < 0 || score > bestScore || (score == bestScore && near > bestNUMA) {
				best, bestScore, bestNUMA = c, score, near
			}
		}
		chosen = append(chosen, best)
		delete(free, best)
	}
	out := make([]string, len(chosen))
	for k, i := range chosen {
		out[k] = g.ids[i]
	}
	return out, nil
}

// seed picks a first device on the NUMA node that fits the request most
// tightly: the fewest free devices that still hold size. Small requests
// then fill partly used nodes and leave whole nodes for large ones. When no
// node holds size, it starts on the node with the most free devices.
func (g *Graph) seed(avail []int, size int) int {
	perNode := map[int]int{}
	for _, i := range avail {
		perNode[g.numa[i]]++
	}
	better := func(a, b int) bool {
		na, nb := perNode[g.numa[a]], perNode[g.numa[b]]
		switch fa, fb := na >= size, nb >= size; {
		case fa != fb:
			return fa
		case fa:
			return na < nb
		default:
			return na > nb
		}
	}
	best := avail[0]
	for _, i := range avail[1:] {
		if better(i, best) {
			best = i
		}
	}
	return best
}

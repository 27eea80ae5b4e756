package gpu

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
)

// Pick is one replica a preferred allocation chose and why.
type Pick struct {
	ID string
	// Unit is the UUID of the unit the replica belongs to.
	Unit string
	Why  string
}

// ExplainPreferred is Preferred, saying why each device was picked: the
// allocate command prints it.
func (r *Resource) ExplainPreferred(available, mustInclude []string, size int) ([]Pick, error) {
	if !r.shared {
		ids, err := r.graph.Preferred(available, mustInclude, size)
		if err != nil {
			return nil, err
		}
		out := make([]Pick, len(ids))
		for i, id := range ids {
			why := "best-linked set (allocator score)"
			if slices.Contains(mustInclude, id) {
				why = "must include"
			}
			out[i] = Pick{ID: id, Unit: id, Why: why}
		}
		return out, nil
	}
	return r.pickReplicas(available, mustInclude, size)
}

func (r *Resource) preferReplicas(available, mustInclude []string, size int) ([]string, error) {
	picks, err := r.pickReplicas(available, mustInclude, size)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(picks))
	for i, p := range picks {
		ids[i] = p.ID
	}
	return ids, nil
}

// pickReplicas chooses size replicas from available, mustInclude first.
// It is greedy, one unit at a time, with the units' free replicas
// counted from available (a replica not available is held by another
// container):
//
//   - distributed: the unit with the fewest replicas in this answer, then
//     the most free replicas (the least used GPU), then the best linked to
//     the units already chosen, then the first; one replica per step, so
//     a request for k replicas lands on k GPUs when it can, and a
//     multi-GPU request on an idle node gets a well-linked set.
//   - packed: a unit already in the answer while it has free replicas,
//     else the one with the fewest free replicas (the most used), then the
//     best linked, then the first; as many replicas of it as still needed.
func (r *Resource) pickReplicas(available, mustInclude []string, size int) ([]Pick, error) {
	if r.mps {
		return r.pickMPS(available, mustInclude, size)
	}
	n := len(r.units)
	// free[u] counts unit u's available replicas not yet taken; avail
	// marks them by flat device number (r.offset[u] + replica).
	free := make([]int, n)
	inAnswer := make([]int, n)
	avail := make([]bool, len(r.byID))
	out := make([]Pick, 0, size)
	for _, id := range available {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", allocator.ErrBadRequest, id)
		}
		if k := r.offset[d.unit] + d.replica; !avail[k] {
			avail[k] = true
			free[d.unit]++
		}
	}
	for _, id := range mustInclude {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", allocator.ErrBadRequest, id)
		}
		if k := r.offset[d.unit] + d.replica; avail[k] {
			avail[k] = false
			free[d.unit]--
			inAnswer[d.unit]++
			out = append(out, Pick{ID: id, Unit: r.units[d.unit].uuid, Why: "must include"})
		}
	}
	total := 0
	for _, f := range free {
		total += f
	}
	if size < len(out) || size > len(out)+total {
		return nil, fmt.Errorf("%w: %d devices wanted, %d must be included, %d more available", allocator.ErrBadRequest, size, len(out), total)
	}
	// link[u] sums unit u's link weight to the units in the answer.
	link := make([]int, n)
	addLinks := func(c int) {
		for u := range n {
			if u != c {
				link[u] += unitWeight(r.units[u].unit, r.units[c].unit, r.topo)
			}
		}
	}
	for u := range n {
		if inAnswer[u] > 0 {
			addLinks(u)
		}
	}
	for len(out) < size {
		best := -1
		for u := range n {
			if free[u] > 0 && (best < 0 || r.better(u, best, inAnswer, free, link)) {
				best = u
			}
		}
		take := 1
		if r.packed {
			take = min(size-len(out), free[best])
		}
		why := r.why(best, inAnswer, free)
		if inAnswer[best] == 0 {
			addLinks(best)
		}
		// Lowest replica numbers first: answers read predictably.
		e := &r.units[best]
		for rep := 0; take > 0; rep++ {
			if k := r.offset[best] + rep; avail[k] {
				avail[k] = false
				out = append(out, Pick{ID: e.ids[rep], Unit: e.uuid, Why: why})
				free[best]--
				inAnswer[best]++
				take--
			}
		}
	}
	return out, nil
}

// better reports whether unit a beats unit b for the next replica.
func (r *Resource) better(a, b int, inAnswer, free, link []int) bool {
	if r.packed {
		if (inAnswer[a] > 0) != (inAnswer[b] > 0) {
			return inAnswer[a] > 0
		}
		if free[a] != free[b] {
			return free[a] < free[b]
		}
		return link[a] > link[b]
	}
	if inAnswer[a] != inAnswer[b] {
		return inAnswer[a] < inAnswer[b]
	}
	if free[a] != free[b] {
		return free[a] > free[b]
	}
	return link[a] > link[b]
}

func (r *Resource) why(u int, inAnswer, free []int) string {
	f := strconv.Itoa(free[u]) + " of " + strconv.Itoa(len(r.units[u].ids)) + " replicas free"
	switch {
	case r.packed && inAnswer[u] > 0:
		return "packed: filling a GPU already in this allocation (" + f + ")"
	case r.packed:
		return "packed: most used GPU with room (" + f + ")"
	case inAnswer[u] > 0:
		return "distributed: every GPU with room is already in this allocation; least used of them (" + f + ")"
	default:
		return "distributed: least used GPU not yet in this allocation, best linked among equals (" + f + ")"
	}
}

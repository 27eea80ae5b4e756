package allocator

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestHeuristicAgainstExact runs the heuristic on requests the exact
// search can still settle (17 to 24 devices) and reports how often it
// finds the optimum; it must never claim more than the optimum.
func TestHeuristicAgainstExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	optimal, total := 0, 0
	worst := 1.0
	for range 120 {
		n := 17 + rng.IntN(8)
		ids := make([]string, n)
		numa := make([]int, n)
		for i := range ids {
			ids[i] = fmt.Sprint(i)
			numa[i] = rng.IntN(3) - 1 + rng.IntN(2)
		}
		uniform := rng.IntN(2) == 0
		g := NewGraph(ids, numa, func(i, j int) int {
			if uniform {
				return rng.IntN(100)
			}
			if numa[i] == numa[j] && numa[i] >= 0 {
				return 1000 + rng.IntN(50)
			}
			return rng.IntN(20)
		})
		size := 2 + rng.IntN(n-3)
		r, err := g.request(ids, ids[:rng.IntN(3)], size)
		if err != nil {
			t.Fatal(err)
		}
		set, score := r.heuristic(time.Time{}, true)
		if len(set) != size {
			t.Fatalf("heuristic chose %d of %d", len(set), size)
		}
		if got := r.score(set); got != score {
			t.Fatalf("heuristic reports %+v for a set scoring %+v", score, got)
		}
		if base := r.numaGrouping(newState(r), r.known()).score; score.Compare(base) < 0 {
			t.Fatalf("heuristic %+v below NUMA grouping %+v", score, base)
		}
		_, best := r.exact(set, score)
		if c := score.Compare(best); c > 0 {
			t.Fatalf("heuristic %+v beats the optimum %+v", score, best)
		} else if c == 0 {
			optimal++
		} else if best.Link > 0 {
			worst = min(worst, float64(score.Link)/float64(best.Link))
		}
		total++
	}
	t.Logf("heuristic optimal in %d of %d requests of 17-24 devices; worst link ratio %.4f", optimal, total, worst)
}

package allocator

import (
	"errors"
	"slices"
	"testing"
)

// twoIslands: devices 0-3 on NUMA 0, all linked with weight 10;
// devices 4-7 on NUMA 1, linked likewise; no links across.
func twoIslands() *Graph {
	ids := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}
	numa := []int{0, 0, 0, 0, 1, 1, 1, 1}
	return NewGraph(ids, numa, func(i, j int) int {
		if i/4 == j/4 {
			return 10
		}
		return 1
	})
}

func TestPreferred(t *testing.T) {
	g := twoIslands()
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
		wantSet   []string
	}{
		{name: "fills one island", available: []string{"d0", "d1", "d4", "d5", "d6"}, size: 3, wantSet: []string{"d4", "d5", "d6"}},
		{name: "small request fills the fuller node", available: []string{"d1", "d2", "d3", "d4", "d5", "d6", "d7"}, size: 1, wantSet: []string{"d1"}},
		{name: "tightest node that fits", available: []string{"d0", "d1", "d2", "d4", "d5"}, size: 2, wantSet: []string{"d4", "d5"}},
		{name: "follows must-include", available: []string{"d0", "d1", "d2", "d4", "d5", "d6"}, must: []string{"d1"}, size: 3, wantSet: []string{"d0", "d1", "d2"}},
		{name: "whole node", available: []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}, size: 8, wantSet: []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}},
		{name: "must-include is the answer", available: []string{"d0", "d7"}, must: []string{"d7", "d0"}, size: 2, wantSet: []string{"d0", "d7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Preferred(tt.available, tt.must, tt.size)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tt.must {
				if !slices.Contains(got, m) {
					t.Errorf("result %v lacks must-include %s", got, m)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.wantSet) {
				t.Errorf("got %v, want %v", got, tt.wantSet)
			}
		})
	}
}

func TestPreferredRefusesImpossibleRequests(t *testing.T) {
	g := twoIslands()
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
	}{
		{name: "too large", available: []string{"d0"}, size: 2},
		{name: "zero size", available: []string{"d0"}, size: 0},
		{name: "unknown id", available: []string{"d0", "x"}, size: 1},
		{name: "must-include not available", available: []string{"d0", "d1"}, must: []string{"d2"}, size: 2},
		{name: "must-include exceeds size", available: []string{"d0", "d1"}, must: []string{"d0", "d1"}, size: 1},
		{name: "duplicate id", available: []string{"d0", "d0"}, size: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := g.Preferred(tt.available, tt.must, tt.size); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err = %v, want ErrBadRequest", err)
			}
		})
	}
}

package main

import (
	"slices"
	"testing"
)

func TestSpread(t *testing.T) {
	tests := []struct {
		count, n int
		want     []int
	}{
		{count: 8, n: 4, want: []int{0, 2, 4, 6}},
		{count: 16, n: 4, want: []int{0, 4, 8, 12}},
		{count: 4, n: 8, want: []int{0, 1, 2, 3}},
	}
	for _, tt := range tests {
		if got := spread(tt.count, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("spread(%d, %d) = %v, want %v", tt.count, tt.n, got, tt.want)
		}
	}
}

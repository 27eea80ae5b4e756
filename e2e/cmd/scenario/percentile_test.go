package main

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100-i) * time.Millisecond // reversed: percentile sorts
	}
	tests := []struct {
		name    string
		samples []time.Duration
		pct     int
		want    time.Duration
	}{
		{name: "p50 of 100 is the 50th", samples: hundred, pct: 50, want: 50 * time.Millisecond},
		{name: "p99 of 100 is the 99th", samples: hundred, pct: 99, want: 99 * time.Millisecond},
		{name: "p50 of an odd count is the middle", samples: []time.Duration{3, 1, 2}, pct: 50, want: 2},
		{name: "p99 of one sample is it", samples: []time.Duration{7}, pct: 99, want: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.samples, tt.pct); got != tt.want {
				t.Errorf("percentile(%d) = %v, want %v", tt.pct, got, tt.want)
			}
		})
	}
}

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

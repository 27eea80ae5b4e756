package harness

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100-i) * time.Millisecond // reversed: Percentile sorts
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
			if got := Percentile(tt.samples, tt.pct); got != tt.want {
				t.Errorf("Percentile(%d) = %v, want %v", tt.pct, got, tt.want)
			}
		})
	}
}

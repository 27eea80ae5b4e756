package harness

import (
	"context"
	"math"
	"slices"
	"time"
)

// Latency is how long one kind of call took, in the scenario report's
// and gpu-check's shape.
type Latency struct {
	Size  int     `json:"size"`
	Calls int     `json:"calls"`
	P50Us float64 `json:"p50Us"`
	P99Us float64 `json:"p99Us"`
	MaxUs float64 `json:"maxUs"`
}

// Measure times calls sequential calls of f, each bounded by perCall,
// and stops at the first error.
func Measure(ctx context.Context, calls, size int, perCall time.Duration, f func(context.Context) error) (Latency, error) {
	samples := make([]time.Duration, 0, calls)
	for range calls {
		c, cancel := context.WithTimeout(ctx, perCall)
		start := time.Now()
		err := f(c)
		samples = append(samples, time.Since(start))
		cancel()
		if err != nil {
			return Latency{}, err
		}
	}
	return Latency{
		Size:  size,
		Calls: calls,
		P50Us: Micros(Percentile(samples, 50)),
		P99Us: Micros(Percentile(samples, 99)),
		MaxUs: Micros(slices.Max(samples)),
	}, nil
}

// Percentile is the nearest-rank percentile of samples.
func Percentile(samples []time.Duration, pct int) time.Duration {
	s := slices.Sorted(slices.Values(samples))
	rank := (pct*len(s) + 99) / 100 // ceil(pct/100 * n)
	return s[max(rank, 1)-1]
}

// Millis is d in milliseconds, to the microsecond.
func Millis(d time.Duration) float64 { return Round(float64(d)/float64(time.Millisecond), 3) }

// Micros is d in microseconds, to a tenth.
func Micros(d time.Duration) float64 { return Round(float64(d)/float64(time.Microsecond), 1) }

// Round rounds v to places decimals.
func Round(v float64, places int) float64 {
	scale := math.Pow10(places)
	return math.Round(v*scale) / scale
}

package backoff

import (
	"errors"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

// The wait's bounds: floor at r=0, ceiling at r→1, for each class.
func TestDelayBounds(t *testing.T) {
	p := Default()
	tests := []struct {
		name        string
		n           int
		class       kubeapi.ErrorClass
		ra          time.Duration
		floor, ceil time.Duration
	}{
		{"transient 1st", 1, kubeapi.Transient, 0, time.Second, 2 * time.Second},
		{"transient 2nd", 2, kubeapi.Transient, 0, time.Second, 4 * time.Second},
		{"transient 8th", 8, kubeapi.Transient, 0, time.Second, 256 * time.Second},
		{"transient 9th capped", 9, kubeapi.Transient, 0, time.Second, 5 * time.Minute},
		{"transient 1000th capped", 1000, kubeapi.Transient, 0, time.Second, 5 * time.Minute},
		{"persistent 1st", 1, kubeapi.Persistent, 0, 30 * time.Second, time.Minute},
		{"persistent 4th capped", 4, kubeapi.Persistent, 0, 30 * time.Second, 5 * time.Minute},
		// The server's wait is the floor, and a quarter of it is spread.
		{"throttled short Retry-After", 1, kubeapi.Throttled, 1500 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second},
		{"throttled long Retry-After", 1, kubeapi.Throttled, 40 * time.Second, 40 * time.Second, 50 * time.Second},
		{"throttled Retry-After over the cap", 20, kubeapi.Throttled, 20 * time.Minute, 20 * time.Minute, 25 * time.Minute},
		{"absurd Retry-After", 1, kubeapi.Throttled, 48 * time.Hour, time.Hour, 75 * time.Minute},
		{"persistent with Retry-After under its floor", 1, kubeapi.Persistent, 5 * time.Second, 30 * time.Second, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.Rand = fixed(0)
			if d := p.Delay(tt.n, tt.class, tt.ra); d != tt.floor {
				t.Errorf("floor = %v, want %v", d, tt.floor)
			}
			p.Rand = fixed(1)
			if d := p.Delay(tt.n, tt.class, tt.ra); d != tt.ceil {
				t.Errorf("ceiling = %v, want %v", d, tt.ceil)
			}
			p.Rand = fixed(0.5)
			if d := p.Delay(tt.n, tt.class, tt.ra); d != tt.floor+(tt.ceil-tt.floor)/2 {
				t.Errorf("middle = %v, want halfway", d)
			}
		})
	}
}

// The jitter is real: with the default source, waits spread over the
// range instead of all nodes waking together.
func TestDelaySpreads(t *testing.T) {
	p := Default()
	seen := map[time.Duration]bool{}
	for range 100 {
		d := p.Delay(5, kubeapi.Transient, 0)
		if d < time.Second || d > 32*time.Second {
			t.Fatalf("wait %v outside [1s, 32s]", d)
		}
		seen[d.Truncate(time.Second)] = true
	}
	if len(seen) < 10 {
		t.Errorf("100 waits fell in %d distinct seconds; no jitter?", len(seen))
	}
}

// A zero policy is the default one, never a hot loop.
func TestZeroPolicyIsDefault(t *testing.T) {
	var b Backoff
	b.Policy.Rand = fixed(0)
	if d, _ := b.Fail(errors.New("connection refused")); d != time.Second {
		t.Errorf("zero policy's first wait %v, want 1s", d)
	}
	if d, c := b.Fail(&kubeapi.StatusError{Code: 403}); d != 30*time.Second || c != kubeapi.Persistent {
		t.Errorf("zero policy on a 403: %v %v", d, c)
	}
}

// Fail counts the run and classifies; Reset ends it.
func TestBackoffRun(t *testing.T) {
	b := New(Policy{Min: time.Second, PersistentMin: 30 * time.Second, Max: 5 * time.Minute, Rand: fixed(1)})
	var got []time.Duration
	for range 10 {
		d, c := b.Fail(errors.New("timeout"))
		if c != kubeapi.Transient {
			t.Fatalf("class %v", c)
		}
		got = append(got, d)
	}
	want := []time.Duration{2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Errorf("ceiling %d = %v, want %ds", i+1, got[i], want[i])
		}
	}
	if b.Failures() != 10 {
		t.Errorf("Failures = %d", b.Failures())
	}
	b.Reset()
	d, c := b.Fail(&kubeapi.StatusError{Code: 429, RetryAfter: 3 * time.Second})
	if c != kubeapi.Throttled || d != 3*time.Second+3*time.Second/4 {
		t.Errorf("after Reset, a 429 with Retry-After 3s: %v %v", d, c)
	}
	// A webhook that always refuses reaches the cap on the 4th failure.
	b.Reset()
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute} {
		if d, c := b.Fail(&kubeapi.StatusError{Code: 400, Reason: "BadRequest", Message: "admission webhook denied the request"}); d != want || c != kubeapi.Persistent {
			t.Errorf("persistent failure %d: %v %v, want %v", i+1, d, c, want)
		}
	}
}

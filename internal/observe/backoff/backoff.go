// Package backoff is the retry policy of the plugin's own API writes (the
// Node condition, Events, Node labels): exponential with full jitter, never
// sooner than the server's Retry-After, capped, and slow from the first
// failure on an error that retrying will not fix (kubeapi.Classify).
//
// After the n-th failure in a row the wait is uniform between a floor and
// a ceiling:
//
//   - floor: Min (1 s), or PersistentMin (30 s) for a persistent error (401,
//     403, 422, an admission webhook's refusal), or the Retry-After the
//     server sent when that is longer;
//   - ceiling: floor·2ⁿ, at most Max (5 min); at least a quarter above a
//     Retry-After, so nodes told the same wait do not come back together.
//
// A Retry-After longer than MaxRetryAfter (1 h) counts as MaxRetryAfter.
package backoff

import (
	"math/rand/v2"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// The default policy's bounds (docs/api-load.md states them).
const (
	DefaultMin           = time.Second
	DefaultPersistentMin = 30 * time.Second
	DefaultMax           = 5 * time.Minute
	// MaxRetryAfter bounds a server's Retry-After: a proxy that answers
	// with a date next year must not silence the node for good.
	MaxRetryAfter = time.Hour
)

// Policy says how long to wait after a failure.
type Policy struct {
	// Min is the floor after a transient or throttled failure, and the
	// first ceiling's half.
	Min time.Duration
	// PersistentMin is the floor after a persistent failure.
	PersistentMin time.Duration
	// Max caps the ceiling (not a longer Retry-After).
	Max time.Duration
	// Rand returns a number in [0, 1); nil is math/rand/v2's.
	Rand func() float64
}

// Default is the plugin's policy: 1 s (30 s when persistent) to 5 min.
func Default() Policy {
	return Policy{Min: DefaultMin, PersistentMin: DefaultPersistentMin, Max: DefaultMax}
}

// Delay is the wait after the n-th failure in a row (n ≥ 1) of class c,
// the server having asked for retryAfter (zero: nothing).
// A zero bound is Default's: a policy can never make a hot loop.
func (p Policy) Delay(n int, c kubeapi.ErrorClass, retryAfter time.Duration) time.Duration {
	d := Default()
	p.Min, p.PersistentMin, p.Max = or(p.Min, d.Min), or(p.PersistentMin, d.PersistentMin), or(p.Max, d.Max)
	floor := p.Min
	if c == kubeapi.Persistent {
		floor = max(p.PersistentMin, p.Min)
	}
	ceil := floor
	for i := 0; i < max(n, 1) && ceil < p.Max; i++ {
		ceil *= 2
	}
	ceil = max(min(ceil, p.Max), floor)
	if ra := min(retryAfter, MaxRetryAfter); ra > floor {
		floor = ra
		ceil = max(ceil, ra+ra/4)
	}
	r := p.Rand
	if r == nil {
		r = rand.Float64
	}
	return floor + time.Duration(r()*float64(ceil-floor))
}

// Backoff is one writer's run of failures. The zero value uses Default's
// bounds.
type Backoff struct {
	Policy   Policy
	failures int
}

// New is a Backoff with policy p.
func New(p Policy) *Backoff { return &Backoff{Policy: p} }

// Fail records a failure and says how long to wait before the next
// request, and what kind of failure it was.
func (b *Backoff) Fail(err error) (time.Duration, kubeapi.ErrorClass) {
	b.failures++
	c := kubeapi.Classify(err)
	ra, _ := kubeapi.RetryAfter(err)
	return b.Policy.Delay(b.failures, c, ra), c
}

// Reset ends the run: the request worked.
func (b *Backoff) Reset() { b.failures = 0 }

// Failures is how many requests failed in a row.
func (b *Backoff) Failures() int { return b.failures }

func or(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

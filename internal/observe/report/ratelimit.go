package report

import (
	"time"
)

// bucket is a token bucket over Event writes.
type bucket struct {
	burst  float64
	every  time.Duration
	tokens float64
	at     time.Time
}

func (b *bucket) refill(now time.Time) {
	if b.at.IsZero() {
		b.tokens, b.at = b.burst, now
		return
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(b.burst, b.tokens+float64(d)/float64(b.every))
		b.at = now
	}
}

func (b *bucket) take(now time.Time) bool {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// next is when the next token is there.
func (b *bucket) next(now time.Time) time.Time {
	b.refill(now)
	return now.Add(time.Duration((1 - b.tokens) * float64(b.every)))
}

// Node conditions.

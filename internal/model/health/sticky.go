package health

import (
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
)

// StickyCondition is a condition that outlives its cause: a fatal XID or
// a double-bit ECC error. Watcher.Sticky exports them and WithSticky
// restores them, so a restarted plugin keeps a GPU out that the driver has
// not yet said is fine.
//
// The previous and the next release read what this one saved: keys a
// newer release wrote are kept on the condition and written back with it,
// and a condition of a kind this release does not know is restored as it
// was and exported again, changing no device's health.
type StickyCondition struct {
	// Device is the GPU's device ID, as passed to NewWatcher (its UUID).
	Device string `json:"device"`
	// Kind is StickyXID or StickyECC.
	Kind string `json:"kind"`
	// XID is the XID code of a StickyXID condition.
	XID uint64 `json:"xid,omitempty"`
	// Since is when the condition began.
	Since time.Time `json:"since"`
	// ActionSeen means the driver has reported a recovery action for the
	// GPU since the condition began: the condition clears when the driver
	// reports none again.
	ActionSeen bool `json:"actionSeen,omitempty"`
	// extra are the keys a newer release wrote that this one has no
	// field for.
	extra jsonkeep.Fields
}

// UnmarshalJSON keeps the keys this release has no field for.
func (a *StickyCondition) UnmarshalJSON(b []byte) error {
	type plain StickyCondition
	return jsonkeep.Unmarshal[plain](b, a, &a.extra)
}

// MarshalJSON writes the kept keys back.
func (a StickyCondition) MarshalJSON() ([]byte, error) {
	type plain StickyCondition
	return jsonkeep.Marshal[plain](a, a.extra)
}

func (a StickyCondition) equal(b StickyCondition) bool {
	return a.Device == b.Device && a.Kind == b.Kind && a.XID == b.XID && a.Since.Equal(b.Since) && a.ActionSeen == b.ActionSeen
}

// WithSticky starts the Watcher with these sticky conditions, as Sticky
// returned them before a restart. Conditions of devices not watched are
// logged and dropped.
func WithSticky(conds []StickyCondition) Option {
	return func(o *options) { o.sticky = append(o.sticky, conds...) }
}

// OnStickyChange calls f with every sticky condition each time the set
// changes (one begins, clears, or the driver reports a recovery action
// for its GPU). f runs on the goroutine that polls and applies events, so
// it must not block for long.
func OnStickyChange(f func([]StickyCondition)) Option {
	return func(o *options) { o.onSticky = f }
}

// Sticky returns the sticky conditions now, for saving across restarts.
// It is safe to call from any goroutine.
func (w *Watcher) Sticky() []StickyCondition {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sticky)
}

func (w *Watcher) stickyNow() []StickyCondition {
	var out []StickyCondition
	for i := range w.gpus {
		g := &w.gpus[i]
		if c := g.conds[condXID]; c.sticky() {
			out = append(out, StickyCondition{Device: w.ids[i], Kind: StickyXID, XID: c.xid, Since: c.since, ActionSeen: c.actionSeen, extra: c.kept})
		}
		if c := g.conds[condECC]; c.sticky() {
			out = append(out, StickyCondition{Device: w.ids[i], Kind: StickyECC, Since: c.since, ActionSeen: c.actionSeen, extra: c.kept})
		}
		for _, p := range w.parts[i] {
			if c := p.xid; c.sticky() {
				out = append(out, StickyCondition{Device: p.ID, Kind: StickyXID, XID: c.xid, Since: c.since, ActionSeen: c.actionSeen, extra: c.kept})
			}
		}
	}
	return append(out, w.foreign...)
}

// syncSticky refreshes the snapshot and calls the hook when it changed.
func (w *Watcher) syncSticky() {
	cur := w.stickyNow()
	w.mu.Lock()
	changed := !slices.EqualFunc(cur, w.sticky, StickyCondition.equal)
	if changed {
		w.sticky = cur
	}
	w.mu.Unlock()
	if changed && w.onSticky != nil {
		w.onSticky(slices.Clone(cur))
	}
}

package health

import (
	"slices"
	"time"
)

// StickyCondition is a condition that outlives its cause: a fatal XID or
// a double-bit ECC error. Watcher.Sticky exports them and WithSticky
// restores them, so a restarted plugin keeps a GPU out that the driver has
// not yet said is fine.
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
			out = append(out, StickyCondition{Device: w.ids[i], Kind: StickyXID, XID: c.xid, Since: c.since, ActionSeen: c.actionSeen})
		}
		if c := g.conds[condECC]; c.sticky() {
			out = append(out, StickyCondition{Device: w.ids[i], Kind: StickyECC, Since: c.since, ActionSeen: c.actionSeen})
		}
		for _, p := range w.parts[i] {
			if c := p.xid; c.sticky() {
				out = append(out, StickyCondition{Device: p.ID, Kind: StickyXID, XID: c.xid, Since: c.since, ActionSeen: c.actionSeen})
			}
		}
	}
	return out
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

package health

import (
	"slices"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// Facts are what health knows of one GPU, structured, for a caller that
// acts on them (package remedy, through the remediation service) rather
// than only offering or withholding the GPU.
type Facts struct {
	// Healthy and Reason are the GPU's own health, as the Notifier is
	// told it for the GPU (or, for a GPU with parts, before an XID of one
	// instance is added to that part's).
	Healthy bool
	Reason  string
	// Action is the driver's recovery action now (RecoveryNone before
	// R550, or with the recovery-action check off).
	Action nvml.RecoveryAction
	// XIDs are the XIDs that arrived since the last Facts, on the GPU or
	// any of its instances, in order, each once; XIDs health ignores
	// (xidIgnore) are left out. A sticky XID restored at start is not
	// new: the caller keeps its own state across restarts.
	XIDs []uint64
	// RowRemapPending and RowRemapFailure are the remapped-rows check.
	RowRemapPending bool
	RowRemapFailure bool
	// Lost means the GPU is off the bus (the lost check).
	Lost bool
}

func (f Facts) equal(g Facts) bool {
	return f.Healthy == g.Healthy && f.Reason == g.Reason && f.Action == g.Action && slices.Equal(f.XIDs, g.XIDs) &&
		f.RowRemapPending == g.RowRemapPending && f.RowRemapFailure == g.RowRemapFailure && f.Lost == g.Lost
}

// OnFacts calls f with a GPU's Facts (by its device ID) whenever they
// change or new XIDs arrived, and once at start for a GPU that is not
// healthy. f runs on the goroutine that polls and applies events, so it
// must not block.
func OnFacts(f func(gpu string, facts Facts)) Option {
	return func(o *options) { o.onFacts = f }
}

// facts is GPU i's Facts now, with the XIDs not yet passed on.
func (w *Watcher) facts(i int) Facts {
	g := &w.gpus[i]
	f := Facts{Healthy: true, Action: g.action, XIDs: slices.Clone(g.newXIDs), Lost: g.conds[condLost] != nil}
	var reasons []string
	for _, c := range g.conds {
		if c != nil {
			reasons = append(reasons, c.reason)
		}
	}
	if len(reasons) > 0 {
		f.Healthy, f.Reason = false, strings.Join(reasons, ", ")
	}
	if c := g.conds[condRemap]; c != nil {
		f.RowRemapFailure = c.reason == reasonRemapFailure
		f.RowRemapPending = c.reason == reasonRemapPending
	}
	return f
}

// passFacts tells the OnFacts hook of GPU i's Facts when they changed.
func (w *Watcher) passFacts(i int) {
	if w.onFacts == nil {
		return
	}
	f := w.facts(i)
	g := &w.gpus[i]
	g.newXIDs = nil
	last := g.lastFacts
	last.XIDs = nil
	if len(f.XIDs) == 0 && g.factsSent && f.equal(last) {
		return
	}
	if !g.factsSent && f.Healthy && len(f.XIDs) == 0 && f.Action == nvml.RecoveryNone {
		// Healthy from the start: nothing to tell.
		g.factsSent, g.lastFacts = true, f
		return
	}
	g.factsSent, g.lastFacts = true, f
	w.onFacts(w.ids[i], f)
}

// seenXID records an XID health did not ignore on GPU i, for its next
// Facts.
func (w *Watcher) seenXID(i int, xid uint64) {
	if w.onFacts != nil && !slices.Contains(w.gpus[i].newXIDs, xid) {
		w.gpus[i].newXIDs = append(w.gpus[i].newXIDs, xid)
	}
}

// ClearSticky drops GPU id's XID and double-bit ECC conditions, its
// parts' XIDs too, sticky or not: the GPU was reset and proven (a
// remediation gave it back), so what happened before the reset no longer
// holds. What the last poll read of the conditions a reset clears (the
// driver's recovery action, a pending row remap) goes too, and lost (NVML
// answers GPU_IS_LOST while the reset has the GPU removed): the probe read
// them clean since, and the next poll reads them again. Safe from any
// goroutine: Run applies it at once, and Poll and Event first apply any
// pending.
func (w *Watcher) ClearSticky(id string) {
	w.clearMu.Lock()
	if !slices.Contains(w.clears, id) {
		w.clears = append(w.clears, id)
	}
	w.clearMu.Unlock()
	select {
	case w.clearWake <- struct{}{}:
	default:
	}
}

// applyClears applies the pending ClearSticky calls, saving the sticky
// set and publishing each GPU it changed.
func (w *Watcher) applyClears() {
	w.clearMu.Lock()
	ids := w.clears
	w.clears = nil
	w.clearMu.Unlock()
	var changed []int
	for _, id := range ids {
		i := slices.Index(w.ids, id)
		if i < 0 {
			continue
		}
		g := &w.gpus[i]
		pending := g.conds[condRemap] != nil && g.conds[condRemap].reason == reasonRemapPending
		hit := g.conds[condXID] != nil || g.conds[condECC] != nil || g.conds[condRecovery] != nil || g.action != nvml.RecoveryNone ||
			g.conds[condLost] != nil || pending
		g.conds[condXID], g.conds[condECC], g.conds[condRecovery], g.action = nil, nil, nil, nvml.RecoveryNone
		g.conds[condLost], g.lostGood = nil, 0
		if pending {
			g.conds[condRemap] = nil
		}
		for k := range w.parts[i] {
			hit = hit || w.parts[i][k].xid != nil
			w.parts[i][k].xid = nil
		}
		if hit {
			w.log.Info("clearing the GPU's XID and ECC conditions: it was reset and proven", "device", id)
			changed = append(changed, i)
		}
	}
	if len(changed) == 0 {
		return
	}
	w.syncSticky()
	for _, i := range changed {
		w.publish(i)
	}
}

// The remapped-rows condition's reasons.
const (
	reasonRemapPending = "row-remap-pending"
	reasonRemapFailure = "row-remap-failure"
)

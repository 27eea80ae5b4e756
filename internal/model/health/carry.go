package health

import "maps"

// ReasonRelaidOut is the reason a device carries from the moment a new
// layout serves it (a MIG device created under the running plugin, a GPU
// whose MIG mode was turned off) until the Watcher built for that layout
// first reports it: the front-end advertises it so, and the Watcher
// starts from it, so the kubelet never hears Healthy before health did.
const ReasonRelaidOut = "mig-relayout"

// Carried is a stopped Watcher's state, handed to the Watcher built for
// the next layout of the same GPUs (a MIG layout changed under the running
// plugin), so that no condition, sticky or transient, resets: not a GPU's,
// nor that of a MIG device both layouts serve. A MIG device the new layout
// adds starts from its GPU's conditions.
type Carried struct {
	gpus  map[string]gpuState
	parts map[string]partState
	// reported are the device IDs the stopped Watcher reported as; the
	// front-end kept their health, and the others are ReasonRelaidOut.
	reported    map[string]bool
	failedPolls int
	polled      bool
	warned      map[string]warnState
	foreign     []StickyCondition
}

// Carry returns w's state for WithCarried. Call it once Run has returned:
// w must not be used after.
func (w *Watcher) Carry() Carried {
	w.applyClears()
	c := Carried{
		gpus: map[string]gpuState{}, parts: map[string]partState{}, reported: map[string]bool{},
		failedPolls: w.failedPolls, polled: w.polled, warned: maps.Clone(w.warned), foreign: w.foreign,
	}
	for i, id := range w.ids {
		g := w.gpus[i]
		// The next Watcher's remediation has heard nothing yet.
		g.factsSent = false
		c.gpus[id] = g
		for _, p := range w.parts[i] {
			c.parts[p.ID] = p
		}
		for _, r := range w.reportIDs(i) {
			c.reported[r] = true
		}
	}
	return c
}

// WithCarried starts the Watcher from the state a stopped one carried
// (Watcher.Carry). Its sticky conditions are in it: WithSticky is for a
// start after a restart, not for this.
func WithCarried(c Carried) Option {
	return func(o *options) { o.carried = &c }
}

// carry applies o.carried to a new Watcher whose parts are set.
func (w *Watcher) carry(c *Carried) {
	w.failedPolls, w.polled, w.foreign = c.failedPolls, c.polled, c.foreign
	if c.warned != nil {
		w.warned = c.warned
	}
	for i, id := range w.ids {
		g := &w.gpus[i]
		if old, ok := c.gpus[id]; ok {
			*g = old
		}
		// Whether the GPU is in MIG mode is read at each poll; until then,
		// a GPU served through MIG devices is not hit by it.
		if len(w.parts[i]) > 0 {
			g.conds[condMIG] = nil
		}
		if len(w.parts[i]) == 0 {
			if !c.reported[id] {
				g.healthy, g.reason = false, ReasonRelaidOut
			}
			continue
		}
		for k := range w.parts[i] {
			p := &w.parts[i][k]
			if old, ok := c.parts[p.ID]; ok && c.reported[p.ID] {
				p.xid, p.healthy, p.reason = old.xid, old.healthy, old.reason
				continue
			}
			p.healthy, p.reason = false, ReasonRelaidOut
		}
	}
}

package health

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// Sampler reads one GPU's polled state; nvml.Monitor is one.
type Sampler interface {
	Sample(i int) nvml.Sample
}

// Notifier receives every health transition; deviceplugin.Server is one.
type Notifier interface {
	SetHealth(id string, healthy bool, reason string) bool
}

// Recorder passes health to metrics. It may be nil. reason is empty when
// healthy.
type Recorder interface {
	// Health is a device's state now: at start, and whenever its state
	// or reason changes.
	Health(device string, healthy bool, reason string)
	// Transition counts a change of state (not of reason alone).
	Transition(device string, healthy bool, reason string)
}

// kind orders the conditions in a reason string.
type kind int

const (
	condNVML kind = iota
	condLost
	condMIG
	condRecovery
	condRemap
	condXID
	condECC
	condThermal
	condHW
	numKinds
)

type condition struct {
	reason string
	// until is when a transient XID condition expires; zero: never.
	until time.Time
	// since, xid and actionSeen are kept for sticky conditions (a fatal
	// XID, a double-bit ECC error): when it began, its XID, and whether
	// the driver has reported a recovery action for the GPU since.
	since      time.Time
	xid        uint64
	actionSeen bool
}

func (c *condition) sticky() bool { return c != nil && c.until.IsZero() }

type gpuState struct {
	conds [numKinds]*condition
	// Consecutive polls: good ones that count towards clearing the
	// thermal, hardware-slowdown and lost conditions, and bad ones that
	// count towards setting the hardware-slowdown condition.
	thermalGood, hwGood, lostGood, hwBad int
	healthy                              bool
	reason                               string
}

// set makes condition k hold reason, keeping one that already does.
func (g *gpuState) set(k kind, reason string) {
	if c := g.conds[k]; c == nil || c.reason != reason {
		g.conds[k] = &condition{reason: reason}
	}
}

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

// The kinds of StickyCondition.
const (
	StickyXID = "xid"
	StickyECC = "ecc"
)

func (a StickyCondition) equal(b StickyCondition) bool {
	return a.Device == b.Device && a.Kind == b.Kind && a.XID == b.XID && a.Since.Equal(b.Since) && a.ActionSeen == b.ActionSeen
}

// Option configures a Watcher.
type Option func(*options)

type options struct {
	sticky   []StickyCondition
	onSticky func([]StickyCondition)
	parts    [][]Part
}

// Part is a MIG device of a watched GPU, by its device ID and instance
// IDs. A GPU given parts reports health for each of them instead of for
// itself: a part is Unhealthy when its GPU is (an XID naming no
// instance, a lost GPU, heat), or when an XID names its instance.
type Part struct {
	ID                           string
	GPUInstance, ComputeInstance int
}

// WithParts gives GPU i the parts parts[i] (see Part).
func WithParts(parts [][]Part) Option {
	return func(o *options) { o.parts = parts }
}

type partState struct {
	Part
	xid     *condition
	healthy bool
	reason  string
}

func (p *partState) matches(in nvml.Instance) bool {
	return p.GPUInstance == in.GPUInstance && (in.ComputeInstance < 0 || p.ComputeInstance == in.ComputeInstance)
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

// warnEvery is how often a repeated warning (the same GPU failing the same
// read) is logged; the ones in between are counted.
const warnEvery = 10 * time.Minute

type warnState struct {
	last       time.Time
	suppressed int
}

// Watcher owns the health state of a set of GPUs.
type Watcher struct {
	policy  Policy
	ids     []string
	sampler Sampler
	notify  Notifier
	rec     Recorder
	log     *slog.Logger
	now     func() time.Time
	gpus    []gpuState
	// parts[i] are GPU i's MIG devices when it reports through them.
	parts [][]partState
	// failedPolls counts consecutive polls in which no GPU could be read.
	failedPolls int
	polled      bool
	warned      map[string]warnState
	onSticky    func([]StickyCondition)

	mu     sync.Mutex        // guards sticky, which other goroutines read
	sticky []StickyCondition // the sticky conditions at the last change
}

// NewWatcher watches the GPUs whose device IDs are ids, in the order the
// Sampler and events index them. Every GPU starts healthy, except those
// with a sticky condition given by WithSticky, which are reported at once.
func NewWatcher(p Policy, ids []string, s Sampler, n Notifier, rec Recorder, log *slog.Logger, opts ...Option) (*Watcher, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("health policy: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	w := &Watcher{
		policy: p, ids: ids, sampler: s, notify: n, rec: rec, log: log, now: time.Now,
		gpus: make([]gpuState, len(ids)), warned: map[string]warnState{}, onSticky: o.onSticky,
		parts: make([][]partState, len(ids)),
	}
	for i := range w.gpus {
		w.gpus[i].healthy = true
		if i < len(o.parts) {
			for _, p := range o.parts[i] {
				w.parts[i] = append(w.parts[i], partState{Part: p, healthy: true})
			}
		}
		if rec != nil {
			for _, id := range w.reportIDs(i) {
				rec.Health(id, true, "")
			}
		}
	}
	for _, sc := range o.sticky {
		i := slices.Index(ids, sc.Device)
		c := &condition{since: sc.Since, actionSeen: sc.ActionSeen}
		var k kind
		switch sc.Kind {
		case StickyXID:
			k, c.xid, c.reason = condXID, sc.XID, fmt.Sprintf("xid=%d", sc.XID)
		case StickyECC:
			k, c.reason = condECC, "ecc=double-bit"
		default:
			log.Warn("dropping a saved sticky condition of unknown kind", "device", sc.Device, "kind", sc.Kind)
			continue
		}
		if i < 0 {
			if p := w.part(sc.Device); p != nil && k == condXID {
				p.xid = c
				continue
			}
			log.Info("dropping a saved sticky condition of a GPU no longer here", "device", sc.Device, "reason", c.reason)
			continue
		}
		w.gpus[i].conds[k] = c
	}
	for i := range w.gpus {
		w.publish(i)
	}
	w.sticky = w.stickyNow()
	return w, nil
}

// reportIDs are the device IDs GPU i's health is reported as.
func (w *Watcher) reportIDs(i int) []string {
	if len(w.parts[i]) == 0 {
		return []string{w.ids[i]}
	}
	out := make([]string, len(w.parts[i]))
	for k, p := range w.parts[i] {
		out[k] = p.ID
	}
	return out
}

// part finds a part by device ID.
func (w *Watcher) part(id string) *partState {
	for i := range w.parts {
		for k := range w.parts[i] {
			if w.parts[i][k].ID == id {
				return &w.parts[i][k]
			}
		}
	}
	return nil
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

// Run polls at the policy's interval and applies events until ctx ends
// or events is closed. Unless Poll has run already, it polls at once, so
// a GPU that is already hot is reported before the first interval passes.
func (w *Watcher) Run(ctx context.Context, events <-chan nvml.Event) {
	if !w.polled {
		w.Poll()
	}
	tick := time.NewTicker(w.policy.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			w.Event(ev)
		case <-tick.C:
			w.Poll()
		}
	}
}

// Event applies one NVML event.
func (w *Watcher) Event(ev nvml.Event) {
	if ev.GPU < 0 || ev.GPU >= len(w.gpus) {
		w.log.Warn("health event for an unknown GPU", "index", ev.GPU)
		return
	}
	g := &w.gpus[ev.GPU]
	now := w.now()
	switch ev.Kind {
	case nvml.EventDoubleBitECC:
		if g.conds[condECC] == nil {
			g.conds[condECC] = &condition{reason: "ecc=double-bit", since: now}
		}
	case nvml.EventXID:
		action := w.policy.XID(ev.XID)
		if action == policy.XIDIgnore {
			w.log.Info("ignoring application XID", "device", w.ids[ev.GPU], "xid", ev.XID)
			return
		}
		if ev.MIG != nil && len(w.parts[ev.GPU]) > 0 {
			// The XID names a MIG instance: only its devices are hit.
			hit := 0
			for k := range w.parts[ev.GPU] {
				if p := &w.parts[ev.GPU][k]; p.matches(*ev.MIG) {
					p.xid = w.xidCondition(p.xid, action, ev.XID, now)
					hit++
				}
			}
			if hit == 0 {
				w.log.Info("XID on a MIG instance not served; no device changes", "device", w.ids[ev.GPU], "xid", ev.XID,
					"gpuInstance", ev.MIG.GPUInstance, "computeInstance", ev.MIG.ComputeInstance)
				return
			}
			break
		}
		g.conds[condXID] = w.xidCondition(g.conds[condXID], action, ev.XID, now)
	case nvml.EventRecoveryAction:
		// The event says the action changed; the field says what it is.
		s := w.sampler.Sample(ev.GPU)
		if !s.Has(nvml.SignalRecoveryAction) {
			if s.Err != nil {
				w.warnRead(ev.GPU, s)
			}
			return
		}
		w.applyRecovery(ev.GPU, s.RecoveryAction)
	default:
		return
	}
	// Saved before the kubelet hears of it: a plugin killed right after
	// must not come back having forgotten what the kubelet was told.
	w.syncSticky()
	w.publish(ev.GPU)
}

// xidCondition is the XID condition after XID code arrives, given the
// one held now: a sticky XID is never downgraded by a later transient one.
func (w *Watcher) xidCondition(cur *condition, action policy.XIDAction, code uint64, now time.Time) *condition {
	reason := fmt.Sprintf("xid=%d", code)
	if action == policy.XIDSticky {
		return &condition{reason: reason, since: now, xid: code}
	}
	if cur.sticky() {
		return cur
	}
	return &condition{reason: reason, until: now.Add(w.policy.XIDRecovery), xid: code}
}

// Poll samples every GPU once and applies the results.
func (w *Watcher) Poll() {
	w.polled = true
	samples := make([]nvml.Sample, len(w.gpus))
	allFailed := len(w.gpus) > 0
	for i := range w.gpus {
		samples[i] = w.sampler.Sample(i)
		if !unreadable(samples[i]) {
			allFailed = false
		}
	}
	// One failed poll, even of every GPU of a one-GPU node, is not enough
	// to call NVML broken.
	if allFailed {
		w.failedPolls++
	} else {
		w.failedPolls = 0
	}
	nvmlDown := w.failedPolls >= w.policy.NVMLFailurePollCount()
	now := w.now()
	for i := range w.gpus {
		w.apply(i, samples[i], nvmlDown, now)
	}
	w.syncSticky() // saved first, as for events
	for i := range w.gpus {
		w.publish(i)
	}
}

// unreadable reports a GPU that answered nothing this poll, for a reason
// other than being lost.
func unreadable(s nvml.Sample) bool {
	return s.Err != nil && !s.Lost && s.Failed != 0 && s.Failed|s.Unsupported == nvml.AllSignals
}

// warnRead logs a failed read of GPU i, at most once per warnEvery for the
// same GPU and signals. A failed read alone changes no health.
func (w *Watcher) warnRead(i int, s nvml.Sample) {
	key := w.ids[i] + " " + s.Failed.String()
	now := w.now()
	st, seen := w.warned[key]
	if seen && now.Sub(st.last) < warnEvery {
		st.suppressed++
		w.warned[key] = st
		return
	}
	args := []any{"device", w.ids[i], "signal", s.Failed.String(), "err", s.Err.Error()}
	if st.suppressed > 0 {
		args = append(args, "suppressed", st.suppressed, "in", now.Sub(st.last).Round(time.Second).String())
	}
	w.log.Warn("reading GPU health failed; health unchanged", args...)
	w.warned[key] = warnState{last: now}
}

func (w *Watcher) apply(i int, s nvml.Sample, nvmlDown bool, now time.Time) {
	g := &w.gpus[i]
	p := w.policy
	if c := g.conds[condXID]; c != nil && !c.until.IsZero() && !now.Before(c.until) {
		g.conds[condXID] = nil
	}
	for k := range w.parts[i] {
		if c := w.parts[i][k].xid; c != nil && !c.until.IsZero() && !now.Before(c.until) {
			w.parts[i][k].xid = nil
		}
	}
	// Discovery read the MIG mode; it holds whatever this poll read. A
	// GPU served through its MIG devices is not hit by it.
	if s.MIGEnabled && len(w.parts[i]) == 0 {
		g.set(condMIG, "mig-enabled")
	} else {
		g.conds[condMIG] = nil
	}
	if s.Err != nil {
		w.warnRead(i, s)
	}
	if s.Lost {
		if p.Enabled(policy.CheckLost) && g.conds[condLost] == nil {
			g.conds[condLost] = &condition{reason: "gpu-lost"}
		}
		g.lostGood, g.thermalGood, g.hwGood, g.hwBad = 0, 0, 0, 0
		return
	}
	if unreadable(s) {
		if nvmlDown && g.conds[condNVML] == nil {
			// NVML is broken as a whole: no GPU can be vouched for.
			g.conds[condNVML] = &condition{reason: "nvml: " + s.Err.Error()}
		}
		g.lostGood, g.thermalGood, g.hwGood, g.hwBad = 0, 0, 0, 0
		return
	}
	g.conds[condNVML] = nil
	if g.conds[condLost] != nil {
		if g.lostGood++; g.lostGood >= p.RecoveryPolls {
			g.conds[condLost], g.lostGood = nil, 0
		}
	}
	w.applyThermal(g, s)
	w.applyHW(g, s)
	switch {
	case !p.Enabled(policy.CheckRecoveryAction) || s.Unsupported&nvml.SignalRecoveryAction != 0:
		g.conds[condRecovery] = nil
	case s.Has(nvml.SignalRecoveryAction):
		w.applyRecovery(i, s.RecoveryAction)
	}
	switch {
	case !p.Enabled(policy.CheckRemappedRows) || s.Unsupported&nvml.SignalRemappedRows != 0:
		g.conds[condRemap] = nil
	case !s.Has(nvml.SignalRemappedRows):
	case s.RowRemapFailure:
		g.set(condRemap, "row-remap-failure")
	case s.RowRemapPending:
		g.set(condRemap, "row-remap-pending")
	default:
		g.conds[condRemap] = nil
	}
}

// applyThermal: Unhealthy at the slowdown threshold, Healthy after
// RecoveryPolls polls below it by the margin.
func (w *Watcher) applyThermal(g *gpuState, s nvml.Sample) {
	p := w.policy
	switch {
	case !p.Enabled(policy.CheckThermal) || s.Unsupported&nvml.SignalTemperature != 0:
		g.conds[condThermal], g.thermalGood = nil, 0
	case !s.Has(nvml.SignalTemperature):
		g.thermalGood = 0
	case s.SlowdownC > 0 && s.TempC >= s.SlowdownC:
		if g.conds[condThermal] == nil {
			g.conds[condThermal] = &condition{reason: fmt.Sprintf("thermal=%dC>=slowdown %dC", s.TempC, s.SlowdownC)}
		}
		g.thermalGood = 0
	case g.conds[condThermal] != nil:
		if s.SlowdownC > 0 && s.TempC >= s.SlowdownC-p.ThermalMarginC {
			g.thermalGood = 0
		} else if g.thermalGood++; g.thermalGood >= p.RecoveryPolls {
			g.conds[condThermal], g.thermalGood = nil, 0
		}
	}
}

// applyHW: Unhealthy after SlowdownSamples consecutive polls with a
// hardware slowdown or power brake reason, Healthy after RecoveryPolls
// without.
func (w *Watcher) applyHW(g *gpuState, s nvml.Sample) {
	p := w.policy
	var mask uint64
	if p.Enabled(policy.CheckHWSlowdown) {
		mask |= nvml.ReasonHWSlowdown | nvml.ReasonHWThermalSlowdown
	}
	if p.Enabled(policy.CheckPowerBrake) {
		mask |= nvml.ReasonHWPowerBrake
	}
	switch {
	case mask == 0 || s.Unsupported&nvml.SignalClockReasons != 0:
		g.conds[condHW], g.hwBad, g.hwGood = nil, 0, 0
	case !s.Has(nvml.SignalClockReasons):
		g.hwBad, g.hwGood = 0, 0
	case s.Reasons&mask != 0:
		g.hwGood = 0
		if g.hwBad++; g.hwBad >= p.SlowdownSampleCount() && g.conds[condHW] == nil {
			g.conds[condHW] = &condition{reason: hwReasons(s.Reasons & mask)}
		}
	default:
		g.hwBad = 0
		if g.conds[condHW] != nil {
			if g.hwGood++; g.hwGood >= p.RecoveryPolls {
				g.conds[condHW], g.hwGood = nil, 0
			}
		}
	}
}

// applyRecovery applies the driver's recovery action for GPU i. A GPU
// that needs a reset, reboot or drain is Unhealthy until the driver says
// none. A sticky condition (fatal XID, double-bit ECC) clears once the
// driver, after it began, reported an action and then none again: the GPU
// was reset and the driver vouches for it.
func (w *Watcher) applyRecovery(i int, a nvml.RecoveryAction) {
	if !w.policy.Enabled(policy.CheckRecoveryAction) {
		return
	}
	g := &w.gpus[i]
	sticky := []**condition{&g.conds[condXID], &g.conds[condECC]}
	for k := range w.parts[i] {
		sticky = append(sticky, &w.parts[i][k].xid)
	}
	if a != nvml.RecoveryNone {
		g.set(condRecovery, "recovery-action="+a.String())
		for _, c := range sticky {
			if (*c).sticky() {
				(*c).actionSeen = true
			}
		}
		return
	}
	g.conds[condRecovery] = nil
	for _, c := range sticky {
		if (*c).sticky() && (*c).actionSeen {
			w.log.Info("driver reports no recovery action after one; clearing the sticky condition", "device", w.ids[i], "reason", (*c).reason)
			*c = nil
		}
	}
}

func hwReasons(r uint64) string {
	var out []string
	if r&nvml.ReasonHWSlowdown != 0 {
		out = append(out, "hw-slowdown")
	}
	if r&nvml.ReasonHWThermalSlowdown != 0 {
		out = append(out, "hw-thermal-slowdown")
	}
	if r&nvml.ReasonHWPowerBrake != 0 {
		out = append(out, "hw-power-brake")
	}
	return strings.Join(out, "+")
}

// publish reports GPU i's state if it changed, and logs the transition;
// for a GPU with parts, each part's.
func (w *Watcher) publish(i int) {
	g := &w.gpus[i]
	var reasons []string
	for _, c := range g.conds {
		if c != nil {
			reasons = append(reasons, c.reason)
		}
	}
	healthy, reason := len(reasons) == 0, strings.Join(reasons, ", ")
	if len(w.parts[i]) == 0 {
		w.report(w.ids[i], &g.healthy, &g.reason, healthy, reason)
		return
	}
	g.healthy, g.reason = healthy, reason
	for k := range w.parts[i] {
		p := &w.parts[i][k]
		ph, pr := healthy, reason
		if p.xid != nil {
			ph, pr = false, strings.Join(append(slices.Clip(reasons), p.xid.reason), ", ")
		}
		w.report(p.ID, &p.healthy, &p.reason, ph, pr)
	}
}

// report tells the notifier and recorder that device id is now
// (healthy, reason), when that differs from (*was, *wasReason).
func (w *Watcher) report(id string, was *bool, wasReason *string, healthy bool, reason string) {
	if healthy == *was && reason == *wasReason {
		return
	}
	old := "Healthy"
	if !*was {
		old = "Unhealthy"
	}
	state := "Healthy"
	if !healthy {
		state = "Unhealthy"
	}
	if healthy != *was {
		w.log.Warn("GPU health changed", "device", id, "old", old, "new", state, "reason", reason, "oldReason", *wasReason)
		if w.rec != nil {
			w.rec.Transition(id, healthy, reason)
		}
	} else {
		w.log.Info("GPU health reason changed", "device", id, "state", state, "reason", reason, "oldReason", *wasReason)
	}
	if w.rec != nil {
		w.rec.Health(id, healthy, reason)
	}
	*was, *wasReason = healthy, reason
	w.notify.SetHealth(id, healthy, reason)
}

// State returns GPU i's current health and reason.
func (w *Watcher) State(i int) (healthy bool, reason string) {
	return w.gpus[i].healthy, w.gpus[i].reason
}

// PartState returns the health of the part with device ID id, and
// whether there is one.
func (w *Watcher) PartState(id string) (healthy bool, reason string, ok bool) {
	p := w.part(id)
	if p == nil {
		return false, "", false
	}
	return p.healthy, p.reason, true
}

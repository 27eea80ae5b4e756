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
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
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
	// kept is what a newer release saved on the condition beyond the
	// fields above: written back with it while it lasts.
	kept jsonkeep.Fields
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
	// action is the driver's recovery action last read; newXIDs the
	// XIDs not yet passed to OnFacts, lastFacts the Facts last passed.
	action    nvml.RecoveryAction
	newXIDs   []uint64
	lastFacts Facts
	factsSent bool
}

// set makes condition k hold reason, keeping one that already does.
func (g *gpuState) set(k kind, reason string) {
	if c := g.conds[k]; c == nil || c.reason != reason {
		g.conds[k] = &condition{reason: reason}
	}
}

// The kinds of StickyCondition.
const (
	StickyXID = "xid"
	StickyECC = "ecc"
)

// Option configures a Watcher.
type Option func(*options)

type options struct {
	sticky   []StickyCondition
	onSticky func([]StickyCondition)
	onTurn   func()
	onFacts  func(string, Facts)
	parts    [][]Part
	carried  *Carried
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
	policy  policy.Policy
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
	onTurn      func()
	onFacts     func(string, Facts)

	// clears are the GPUs ClearSticky named, not yet applied; clearWake
	// wakes Run.
	clearMu   sync.Mutex
	clears    []string
	clearWake chan struct{}

	// foreign are the saved sticky conditions of kinds this release does
	// not know, exported again unchanged.
	foreign []StickyCondition

	mu     sync.Mutex        // guards sticky, which other goroutines read
	sticky []StickyCondition // the sticky conditions at the last change
}

// NewWatcher watches the GPUs whose device IDs are ids, in the order the
// Sampler and events index them. Every GPU starts healthy, except those
// with a sticky condition given by WithSticky, which are reported at once.
func NewWatcher(p policy.Policy, ids []string, s Sampler, n Notifier, rec Recorder, log *slog.Logger, opts ...Option) (*Watcher, error) {
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
		onTurn: o.onTurn, onFacts: o.onFacts, parts: make([][]partState, len(ids)), clearWake: make(chan struct{}, 1),
	}
	for i := range w.gpus {
		w.gpus[i].healthy = true
		if i < len(o.parts) {
			for _, p := range o.parts[i] {
				w.parts[i] = append(w.parts[i], partState{Part: p, healthy: true})
			}
		}
	}
	if o.carried != nil {
		w.carry(o.carried)
	}
	for i := range w.gpus {
		if rec == nil {
			continue
		}
		if len(w.parts[i]) == 0 {
			rec.Health(w.ids[i], w.gpus[i].healthy, w.gpus[i].reason)
			continue
		}
		for _, p := range w.parts[i] {
			rec.Health(p.ID, p.healthy, p.reason)
		}
	}
	for _, sc := range o.sticky {
		i := slices.Index(ids, sc.Device)
		c := &condition{since: sc.Since, actionSeen: sc.ActionSeen, kept: sc.extra}
		var k kind
		switch sc.Kind {
		case StickyXID:
			k, c.xid, c.reason = condXID, sc.XID, fmt.Sprintf("xid=%d", sc.XID)
		case StickyECC:
			k, c.reason = condECC, "ecc=double-bit"
		default:
			// A newer release's kind, saved before a rollback: kept for
			// it to read again, but no business of this release's.
			log.Info("keeping a saved sticky condition of a kind this release does not know (a newer release wrote it); it changes no device's health",
				"device", sc.Device, "kind", sc.Kind)
			w.foreign = append(w.foreign, sc)
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

// Run polls at the policy's interval and applies events until ctx ends
// or events is closed. Unless Poll has run already, it polls at once, so
// a GPU that is already hot is reported before the first interval passes.
func (w *Watcher) Run(ctx context.Context, events <-chan nvml.Event) {
	if !w.polled {
		w.Poll()
	}
	w.turned()
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
			w.turned()
		case <-w.clearWake:
			w.applyClears()
		}
	}
}

// OnTurn has Run call f after each poll: the plugin's liveness, which a
// poll stuck in NVML stops.
func OnTurn(f func()) Option { return func(o *options) { o.onTurn = f } }

func (w *Watcher) turned() {
	if w.onTurn != nil {
		w.onTurn()
	}
}

// Event applies one NVML event.
func (w *Watcher) Event(ev nvml.Event) {
	w.applyClears()
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
		w.seenXID(ev.GPU, ev.XID)
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

// Poll samples every GPU once and applies the results.
func (w *Watcher) Poll() {
	w.applyClears()
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
	// The remediation hears the facts before the notifier chain, which it
	// is part of, hears the health.
	w.passFacts(i)
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
		level := slog.LevelWarn
		if reason == reasonMIGEnabled && *wasReason == "" || *wasReason == ReasonRelaidOut && healthy {
			// The layout has warned about the GPU in MIG mode, once, with
			// what to do; the health record stays, below it. A device a
			// new MIG layout serves is said by the relayout.
			level = slog.LevelInfo
		}
		w.log.Log(context.Background(), level, "GPU health changed", "device", id, "old", old, "new", state, "reason", reason, "oldReason", *wasReason)
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

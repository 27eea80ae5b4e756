package health

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// Sampler reads one GPU's polled state; nvml.Monitor is one.
type Sampler interface {
	Sample(i int) nvml.Sample
}

// Notifier receives every health transition; deviceplugin.Server is one.
type Notifier interface {
	SetHealth(id string, healthy bool, reason string) bool
}

// Recorder counts transitions for metrics. It may be nil.
type Recorder interface {
	Health(device string, healthy bool)
	Transition(device string, healthy bool)
}

// kind orders the conditions in a reason string.
type kind int

const (
	condNVML kind = iota
	condLost
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
}

type gpuState struct {
	conds [numKinds]*condition
	// goodPolls counts consecutive polls that would clear the thermal,
	// power or lost conditions.
	goodPolls int
	healthy   bool
	reason    string
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
}

// NewWatcher watches the GPUs whose device IDs are ids, in the order the
// Sampler and events index them. Every GPU starts healthy.
func NewWatcher(p Policy, ids []string, s Sampler, n Notifier, rec Recorder, log *slog.Logger) (*Watcher, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("health policy: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{policy: p, ids: ids, sampler: s, notify: n, rec: rec, log: log, now: time.Now, gpus: make([]gpuState, len(ids))}
	for i := range w.gpus {
		w.gpus[i].healthy = true
		if rec != nil {
			rec.Health(ids[i], true)
		}
	}
	return w, nil
}

// Run polls at the policy's interval and applies events until ctx ends
// or events is closed. It polls once at once, so a GPU that is already
// hot is reported before the first interval passes.
func (w *Watcher) Run(ctx context.Context, events <-chan nvml.Event) {
	w.Poll()
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
	switch ev.Kind {
	case nvml.EventDoubleBitECC:
		g.conds[condECC] = &condition{reason: "ecc=double-bit"}
	case nvml.EventXID:
		reason := fmt.Sprintf("xid=%d", ev.XID)
		switch w.policy.xid(ev.XID) {
		case xidIgnore:
			w.log.Info("ignoring application XID", "device", w.ids[ev.GPU], "xid", ev.XID)
			return
		case xidSticky:
			g.conds[condXID] = &condition{reason: reason}
		case xidTransient:
			// A sticky XID is never downgraded by a later transient one.
			if c := g.conds[condXID]; c == nil || !c.until.IsZero() {
				g.conds[condXID] = &condition{reason: reason, until: w.now().Add(w.policy.XIDRecovery)}
			}
		}
	default:
		return
	}
	w.publish(ev.GPU)
}

// Poll samples every GPU once and applies the results.
func (w *Watcher) Poll() {
	samples := make([]nvml.Sample, len(w.gpus))
	allFailed := len(w.gpus) > 0
	for i := range w.gpus {
		samples[i] = w.sampler.Sample(i)
		if samples[i].Err == nil || samples[i].Lost {
			allFailed = false
		}
	}
	now := w.now()
	for i := range w.gpus {
		w.apply(i, samples[i], allFailed, now)
		w.publish(i)
	}
}

func (w *Watcher) apply(i int, s nvml.Sample, allFailed bool, now time.Time) {
	g := &w.gpus[i]
	if c := g.conds[condXID]; c != nil && !c.until.IsZero() && !now.Before(c.until) {
		g.conds[condXID] = nil
	}
	if s.Err != nil {
		g.goodPolls = 0
		switch {
		case s.Lost:
			g.conds[condLost] = &condition{reason: "gpu-lost"}
		case allFailed:
			// NVML is broken as a whole: no GPU can be vouched for.
			g.conds[condNVML] = &condition{reason: "nvml: " + s.Err.Error()}
		default:
			// One GPU's read failing says nothing about its health.
			w.log.Warn("reading GPU health", "device", w.ids[i], "err", s.Err)
		}
		return
	}
	g.conds[condNVML] = nil
	hot := s.SlowdownC > 0 && s.TempC >= s.SlowdownC
	if hot && g.conds[condThermal] == nil {
		g.conds[condThermal] = &condition{reason: fmt.Sprintf("thermal=%dC>=slowdown %dC", s.TempC, s.SlowdownC)}
	}
	hw := hwReasons(s.Reasons)
	if hw != "" && g.conds[condHW] == nil {
		g.conds[condHW] = &condition{reason: hw}
	}
	if hot || hw != "" {
		g.goodPolls = 0
		return
	}
	cool := s.SlowdownC == 0 || s.TempC < s.SlowdownC-w.policy.ThermalMarginC
	if g.conds[condThermal] == nil && g.conds[condHW] == nil && g.conds[condLost] == nil {
		g.goodPolls = 0
		return
	}
	if !cool {
		g.goodPolls = 0
		return
	}
	g.goodPolls++
	if g.goodPolls >= w.policy.RecoveryPolls {
		g.conds[condThermal], g.conds[condHW], g.conds[condLost] = nil, nil, nil
		g.goodPolls = 0
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

// publish reports GPU i's state if it changed, and logs the transition.
func (w *Watcher) publish(i int) {
	g := &w.gpus[i]
	var reasons []string
	for _, c := range g.conds {
		if c != nil {
			reasons = append(reasons, c.reason)
		}
	}
	healthy, reason := len(reasons) == 0, strings.Join(reasons, ", ")
	if healthy == g.healthy && reason == g.reason {
		return
	}
	old := "Healthy"
	if !g.healthy {
		old = "Unhealthy"
	}
	state := "Healthy"
	if !healthy {
		state = "Unhealthy"
	}
	if healthy != g.healthy {
		w.log.Warn("GPU health changed", "device", w.ids[i], "old", old, "new", state, "reason", reason, "oldReason", g.reason)
		if w.rec != nil {
			w.rec.Health(w.ids[i], healthy)
			w.rec.Transition(w.ids[i], healthy)
		}
	} else {
		w.log.Info("GPU health reason changed", "device", w.ids[i], "state", state, "reason", reason, "oldReason", g.reason)
	}
	g.healthy, g.reason = healthy, reason
	w.notify.SetHealth(w.ids[i], healthy, reason)
}

// State returns GPU i's current health and reason.
func (w *Watcher) State(i int) (healthy bool, reason string) {
	return w.gpus[i].healthy, w.gpus[i].reason
}

package health

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

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
		g.set(condMIG, reasonMIGEnabled)
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
		g.conds[condRecovery], g.action = nil, nvml.RecoveryNone
	case s.Has(nvml.SignalRecoveryAction):
		w.applyRecovery(i, s.RecoveryAction)
	}
	switch {
	case !p.Enabled(policy.CheckRemappedRows) || s.Unsupported&nvml.SignalRemappedRows != 0:
		g.conds[condRemap] = nil
	case !s.Has(nvml.SignalRemappedRows):
	case s.RowRemapFailure:
		g.set(condRemap, reasonRemapFailure)
	case s.RowRemapPending:
		g.set(condRemap, reasonRemapPending)
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
	g.action = a
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

// reasonMIGEnabled is the health reason of a GPU in MIG mode served whole,
// or with no MIG device to serve.
const reasonMIGEnabled = "mig-enabled"

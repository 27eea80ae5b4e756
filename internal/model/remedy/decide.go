package remedy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

// Facts are what the driver says about one GPU now, as the health watcher
// read them.
type Facts struct {
	// Action is the driver's recovery action (R550+); RecoveryNone before
	// R550 or with the recovery-action check off.
	Action nvml.RecoveryAction
	// XIDs are the XIDs seen on the GPU. They are events: a Fault adds
	// them to those of the remediation under way.
	XIDs []uint64
	// RowRemapPending means a remapping waits for a reset;
	// RowRemapFailure that one could not be done.
	RowRemapPending bool
	RowRemapFailure bool
	// Lost means NVML answers GPU_IS_LOST: the GPU is off the bus.
	Lost bool
	// Health is the health watcher's reason ("thermal=91C>=slowdown 90C"),
	// named in the reason when no fact above calls for a remedy.
	Health string
}

// Decision is what a GPU's facts call for. Its values are lowerCamelCase,
// for list and metrics.
type Decision string

// The decisions, from the mildest. A GPU's decision is the worst its facts
// call for.
const (
	// DecisionWatch: nothing for this package to do. Health keeps the GPU
	// out while its own rules say so.
	DecisionWatch Decision = "watch"
	// DecisionDrain: withhold the GPU until its work has ended and the
	// driver stops asking for a drain, then probe it and give it back.
	DecisionDrain Decision = "drain"
	// DecisionReset: drain, reset when idle, probe, give back.
	DecisionReset Decision = "reset"
	// DecisionHuman: withhold until a human has looked (Release).
	DecisionHuman Decision = "human"
	// DecisionReboot: withhold and say the node needs a reboot.
	DecisionReboot Decision = "reboot"
	// DecisionWithPeer is the decision of a GPU held out only because its
	// NVLink peer's reset must include it; it has no fault of its own.
	DecisionWithPeer Decision = "withPeer"
)

func (d Decision) rank() int {
	switch d {
	case DecisionWithPeer:
		return 0
	case DecisionWatch:
		return 1
	case DecisionDrain:
		return 2
	case DecisionReset:
		return 3
	case DecisionHuman:
		return 4
	case DecisionReboot:
		return 5
	}
	return 4 // a newer release's decision: a human's
}

// Verdict is a decision and why, in words for list, logs and Events.
type Verdict struct {
	Decision Decision
	Reason   string
}

// XIDClass says what one XID calls for when the driver names no recovery
// action (before R550, or with that check off) and why.
type XIDClass struct {
	XID      uint64
	Decision Decision
	Why      string
}

// xidClass is what x calls for, from NVIDIA's XID catalog (package xid,
// the table health's default lists come from too); false for an XID the
// catalog leaves to health's rules and to the driver's recovery action.
func xidClass(x uint64) (XIDClass, bool) {
	e, _ := xid.Lookup(x)
	if e.Remedy == xid.RemedyWatch {
		return XIDClass{}, false
	}
	return XIDClass{XID: x, Decision: Decision(e.Remedy), Why: e.Why}, true
}

// XIDClasses is the table of XIDs this package remedies, for docs.
func XIDClasses() []XIDClass {
	var out []XIDClass
	for _, e := range xid.Catalog() {
		if c, ok := xidClass(e.XID); ok {
			out = append(out, c)
		}
	}
	return out
}

// Rule is one row of the decision table: a fact, what it calls for, why.
type Rule struct {
	Fact     string
	Decision Decision
	Why      string
}

// Rules is the whole decision table, in the order Decide applies it, for
// docs and list.
func Rules() []Rule {
	var out []Rule
	for _, a := range []nvml.RecoveryAction{nvml.RecoveryReset, nvml.RecoveryDrainAndReset, nvml.RecoveryDrainP2P, nvml.RecoveryReboot, nvml.RecoveryIMEXDomain} {
		v := actionVerdict(a)
		out = append(out, Rule{"recovery-action=" + a.String(), v.Decision, v.Reason})
	}
	out = append(out,
		Rule{"gpu-lost", DecisionReboot, reasonLost},
		Rule{"row-remap-failure", DecisionHuman, reasonRemapFailure},
		Rule{"row-remap-pending", DecisionReset, reasonRemapPending},
	)
	for _, c := range XIDClasses() {
		out = append(out, Rule{fmt.Sprintf("xid=%d", c.XID), c.Decision, c.Why})
	}
	out = append(out, Rule{"any other XID or health reason", DecisionWatch, "no remedy here: health's own rules keep the GPU out and let it back"})
	return out
}

const (
	reasonLost         = "NVML cannot reach the GPU, so it cannot be reset through NVML; the node needs a reboot"
	reasonRemapFailure = "a row could not be remapped: the memory needs a human (RMA)"
	reasonRemapPending = "a row remap waits for a reset to take effect"
)

func actionVerdict(a nvml.RecoveryAction) Verdict {
	switch a {
	case nvml.RecoveryNone:
		return Verdict{DecisionWatch, ""}
	case nvml.RecoveryReset:
		return Verdict{DecisionReset, "the driver asks for a GPU reset"}
	case nvml.RecoveryDrainAndReset:
		return Verdict{DecisionReset, "the driver asks to drain the GPU's peer-to-peer traffic and reset it"}
	case nvml.RecoveryDrainP2P:
		return Verdict{DecisionDrain, "the driver asks to drain the GPU's peer-to-peer traffic; no reset"}
	case nvml.RecoveryReboot:
		return Verdict{DecisionReboot, "the driver asks for a node reboot"}
	case nvml.RecoveryIMEXDomain:
		return Verdict{DecisionHuman, "the driver asks to recover the IMEX domain, which this plugin does not do"}
	}
	return Verdict{DecisionHuman, "the driver asks for a recovery action this release does not know"}
}

// Decide says what f calls for: the worst decision any fact calls for, with
// every fact's reason, worst first ("xid=79: fallen off the bus: ...;
// row-remap-pending: ...").
func Decide(f Facts) Verdict {
	type part struct {
		d      Decision
		reason string
	}
	var parts []part
	add := func(d Decision, fact, why string) {
		parts = append(parts, part{d, fact + ": " + why})
	}
	if f.Action != nvml.RecoveryNone {
		v := actionVerdict(f.Action)
		add(v.Decision, "recovery-action="+f.Action.String(), v.Reason)
	}
	if f.Lost {
		add(DecisionReboot, "gpu-lost", reasonLost)
	}
	if f.RowRemapFailure {
		add(DecisionHuman, "row-remap-failure", reasonRemapFailure)
	}
	if f.RowRemapPending {
		add(DecisionReset, "row-remap-pending", reasonRemapPending)
	}
	for _, x := range f.XIDs {
		if c, ok := xidClass(x); ok {
			add(c.Decision, fmt.Sprintf("xid=%d", x), c.Why)
		}
	}
	if len(parts) == 0 {
		why := "no fact this plugin remedies"
		if f.Health != "" {
			why = f.Health + ": " + why + "; health's rules apply"
		}
		if x := otherXIDs(f.XIDs); x != "" {
			why += " (" + x + ")"
		}
		return Verdict{DecisionWatch, why}
	}
	slices.SortStableFunc(parts, func(a, b part) int { return b.d.rank() - a.d.rank() })
	reasons := make([]string, len(parts))
	for i, p := range parts {
		reasons[i] = p.reason
	}
	return Verdict{parts[0].d, strings.Join(reasons, "; ")}
}

func otherXIDs(xids []uint64) string {
	var out []string
	for _, x := range xids {
		out = append(out, fmt.Sprintf("xid=%d", x))
	}
	return strings.Join(out, ", ")
}

// merge adds f's XIDs to the held ones and takes f's polled facts.
func (f Facts) merge(held []uint64) Facts {
	xids := slices.Clone(held)
	for _, x := range f.XIDs {
		if !slices.Contains(xids, x) {
			xids = append(xids, x)
		}
	}
	f.XIDs = xids
	return f
}

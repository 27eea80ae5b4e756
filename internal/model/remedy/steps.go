package remedy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// The steps a remediation takes between the events: starting, withholding,
// waiting for a GPU's group to go idle, resetting, probing, giving back.

// start begins a remediation of a GPU that is serving or watched.
func (m *Machine) start(r *record, v Verdict) {
	switch v.Decision {
	case DecisionReboot, DecisionHuman:
		m.terminal(r, v)
	case DecisionDrain:
		r.decision, r.reason, r.group = DecisionDrain, v.Reason, []string{r.uuid}
		m.withhold(r, StateDraining, v.Reason)
	case DecisionReset:
		m.toReset(r, v)
	default:
		r.decision, r.reason = DecisionWatch, v.Reason
		m.setState(r, StateWatching, v.Reason)
	}
}

// toReset makes r's remediation a reset, if the policy and budget allow.
func (m *Machine) toReset(r *record, v Verdict) {
	if !m.p.Reset {
		// Health alone keeps it out, as before this package.
		reason := v.Reason + "; automatic resets are off (reset: false)"
		if r.state.IsWithheld() {
			m.serve(r, reason)
		}
		r.decision, r.reason = DecisionReset, reason
		m.setState(r, StateWatching, reason)
		return
	}
	if n := len(r.resets); n >= m.p.MaxResets {
		m.human(r, fmt.Sprintf("%s; its reset budget is spent: %d resets in the last %s (maxResets %d)", v.Reason, n, m.p.Window, m.p.MaxResets))
		return
	}
	r.decision, r.reason = DecisionReset, v.Reason
	if r.heldFor != "" {
		return // a member of a peer's group: that reset serves it too
	}
	group, why := m.resetGroup(r.uuid)
	if len(group) > 1 && !m.p.ResetPeers {
		m.human(r, fmt.Sprintf("%s; a reset must include its NVLink peers %s (%s), and resetPeers is off: reset them together by hand (nvidia-smi -r -i %s) or reboot, then release",
			v.Reason, strings.Join(group[1:], ","), why, strings.Join(group, ",")))
		return
	}
	r.group = group
	if r.state == StateProbing {
		// Again, after a fault while probing: a new cycle.
		r.evicted, r.stopSent = false, false
	}
	if !r.state.waiting() {
		m.withhold(r, StateDraining, v.Reason)
	}
}

// terminal puts r out for a human or a reboot, as v says.
func (m *Machine) terminal(r *record, v Verdict) {
	if v.Decision == DecisionReboot {
		m.reboot(r, v.Reason)
		return
	}
	m.human(r, v.Reason)
}

func (m *Machine) human(r *record, reason string) {
	m.leave(r)
	r.decision, r.reason = DecisionHuman, reason
	m.withhold(r, StateNeedsHuman, reason)
	m.emit(Command{Kind: CmdNeedsHuman, GPU: r.uuid, Reason: reason})
}

func (m *Machine) reboot(r *record, reason string) {
	m.leave(r)
	r.decision, r.reason = DecisionReboot, reason
	m.withhold(r, StateNeedsReboot, reason)
	m.rebootCommands(r.uuid, reason)
}

func (m *Machine) rebootCommands(gpu, reason string) {
	m.emit(Command{Kind: CmdNodeReboot, GPU: gpu, Reason: reason})
	if m.p.Cordon {
		m.emit(Command{Kind: CmdCordon, GPU: gpu, Reason: reason})
	}
}

// leave takes r out of any group; advance gives back or re-leads the
// members it held.
func (m *Machine) leave(r *record) {
	r.group, r.heldFor, r.then, r.refault, r.waiting = nil, "", Verdict{}, false, ""
}

// withhold moves r to s, telling the caller to withhold it if it was not.
func (m *Machine) withhold(r *record, s State, reason string) {
	if !r.state.IsWithheld() {
		m.emit(Command{Kind: CmdWithhold, GPU: r.uuid, Reason: reason})
		r.started, r.evicted, r.stopSent = m.now, false, false
	}
	m.setState(r, s, reason)
}

// serve ends r's remediation; a withheld GPU is given back.
func (m *Machine) serve(r *record, reason string) {
	if r.state.IsWithheld() {
		took := m.now.Sub(r.started)
		m.emit(Command{Kind: CmdGiveBack, GPU: r.uuid, Took: took, Reason: reason})
	}
	m.leave(r)
	r.decision, r.reason, r.facts, r.evicted, r.stopSent, r.started = "", "", Facts{}, false, false, time.Time{}
	m.setState(r, StateServing, reason)
}

func (m *Machine) probe(r *record) {
	r.waiting = ""
	m.setState(r, StateProbing, "probing before it is given back")
	m.emit(Command{Kind: CmdProbe, GPU: r.uuid, Reason: r.reason})
}

func (m *Machine) setState(r *record, s State, reason string) {
	if r.state != s {
		m.emit(Command{Kind: CmdTransition, GPU: r.uuid, From: r.state, To: s, Reason: reason})
		r.state, r.since = s, m.now
	}
}

// advance moves every waiting remediation as far as it can go now.
func (m *Machine) advance() {
	// A member whose leader no longer leads it: its own reset, or back.
	for _, id := range m.order {
		r := m.recs[id]
		if r.heldFor == "" || !r.state.waiting() {
			continue
		}
		l := m.recs[r.heldFor]
		if l != nil && l.heldFor == "" && (l.state.waiting() || l.state == StateResetting) && slices.Contains(l.group, id) {
			continue
		}
		r.heldFor = ""
		switch r.decision {
		case DecisionWithPeer:
			m.serve(r, "its NVLink peer's remediation ended before a reset")
		case DecisionDrain:
			r.group = []string{r.uuid}
		default:
			r.group = nil
			m.toReset(r, Verdict{r.decision, r.reason})
		}
	}
	for _, id := range m.order {
		if r := m.recs[id]; r.heldFor == "" && r.state.waiting() {
			m.lead(r)
		}
	}
}

// lead drives r's group towards its reset (or, for a drain, its probe).
func (m *Machine) lead(r *record) {
	if len(r.group) == 0 {
		r.group = []string{r.uuid}
	}
	r.group = slices.DeleteFunc(r.group, func(id string) bool { return m.recs[id] == nil })
	members := r.group
	var blocked []string
	for _, id := range members[1:] {
		p := m.recs[id]
		switch {
		case p.heldFor == r.uuid:
		case p.state.terminal() || p.state == StateResetting || p.state == StateProbing || p.heldFor != "":
			blocked = append(blocked, fmt.Sprintf("NVLink peer %s is %s", id, p.state))
		case p.state.waiting():
			// Its own remediation: the group's reset serves it too, and
			// the members it held (all in r's group) are r's now.
			for _, q := range m.recs {
				if q.heldFor == p.uuid {
					q.heldFor = r.uuid
				}
			}
			p.heldFor, p.group = r.uuid, nil
		default:
			p.decision = DecisionWithPeer
			p.heldFor, p.group = r.uuid, nil
			p.reason = "held for the reset of its NVLink peer " + r.uuid
			m.withhold(p, StateDraining, p.reason)
		}
	}
	if len(blocked) > 0 {
		m.wait(r, r.state, "waiting: "+strings.Join(blocked, "; "))
		return
	}
	var pending []string
	var holding []string
	for _, id := range members {
		u, ok := m.usage[id]
		switch {
		case !ok || u.at.Before(m.recs[id].started):
			pending = append(pending, "no usage report since it was withheld for "+id)
		case u.Holders > 0:
			holding = append(holding, id)
			pending = append(pending, fmt.Sprintf("%d holder(s) on %s", u.Holders, id))
		}
	}
	if len(pending) > 0 {
		wait := strings.Join(pending, "; ")
		switch {
		case len(holding) == 0:
		case !m.p.Evict:
			wait += "; eviction is off, so it waits for them to end"
		default:
			for _, id := range holding {
				p := m.recs[id]
				at := p.started.Add(m.p.GracePeriod)
				switch {
				case p.evicted:
					wait += "; eviction of " + id + "'s holders asked"
				case m.now.Before(at):
					wait += "; evicting " + id + "'s holders at " + at.UTC().Format(time.RFC3339)
				default:
					p.evicted = true
					m.emit(Command{Kind: CmdEvict, GPU: id, Reason: fmt.Sprintf("its holders had the grace period (%s); %s", m.p.GracePeriod, p.reason)})
				}
			}
		}
		m.wait(r, StateDraining, wait)
		return
	}
	var busy []string
	for _, id := range members {
		u, p := m.usage[id], m.recs[id]
		if u.MPSRunning && !p.stopSent {
			p.stopSent = true
			m.emit(Command{Kind: CmdStopMPS, GPU: id, Reason: "before its reset or probe"})
		}
		if u.MPSRunning {
			busy = append(busy, "the MPS daemon of "+id+" is stopping")
		}
		if u.Processes > 0 {
			busy = append(busy, fmt.Sprintf("%d process(es) on %s with no pod holding it", u.Processes, id))
		}
	}
	if len(members) > 1 {
		var others []string
		for _, id := range m.order {
			if slices.Contains(members, id) {
				continue
			}
			if u, ok := m.usage[id]; !ok || u.at.Before(r.started) {
				others = append(others, "no usage report since "+r.uuid+" was withheld for "+id)
			} else if u.Processes > 0 {
				others = append(others, fmt.Sprintf("%d process(es) on %s", u.Processes, id))
			}
		}
		if len(others) > 0 {
			busy = append(busy, "nvidia-smi resets GPUs together only while no GPU of the node runs a compute process: "+strings.Join(others, ", "))
		}
	}
	if r.decision == DecisionDrain && r.facts.Action == nvml.RecoveryDrainP2P {
		busy = append(busy, "the driver still asks for a drain")
	}
	if len(busy) > 0 {
		m.wait(r, StateWaitingIdle, strings.Join(busy, "; "))
		return
	}
	if r.decision == DecisionDrain {
		m.probe(r)
		return
	}
	for _, id := range members {
		p := m.recs[id]
		if p.decision == DecisionReset {
			p.resets = append(p.resets, m.now)
		}
		p.group, p.waiting = slices.Clone(members), ""
		m.setState(p, StateResetting, "idle; resetting")
	}
	m.emit(Command{Kind: CmdReset, GPU: r.uuid, GPUs: slices.Clone(members), Reason: r.reason})
}

// wait puts leader r and the members it holds in s, waiting for what wait
// says.
func (m *Machine) wait(r *record, s State, wait string) {
	for _, id := range r.group {
		if p := m.recs[id]; p == r || p.heldFor == r.uuid {
			p.waiting = wait
			m.setState(p, s, wait)
		}
	}
}

package remedy

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
)

// Saved is the Machine's state across restarts, as Save returns it and New
// takes it. The caller writes it with internal/state (the file is tagged
// with the boot: a reboot resets the GPUs, and with them every
// remediation and budget).
//
// The previous and the next release read what this one saved: keys are
// only added, and keys this release does not know, at the top and on a
// GPU, are kept and written back while that GPU's record lasts. A state
// this release does not know is taken as needsHuman.
type Saved struct {
	GPUs  []SavedGPU `json:"gpus,omitempty"`
	extra jsonkeep.Fields
}

// SavedGPU is one GPU's remediation. GPUs serving with no reset in the
// window are left out.
type SavedGPU struct {
	UUID     string   `json:"uuid"`
	State    State    `json:"state"`
	Decision Decision `json:"decision,omitempty"`
	Reason   string   `json:"reason,omitempty"`
	// Since is when it entered State; Started when it was withheld.
	Since   time.Time `json:"since,omitzero"`
	Started time.Time `json:"started,omitzero"`
	// RecoveryAction is the driver's last action for it, NVML's number.
	RecoveryAction int      `json:"recoveryAction,omitempty"`
	XIDs           []uint64 `json:"xids,omitempty"`
	// ResetGroup is the group a leader drives (or, resetting, every
	// member's); HeldFor the leader holding this GPU.
	ResetGroup []string `json:"resetGroup,omitempty"`
	HeldFor    string   `json:"heldFor,omitempty"`
	Evicted    bool     `json:"evicted,omitempty"`
	// Resets are when its own faults caused a reset, within the window.
	Resets []time.Time `json:"resets,omitempty"`
	// Then is a terminal decision that arrived while a reset or probe was
	// out; Refault a fault calling for a reset while probing.
	Then       Decision `json:"then,omitempty"`
	ThenReason string   `json:"thenReason,omitempty"`
	Refault    bool     `json:"refault,omitempty"`
	extra      jsonkeep.Fields
}

// UnmarshalJSON keeps the keys this release has no field for.
func (s *Saved) UnmarshalJSON(b []byte) error {
	type plain Saved
	return jsonkeep.Unmarshal[plain](b, s, &s.extra)
}

// MarshalJSON writes the kept keys back.
func (s Saved) MarshalJSON() ([]byte, error) {
	type plain Saved
	return jsonkeep.Marshal[plain](s, s.extra)
}

// UnmarshalJSON keeps the keys this release has no field for.
func (g *SavedGPU) UnmarshalJSON(b []byte) error {
	type plain SavedGPU
	return jsonkeep.Unmarshal[plain](b, g, &g.extra)
}

// MarshalJSON writes the kept keys back.
func (g SavedGPU) MarshalJSON() ([]byte, error) {
	type plain SavedGPU
	return jsonkeep.Marshal[plain](g, g.extra)
}

// Save returns the state to restore after a restart. Save it after every
// call that returned commands, before carrying them out: a reset must be
// on disk as resetting before it starts, so a restart probes instead of
// resetting again or counting it twice.
func (m *Machine) Save() Saved {
	out := Saved{extra: m.kept}
	for _, id := range m.order {
		r := m.recs[id]
		if r.state == StateServing && len(r.resets) == 0 {
			continue
		}
		out.GPUs = append(out.GPUs, r.saved())
	}
	for _, r := range m.absent {
		out.GPUs = append(out.GPUs, r.saved())
	}
	return out
}

// Status is each saved GPU's status, for a look at the file without a
// Machine (list): its resets are those within window of now. What the
// file does not keep is left out: Waiting, and Absent (the caller knows
// which GPUs are on the node).
func (s Saved) Status(window time.Duration, now time.Time) []Status {
	out := make([]Status, 0, len(s.GPUs))
	for _, g := range s.GPUs {
		resets := 0
		for _, t := range g.Resets {
			if now.Sub(t) < window {
				resets++
			}
		}
		out = append(out, Status{
			GPU: g.UUID, State: g.State, Decision: g.Decision, Reason: g.Reason, Since: g.Since,
			Resets: resets, HeldFor: g.HeldFor, ResetGroup: slices.Clone(g.ResetGroup),
		})
	}
	return out
}

func (r *record) saved() SavedGPU {
	return SavedGPU{
		UUID: r.uuid, State: r.state, Decision: r.decision, Reason: r.reason,
		Since: r.since, Started: r.started, RecoveryAction: int(r.facts.Action),
		XIDs: slices.Clone(r.facts.XIDs), ResetGroup: slices.Clone(r.group), HeldFor: r.heldFor,
		Evicted: r.evicted, Resets: slices.Clone(r.resets), Then: r.then.Decision, ThenReason: r.then.Reason,
		Refault: r.refault, extra: r.kept,
	}
}

// restore takes back one saved GPU. Nothing is done blindly: a GPU found
// resetting is probed, never reset again nor counted twice; a GPU no
// longer on the node is dropped, unless a human or a reboot is still owed,
// or it was resetting (the reset may have left it removed): then a human is.
func (m *Machine) restore(s SavedGPU) {
	r := &record{
		uuid: s.UUID, state: s.State, decision: s.Decision, reason: s.Reason, since: s.Since, started: s.Started,
		facts: Facts{Action: nvml.RecoveryAction(s.RecoveryAction), XIDs: s.XIDs},
		group: s.ResetGroup, heldFor: s.HeldFor, evicted: s.Evicted, resets: s.Resets,
		then:    Verdict{s.Then, s.ThenReason},
		refault: s.Refault, kept: s.extra,
	}
	r.resets = slices.DeleteFunc(r.resets, func(t time.Time) bool { return m.now.Sub(t) >= m.p.Window })
	if _, here := m.recs[s.UUID]; !here {
		if r.state == StateResetting {
			// Killed in its reset: the reset may have left it removed,
			// out of NVML's view until a rediscovery. It cannot be
			// probed, and is not forgotten: a human looks.
			r.group, r.heldFor, r.then, r.refault = nil, "", Verdict{}, false
			r.decision, r.reason = DecisionHuman, "found resetting after a restart and not on the node: the reset may have left it removed from NVML's view "+
				"(look with nvidia-smi; rediscover it or reboot the node), it was out because "+s.Reason
			m.emit(Command{Kind: CmdTransition, GPU: r.uuid, From: r.state, To: StateNeedsHuman, Reason: r.reason})
			r.state, r.since = StateNeedsHuman, m.now
			m.emit(Command{Kind: CmdNeedsHuman, GPU: r.uuid, Reason: r.reason})
		}
		if r.state.terminal() {
			r.absent = true
			m.absent = append(m.absent, r)
			m.note(s.UUID, "kept in %s though the GPU is not on the node since the restart (gone, lost or renamed): a reboot or a release ends it", r.state)
			if r.state == StateNeedsReboot {
				m.rebootCommands(r.uuid, r.reason)
			}
			return
		}
		m.note(s.UUID, "dropping its saved remediation (%s): the GPU is not on the node since the restart (gone or renamed)", s.State)
		return
	}
	m.recs[s.UUID] = r
	withhold := func() { m.emit(Command{Kind: CmdWithhold, GPU: r.uuid, Reason: "restored: " + r.reason}) }
	switch s.State {
	case StateServing, StateWatching:
		// Health tells again what it still sees.
		r.state, r.decision, r.reason, r.facts, r.group, r.heldFor = StateServing, "", "", Facts{}, nil, ""
	case StateDraining, StateWaitingIdle:
		withhold()
		if r.heldFor == "" && r.decision == DecisionReset {
			// The topology or Fabric Manager may have changed.
			r.group = nil
			m.toReset(r, Verdict{r.decision, r.reason})
		}
	case StateResetting:
		withhold()
		r.group, r.heldFor = nil, ""
		if r.then.Decision != "" {
			m.terminal(r, r.then)
			break
		}
		m.note(r.uuid, "found resetting after a restart: whether the reset ran is unknown, so it is probed, not reset again")
		m.probe(r)
	case StateProbing:
		withhold()
		r.group, r.heldFor = nil, ""
		m.emit(Command{Kind: CmdProbe, GPU: r.uuid, Reason: r.reason})
	case StateNeedsHuman:
		withhold()
		m.emit(Command{Kind: CmdNeedsHuman, GPU: r.uuid, Reason: r.reason})
	case StateNeedsReboot:
		withhold()
		m.rebootCommands(r.uuid, r.reason)
	default:
		withhold()
		r.state = StateNeedsHuman
		r.decision, r.reason = DecisionHuman, fmt.Sprintf("saved in state %q, which this release does not know (a newer release wrote it): %s", s.State, s.Reason)
		r.since = m.now
		m.emit(Command{Kind: CmdNeedsHuman, GPU: r.uuid, Reason: r.reason})
	}
}

package remedy

import (
	"slices"
	"time"
)

// Status is one GPU's remediation, for list (lowerCamelCase keys) and
// metrics.
type Status struct {
	GPU      string   `json:"gpu"`
	State    State    `json:"state"`
	Decision Decision `json:"decision,omitempty"`
	// Reason says why it is out or watched; Waiting what it waits for now.
	Reason  string    `json:"reason,omitempty"`
	Waiting string    `json:"waiting,omitempty"`
	Since   time.Time `json:"since,omitzero"`
	// Resets are the resets its own faults caused within the window.
	Resets int `json:"resets"`
	// HeldFor is the NVLink peer whose reset holds it; ResetGroup the
	// GPUs reset together with it.
	HeldFor    string   `json:"heldFor,omitempty"`
	ResetGroup []string `json:"resetGroup,omitempty"`
	// Absent marks a GPU out for a human or a reboot that is not on the
	// node since the restart.
	Absent bool `json:"absent,omitempty"`
}

// Status returns every GPU's status, in the node's order, then those
// absent.
func (m *Machine) Status() []Status {
	var out []Status
	for _, id := range m.order {
		out = append(out, m.recs[id].status())
	}
	for _, r := range m.absent {
		out = append(out, r.status())
	}
	return out
}

// StatusOf returns gpu's status.
func (m *Machine) StatusOf(gpu string) (Status, bool) {
	if r := m.recs[gpu]; r != nil {
		return r.status(), true
	}
	return Status{}, false
}

func (r *record) status() Status {
	return Status{
		GPU: r.uuid, State: r.state, Decision: r.decision, Reason: r.reason, Waiting: r.waiting,
		Since: r.since, Resets: len(r.resets), HeldFor: r.heldFor, ResetGroup: slices.Clone(r.group), Absent: r.absent,
	}
}

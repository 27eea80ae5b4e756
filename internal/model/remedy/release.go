package remedy

import (
	"errors"
	"fmt"
)

// ErrUnknownGPU is Releasable's error for a GPU neither on the node nor
// kept out from before a restart.
var ErrUnknownGPU = errors.New("no such GPU on this node")

// NotTerminalError is Releasable's error for a GPU that is not out for a
// human or a reboot: its remediation ends by itself, or it has none.
type NotTerminalError struct {
	GPU   string
	State State
}

func (e *NotTerminalError) Error() string {
	return fmt.Sprintf("%s is %s, not %s or %s: only those wait for a human", e.GPU, e.State, StateNeedsHuman, StateNeedsReboot)
}

// Releasable says whether a human's release (the release command) may end
// gpu's remediation now, and returns its status. Only a GPU out for a
// human or a reboot is released that way: Release itself would also end a
// remediation still under way, which nobody should have to do by hand.
func (m *Machine) Releasable(gpu string) (Status, error) {
	st, ok := m.StatusOf(gpu)
	if !ok {
		i := -1
		for j, a := range m.absent {
			if a.uuid == gpu {
				i = j
			}
		}
		if i < 0 {
			return Status{}, fmt.Errorf("%s: %w", gpu, ErrUnknownGPU)
		}
		st = m.absent[i].status()
	}
	if !st.State.IsTerminal() {
		return st, &NotTerminalError{GPU: gpu, State: st.State}
	}
	return st, nil
}

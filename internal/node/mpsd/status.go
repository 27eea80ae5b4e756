package mpsd

import (
	"context"
	"fmt"
	"strings"
)

// Changes receives after any daemon's state changes (coalesced: read
// State after each receive).
func (m *Manager) Changes() <-chan struct{} { return m.changes }

// Running says whether the manager runs a daemon for the GPU (up or not).
func (m *Manager) Running(uuid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.daemons[uuid]
	return ok
}

// WaitUp waits until the daemon of the GPU with uuid is up. It fails at
// once when the manager runs none for it, and when ctx ends first, with
// the daemon's last error.
func (m *Manager) WaitUp(ctx context.Context, uuid string) error {
	for {
		m.mu.Lock()
		s := m.states[uuid]
		_, running := m.daemons[uuid]
		ch := m.changed
		m.mu.Unlock()
		switch {
		case s.Up && running:
			return nil
		case !running:
			return fmt.Errorf("no MPS control daemon is run for GPU %s", uuid)
		}
		select {
		case <-ctx.Done():
			if s.Err != nil {
				return fmt.Errorf("the MPS control daemon of GPU %s is not up: %w", uuid, s.Err)
			}
			return fmt.Errorf("the MPS control daemon of GPU %s is not up yet: %w", uuid, ctx.Err())
		case <-ch:
		}
	}
}

// Up says, by GPU UUID, which daemons are up.
func (m *Manager) Up() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.states))
	for uuid, s := range m.states {
		out[uuid] = s.Up
	}
	return out
}

// Status is what a GPU's daemon says of itself through its control
// client.
type Status struct {
	// Up: the daemon answered.
	Up bool
	// Servers and Clients count its MPS servers (one per user running
	// clients) and their client processes.
	Servers, Clients int
	Err              error
}

// Query asks the daemon of the GPU with uuid, whether or not this Manager
// runs it (list asks those of the serving process).
func (m *Manager) Query(uuid string) Status {
	g := GPU{UUID: uuid}
	out, err := m.control(g, "get_server_list")
	if err != nil {
		return Status{Err: err}
	}
	st := Status{Up: true}
	for _, pid := range strings.Fields(out) {
		st.Servers++
		clients, err := m.control(g, "get_client_list "+pid)
		if err != nil {
			st.Err = err
			continue
		}
		st.Clients += len(strings.Fields(clients))
	}
	return st
}

// State is the GPU's daemon state; false when it has none.
func (m *Manager) State(uuid string) (State, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.states[uuid]
	return s, ok
}

package mpsd

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
)

// Set makes the running daemons those of gpus: it stops (clients given
// StopGrace to end, then quit, and directories removed) those of GPUs no
// longer listed, gives those whose limits changed their new limits in
// place (their running clients keep running), then starts the others,
// each reported down until its first start succeeds. A daemon an earlier
// plugin process left running is adopted, not restarted, so its clients
// keep running across a plugin restart or upgrade; the first Set also
// stops those left for GPUs no longer listed. The daemons stay up when
// ctx ends, for the next process to adopt: stop them with Set(ctx, nil).
// Set returns once the stopped ones are gone.
func (m *Manager) Set(ctx context.Context, gpus []GPU) {
	want := map[string]GPU{}
	for _, g := range gpus {
		want[g.UUID] = g
	}
	m.mu.Lock()
	var stopping []*daemon
	for uuid, d := range m.daemons {
		g, ok := want[uuid]
		switch {
		case !ok:
			d.retire = true
			d.cancel()
			stopping = append(stopping, d)
			delete(m.daemons, uuid)
		case g != d.gpu:
			d.gpu = g
			poke(d.poke)
		}
	}
	sweep := !m.swept
	m.swept = true
	m.mu.Unlock()
	for _, d := range stopping {
		<-d.done
		m.mu.Lock()
		stopped := d.stopped
		m.mu.Unlock()
		if !stopped {
			// Its run ended with its ctx, leaving it up for a next
			// process; this one wants it stopped after all.
			m.stop(d.gpu, m.o.Log.With("gpu", d.gpu.UUID))
		}
	}
	if sweep {
		m.sweep(want)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, uuid := range slices.Sorted(maps.Keys(want)) {
		if _, running := m.daemons[uuid]; running {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		d := &daemon{gpu: want[uuid], cancel: cancel, done: make(chan struct{}), poke: make(chan struct{}, 1)}
		m.daemons[uuid] = d
		m.states[uuid] = State{Reason: ReasonDown, Err: errors.New("not started yet")}
		go m.run(dctx, d)
	}
	m.bumpLocked()
	m.notify()
}

// Hold holds the daemon of the GPU with uuid stopped while held, for
// reason: its servers are shut down by force, so that their clients fail
// at once rather than hang on a faulted GPU and a reset can proceed, and
// the daemon quits. Its directories stay, so the pods that mount them
// reach the daemon started again once the hold is lifted. A hold outlasts
// Set, and applies to a daemon started later.
func (m *Manager) Hold(uuid string, held bool, reason string) {
	m.HoldFor(uuid, HolderHealth, held, reason)
}

// The holders of Hold and HoldFor.
const (
	HolderHealth      = "health"
	HolderRemediation = "remediation"
)

// HoldFor is Hold on behalf of one holder: the daemon stays stopped while
// any holder holds it (health while the GPU is faulted, the remediation
// until it gives the GPU back).
func (m *Manager) HoldFor(uuid, holder string, held bool, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, was := m.held[uuid][holder]
	if held == was {
		return
	}
	wasHeld := len(m.held[uuid]) > 0
	if held {
		if m.held[uuid] == nil {
			m.held[uuid] = map[string]string{}
		}
		m.held[uuid][holder] = reason
	} else {
		delete(m.held[uuid], holder)
		if len(m.held[uuid]) == 0 {
			delete(m.held, uuid)
		}
	}
	if d, ok := m.daemons[uuid]; ok && wasHeld != (len(m.held[uuid]) > 0) {
		poke(d.poke)
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wanted is what d is to run now, and why it is held ("": not held).
func (m *Manager) wanted(d *daemon) (GPU, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := m.held[d.gpu.UUID]
	var why []string
	for _, h := range slices.Sorted(maps.Keys(by)) {
		why = append(why, by[h])
	}
	return d.gpu, strings.Join(why, "; "), len(by) > 0
}

// sweep stops the daemons an earlier process left for GPUs not in want
// (sharing turned off, or the GPU gone) and removes their directories.
func (m *Manager) sweep(want map[string]GPU) {
	entries, err := os.ReadDir(m.o.Root)
	if err != nil {
		return
	}
	for _, e := range entries {
		uuid := e.Name()
		if _, ok := want[uuid]; ok || !e.IsDir() || !strings.HasPrefix(uuid, "GPU-") {
			continue
		}
		log := m.o.Log.With("gpu", uuid)
		log.Info("GPU no longer shared through MPS; stopping the control daemon an earlier run left")
		m.stop(GPU{UUID: uuid}, log)
	}
}

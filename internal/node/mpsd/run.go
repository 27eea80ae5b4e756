package mpsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// errHeld ends watch: the GPU's daemon is to be held stopped.
var errHeld = errors.New("held")

// run keeps one GPU's daemon up until ctx ends, then stops it.
func (m *Manager) run(ctx context.Context, d *daemon) {
	defer close(d.done)
	log := m.o.Log.With("gpu", d.gpu.UUID)
	backoff, step := m.o.MinBackoff, 0
	for ctx.Err() == nil {
		g, why, held := m.wanted(d)
		if held {
			m.setState(g.UUID, State{Reason: ReasonDown, Err: fmt.Errorf("held stopped: %s", why)})
			select {
			case <-ctx.Done():
			case <-d.poke:
			}
			continue
		}
		adopted, err := m.start(ctx, g, log)
		if err != nil {
			level := slog.LevelWarn
			if m.warnedAlready(err, step) {
				level = slog.LevelDebug
			}
			step++
			log.Log(ctx, level, "MPS control daemon did not start; its shares are withheld", "err", err, "retryIn", backoff)
			m.undoStart(g, log)
			m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
			if !m.waitOrPoke(ctx, d, backoff) {
				break
			}
			backoff = min(2*backoff, m.o.MaxBackoff)
			continue
		}
		backoff, step = m.o.MinBackoff, 0
		log.Info("MPS control daemon up", "adopted", adopted, "threadPercentage", g.DefaultThreadPercentage(), "pinnedMemoryMiB", g.DefaultMemoryMiB())
		m.setState(g.UUID, State{Up: true})
		err = m.watch(ctx, d, g, log)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errHeld) {
			_, why, _ := m.wanted(d)
			log.Warn("GPU faulted: its MPS servers are shut down by force and its control daemon stopped until it is healthy again", "reason", why)
			m.halt(g, log)
			continue
		}
		log.Warn("MPS control daemon stopped answering; its shares are withheld until it is restarted", "err", err)
		m.setState(g.UUID, State{Reason: ReasonDown, Err: err})
		_ = m.quit(g) // one that hangs rather than died
		if !m.waitOrPoke(ctx, d, backoff) {
			break
		}
	}
	m.mu.Lock()
	retire := d.retire
	d.stopped = retire
	g := d.gpu
	m.mu.Unlock()
	if retire {
		m.stop(g, log)
	}
}

// warnedAlready says whether another GPU's daemon warned of the same
// failure at the same step of its backoff; if not, this one will.
func (m *Manager) warnedAlready(err error, step int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warned[step] == err.Error() {
		return true
	}
	m.warned[step] = err.Error()
	delete(m.warned, step-3)
	return false
}

// wait waits d on the clock; false when ctx ended first.
func (m *Manager) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-m.o.Clock.After(d):
		return true
	}
}

// waitOrPoke is wait, cut short when d's GPU is held or its limits
// change.
func (m *Manager) waitOrPoke(ctx context.Context, d *daemon, dur time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-m.o.Clock.After(dur):
	case <-d.poke:
	}
	return true
}

// watch probes the daemon until it fails to answer, ctx ends or its GPU
// is held (errHeld), and gives it the new limits Set asks for in place.
// applied is what the daemon was given.
func (m *Manager) watch(ctx context.Context, d *daemon, applied GPU, log *slog.Logger) error {
	tick := m.o.Clock.After(m.o.ProbeInterval)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if err := m.probe(applied, log); err != nil {
				return err
			}
			tick = m.o.Clock.After(m.o.ProbeInterval)
		case <-d.poke:
			g, _, held := m.wanted(d)
			if held {
				return errHeld
			}
			if limitsOf(g) == limitsOf(applied) {
				continue
			}
			if err := m.relimit(g, true); err != nil {
				return fmt.Errorf("giving the daemon new limits: %w", err)
			}
			log.Info("MPS limits changed in place; running clients keep theirs", "threadPercentage", g.DefaultThreadPercentage(), "pinnedMemoryMiB", g.DefaultMemoryMiB())
			applied = g
		}
	}
}

// probe asks the daemon whether it answers, and puts the GPU back in
// exclusive-process mode where a reset or a driver reload took it out.
func (m *Manager) probe(g GPU, log *slog.Logger) error {
	if _, err := m.control(g, "get_default_active_thread_percentage"); err != nil {
		return err
	}
	if m.o.IsExclusive == nil || m.o.ComputeMode == nil {
		return nil
	}
	excl, err := m.o.IsExclusive(g.UUID)
	if err != nil || excl {
		return nil // a failed read changes nothing; the next probe reads again
	}
	log.Warn("the GPU left exclusive-process compute mode (a reset or a driver reload?); setting it again")
	if err := m.o.ComputeMode(g.UUID, true); err != nil {
		return fmt.Errorf("the GPU left exclusive-process compute mode and cannot be put back: %w", err)
	}
	return nil
}

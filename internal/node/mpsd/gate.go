package mpsd

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// Gate passes GPU health on to the next notifier, holding a GPU shared
// through MPS unhealthy (ReasonDown) while its daemon is not up: its
// shares are withheld until a daemon can serve them, and the daemon's
// health is the GPU's health everywhere health goes. A GPU is gated when
// named at NewGate, and while the manager runs a daemon for it (DRA
// claims start and stop daemons as they come and go).
type Gate struct {
	next  health.Notifier
	m     *Manager
	gated map[string]bool // fixed at NewGate

	mu sync.Mutex
	// said is what the health watcher last said of each gated GPU; sent
	// what the gate last passed on.
	said, sent map[string]verdict
}

type verdict struct {
	healthy bool
	reason  string
}

// NewGate gates the GPUs with uuids on m's daemons; the others' health
// passes through. Each gated GPU is sent down at once: no share of it is
// offered before its daemon is up. Run keeps the gate in step with m.
func NewGate(next health.Notifier, m *Manager, uuids []string) *Gate {
	g := &Gate{next: next, m: m, gated: map[string]bool{}, said: map[string]verdict{}, sent: map[string]verdict{}}
	for _, id := range uuids {
		g.gated[id] = true
		g.said[id] = verdict{healthy: true}
	}
	g.refresh()
	return g
}

// SetHealth is the health watcher's word on a GPU. A gated GPU that
// faulted (Faulted) has its daemon held stopped until it is healthy again.
func (g *Gate) SetHealth(id string, healthy bool, reason string) bool {
	// Held while telling next, so that what next hears last is the
	// latest verdict.
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case healthy || !Faulted(reason):
		g.m.Hold(id, false, "")
	case g.gated[id] || g.m.Running(id):
		g.m.Hold(id, true, reason)
	}
	g.said[id] = verdict{healthy, reason}
	v := g.verdict(id)
	g.sent[id] = v
	return g.next.SetHealth(id, v.healthy, v.reason)
}

// verdict is the gated GPU's health: the watcher's, unless it says
// healthy and the daemon is down.
func (g *Gate) verdict(id string) verdict {
	v := g.said[id]
	if !g.gated[id] && !g.m.Running(id) {
		return v
	}
	if s, ok := g.m.State(id); v.healthy && (!ok || !s.Up) {
		return verdict{reason: ReasonDown}
	}
	return v
}

// Faulted says whether a health reason is a fault of the GPU itself (an
// XID, or the GPU lost), after which its MPS server cannot be trusted:
// under MPS one client's fatal fault reaches every client of the server.
// A slowdown or a failed read is not.
func Faulted(reason string) bool {
	for _, part := range strings.Split(reason, ", ") {
		if strings.HasPrefix(part, "xid=") || part == "gpu-lost" {
			return true
		}
	}
	return false
}

// Run passes on each change of a daemon's state until ctx ends.
func (g *Gate) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.m.Changes():
			g.refresh()
		}
	}
}

func (g *Gate) refresh() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(g.said)) {
		v := g.verdict(id)
		if old, ok := g.sent[id]; !ok || old != v {
			g.sent[id] = v
			g.next.SetHealth(id, v.healthy, v.reason)
		}
	}
}

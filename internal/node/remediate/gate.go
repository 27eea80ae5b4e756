package remediate

import (
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// gate passes health on to next, except for the units of a withheld GPU,
// which are unhealthy until it is given back; then what health last said
// of each passes again. While health calls a withheld unit unhealthy, its
// reason passes unchanged: the DRA taints, Events and tolerations keyed on
// it keep working, and list and the Events say the remediation's part.
// Only a unit health calls healthy gets the remediation's reason.
type gate struct {
	next  health.Notifier
	units map[string][]string // GPU UUID -> the device IDs it reports as
	gpuOf map[string]string   // device ID -> its GPU

	mu       sync.Mutex
	said     map[string]verdict // what health last said of each device
	withheld map[string]string  // GPU UUID -> its reason
}

type verdict struct {
	healthy bool
	reason  string
}

func newGate(next health.Notifier, units map[string][]string) *gate {
	g := &gate{next: next, units: units, gpuOf: map[string]string{}, said: map[string]verdict{}, withheld: map[string]string{}}
	for gpu, ids := range units {
		for _, id := range ids {
			g.gpuOf[id] = gpu
		}
	}
	return g
}

func (g *gate) SetHealth(id string, healthy bool, reason string) bool {
	// Held while telling next, so what next hears last is the latest.
	g.mu.Lock()
	defer g.mu.Unlock()
	g.said[id] = verdict{healthy, reason}
	if why, out := g.withheld[g.gpuOf[id]]; out && healthy {
		return g.next.SetHealth(id, false, why)
	}
	return g.next.SetHealth(id, healthy, reason)
}

// withhold reports gpu's units unhealthy for reason.
func (g *gate) withhold(gpu, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, out := g.withheld[gpu]; out && old == reason {
		return
	}
	g.withheld[gpu] = reason
	for _, id := range g.units[gpu] {
		if v, reported := g.said[id]; reported && !v.healthy {
			continue // health's own reason stands
		}
		g.next.SetHealth(id, false, reason)
	}
}

// release lets health's word on gpu's units pass again.
func (g *gate) release(gpu string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, out := g.withheld[gpu]; !out {
		return
	}
	delete(g.withheld, gpu)
	for _, id := range g.units[gpu] {
		v, reported := g.said[id]
		if !reported {
			v = verdict{healthy: true} // as the front-end took it at first
		}
		g.next.SetHealth(id, v.healthy, v.reason)
	}
}

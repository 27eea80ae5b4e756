package health

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// Part is a MIG device of a watched GPU, by its device ID and instance
// IDs. A GPU given parts reports health for each of them instead of for
// itself: a part is Unhealthy when its GPU is (an XID naming no
// instance, a lost GPU, heat), or when an XID names its instance.
//
// A part whose GPUInstance is AnyInstance stands for every instance the GPU
// has or will have: a GPU whose MIG instances are created on demand (DRA
// partitions) reports as one part, hit by an XID on any of its instances,
// and is not taken as a GPU in MIG mode that serves nothing.
type Part struct {
	ID                           string
	GPUInstance, ComputeInstance int
}

// AnyInstance is a Part's GPUInstance matching every instance.
const AnyInstance = -1

// WithParts gives GPU i the parts parts[i] (see Part).
func WithParts(parts [][]Part) Option {
	return func(o *options) { o.parts = parts }
}

type partState struct {
	Part
	xid     *condition
	healthy bool
	reason  string
}

func (p *partState) matches(in nvml.Instance) bool {
	return p.GPUInstance == AnyInstance || p.GPUInstance == in.GPUInstance && (in.ComputeInstance < 0 || p.ComputeInstance == in.ComputeInstance)
}

// reportIDs are the device IDs GPU i's health is reported as.
func (w *Watcher) reportIDs(i int) []string {
	if len(w.parts[i]) == 0 {
		return []string{w.ids[i]}
	}
	out := make([]string, len(w.parts[i]))
	for k, p := range w.parts[i] {
		out[k] = p.ID
	}
	return out
}

// part finds a part by device ID.
func (w *Watcher) part(id string) *partState {
	for i := range w.parts {
		for k := range w.parts[i] {
			if w.parts[i][k].ID == id {
				return &w.parts[i][k]
			}
		}
	}
	return nil
}

// PartState returns the health of the part with device ID id, and
// whether there is one.
func (w *Watcher) PartState(id string) (healthy bool, reason string, ok bool) {
	p := w.part(id)
	if p == nil {
		return false, "", false
	}
	return p.healthy, p.reason, true
}

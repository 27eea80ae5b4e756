package gpu

import (
	"fmt"
	"maps"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

// MPSShare is the part of a GPU shared through MPS that k of its n
// replicas are: k/n of its threads (at least 1%) and of its memory (in
// MiB, 0 when the GPU's memory is not known).
func MPSShare(u Unit, k int) (threadPercent int, memoryMiB uint64) {
	n := max(u.Replicas, 1)
	k = min(max(k, 1), n)
	return max(100*k/n, 1), u.GPU.MemoryBytes * uint64(k) / uint64(n) >> 20
}

// addMPS gives a container its k shares of unit u's MPS daemon: the pipe
// directory and shared memory mounted, and its limits in the environment.
// The limits can only narrow what the daemon allows each client (set by
// the daemon's manager), so a container that changes them gets no more
// than that.
func (r *Resource) addMPS(resp *device.Answer, u Unit, k int) {
	threads, mib := MPSShare(u, k)
	env, mounts := sharing.MPSClient(r.mpsRoot, u.UUID(), threads, mib)
	if resp.Env == nil {
		resp.Env = map[string]string{}
	}
	maps.Copy(resp.Env, env)
	resp.Mounts = append(resp.Mounts, mounts...)
}

// MPS reports whether some of the resource's units are shared through
// MPS.
func (r *Resource) MPS() bool { return r.mps }

// pickMPS chooses size replicas of one unit, mustInclude's unit if it
// names any: a container connects to one GPU's MPS daemon. Of the units
// with room it takes the one with the most free replicas (the least
// loaded daemon), the first of equals.
func (r *Resource) pickMPS(available, mustInclude []string, size int) ([]Pick, error) {
	free := make([][]int, len(r.units)) // free replica numbers by unit, ascending
	for _, id := range available {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", allocator.ErrBadRequest, id)
		}
		free[d.unit] = append(free[d.unit], d.replica)
	}
	unit, must := -1, map[int]bool{}
	for _, id := range mustInclude {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", allocator.ErrBadRequest, id)
		}
		if unit >= 0 && d.unit != unit {
			return nil, fmt.Errorf("%w: must include MPS shares of two GPUs (%s, %s); a container connects to one GPU's MPS daemon", allocator.ErrBadRequest, r.units[unit].uuid, r.units[d.unit].uuid)
		}
		unit, must[d.replica] = d.unit, true
	}
	if size < len(must) {
		return nil, fmt.Errorf("%w: %d devices wanted, %d must be included", allocator.ErrBadRequest, size, len(must))
	}
	// room is how many replicas of u the answer can hold.
	room := func(u int) int {
		if u != unit {
			return len(free[u])
		}
		n := len(must)
		for _, rep := range free[u] {
			if !must[rep] {
				n++
			}
		}
		return n
	}
	why := "must include"
	if unit < 0 {
		for u := range r.units {
			f := room(u)
			if f < size {
				continue
			}
			if unit < 0 || f > room(unit) {
				unit = u
			}
		}
		if unit < 0 {
			return nil, fmt.Errorf("%w: no GPU has %d free MPS shares; a container's shares are of one GPU", allocator.ErrBadRequest, size)
		}
		why = fmt.Sprintf("MPS: most free shares of one GPU (%d of %d free)", room(unit), r.units[unit].unit.Replicas)
	} else if room(unit) < size {
		return nil, fmt.Errorf("%w: %d devices wanted, GPU %s has %d free MPS shares with those that must be included", allocator.ErrBadRequest, size, r.units[unit].uuid, room(unit))
	}
	e := &r.units[unit]
	out := make([]Pick, 0, size)
	for rep := range e.ids {
		if must[rep] {
			out = append(out, Pick{ID: e.ids[rep], Unit: e.uuid, Why: "must include"})
		}
	}
	for _, rep := range free[unit] {
		if len(out) == size {
			break
		}
		if !must[rep] {
			out = append(out, Pick{ID: e.ids[rep], Unit: e.uuid, Why: why})
		}
	}
	return out, nil
}

package gpu

import (
	"fmt"
	"maps"
	"path/filepath"
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// The directories of one GPU's MPS control daemon under the MPS root
// (MPSDir).
const (
	// MPSPipe holds the daemon's control socket and its servers' pipes;
	// clients connect through it.
	MPSPipe = "pipe"
	// MPSLog holds the daemon's and its servers' logs.
	MPSLog = "log"
	// MPSShm is the daemon's /dev/shm, which its clients must share.
	MPSShm = "shm"
)

// MPSDir is one of a GPU's MPS directories (MPSPipe, MPSLog, MPSShm):
// <root>/<uuid>/<which>.
func MPSDir(root, uuid, which string) string { return filepath.Join(root, uuid, which) }

// MPS environment of a container: the pipe directory it finds its daemon
// through, and its limits.
const (
	MPSPipeEnv         = "CUDA_MPS_PIPE_DIRECTORY"
	MPSThreadEnv       = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	MPSPinnedMemoryEnv = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// MPSContainerPipeDir is where the pipe directory is mounted in a
// container: MPS's own default, so a client that clears
// CUDA_MPS_PIPE_DIRECTORY still reaches its daemon and not, through a
// context of its own, the whole GPU.
const MPSContainerPipeDir = "/tmp/nvidia-mps"

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
	env, mounts := MPSClient(r.mpsRoot, u.UUID(), threads, mib)
	if resp.Env == nil {
		resp.Env = map[string]string{}
	}
	maps.Copy(resp.Env, env)
	resp.Mounts = append(resp.Mounts, mounts...)
}

// MPSClient is what a container needs to be a client of the MPS daemon of
// the GPU with uuid (directories under root), limited to threadPercent of
// its threads and memoryMiB of its memory (0: no limit of its own): the
// pipe directory and the daemon's shared memory mounted, and its limits in
// the environment. The limits can only narrow what the daemon allows each
// client, so a container that changes them gets no more than that.
func MPSClient(root, uuid string, threadPercent int, memoryMiB uint64) (map[string]string, []device.Mount) {
	env := map[string]string{
		MPSPipeEnv:   MPSContainerPipeDir,
		MPSThreadEnv: strconv.Itoa(threadPercent),
	}
	if memoryMiB > 0 {
		// Device 0: a client sees the one GPU its daemon was started for.
		env[MPSPinnedMemoryEnv] = "0=" + strconv.FormatUint(memoryMiB, 10) + "M"
	}
	return env, []device.Mount{
		{ContainerPath: MPSContainerPipeDir, HostPath: MPSDir(root, uuid, MPSPipe)},
		{ContainerPath: "/dev/shm", HostPath: MPSDir(root, uuid, MPSShm)},
	}
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

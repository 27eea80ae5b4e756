package dra

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// MPSDaemons runs the MPS control daemons of the GPUs that prepared claims
// share through MPS; *mpsd.Manager is one.
type MPSDaemons interface {
	Set(ctx context.Context, gpus []mpsd.GPU)
	WaitUp(ctx context.Context, uuid string) error
}

// MPSSpec writes the cdi.MPSKind spec holding devs (none: removes it) and
// says whether it is on disk.
type MPSSpec func(devs []cdi.Device) error

// mpsUpTimeout bounds the wait in Prepare for a daemon to come up; the
// kubelet retries a Prepare that failed.
const mpsUpTimeout = 30 * time.Second

// preparedMPS is one prepared device's MPS client limits.
type preparedMPS struct {
	GPU              string `json:"gpu"` // UUID
	ThreadPercentage int    `json:"threadPercentage"`
	PinnedMemoryMiB  uint64 `json:"pinnedMemoryMiB,omitempty"`
	// Whole: the claim holds the whole GPU, and the daemon holds every
	// client to these limits. Else the GPU is shared by memory: the daemon
	// holds every client to the largest share prepared on the GPU, and
	// each client's environment narrows that to its own.
	Whole bool `json:"whole,omitempty"`
	extra jsonkeep.Fields
}

func (p *preparedMPS) UnmarshalJSON(b []byte) error {
	type plain preparedMPS
	return jsonkeep.Unmarshal[plain](b, p, &p.extra)
}

func (p preparedMPS) MarshalJSON() ([]byte, error) {
	type plain preparedMPS
	return jsonkeep.Marshal[plain](p, p.extra)
}

// SetMPS starts serving MPS claims through m, with the daemons'
// directories under root, and time-slice intervals through timeSlice: the daemons of the claims in the checkpoint are
// started (or adopted), those of no claim stopped, and the MPS spec
// rewritten (it is gone after a reboot). Daemons run until ctx ends.
func (d *Driver) SetMPS(ctx context.Context, m MPSDaemons, root string, spec MPSSpec, timeSlice TimeSlicer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mps, d.mpsRoot, d.mpsSpec, d.mpsCtx, d.timeSlice = m, root, spec, ctx, timeSlice
	if err := d.applyMPSLocked(nil); err != nil {
		d.o.Log.Error("MPS: restoring the prepared claims' clients", "err", err)
	}
}

// mpsOf decides whether result r of a claim, on device e, is an MPS
// client and with which limits: a share of a GPU's memory always is
// (that is what limits it), and so is a device whose config asks for
// MPS. nil: not MPS.
func mpsOf(r resourceapi.DeviceRequestAllocationResult, e *draslice.Device, cfg *GPUConfig) (*preparedMPS, error) {
	total := capacityBytes(e, "memory")
	var consumed int64
	if q, ok := r.ConsumedCapacity["memory"]; ok && r.ShareID != nil {
		consumed = q.Value()
	}
	share := r.ShareID != nil && consumed > 0 && consumed < total
	slicing := cfg != nil && cfg.Sharing != nil && cfg.Sharing.Strategy == StrategyTimeSlicing
	switch {
	case share && slicing:
		return nil, fmt.Errorf("device %s: %s of its memory is a share, served through MPS, which limits it; remove the TimeSlicing config, or ask for the whole GPU", r.Device, resource.NewQuantity(consumed, resource.BinarySI))
	case !share && !cfg.mps():
		return nil, nil
	}
	if e.Type != draslice.TypeGPU {
		return nil, fmt.Errorf("device %s is a %s device, and the plugin runs MPS on whole GPUs only; remove the MPS config for it", r.Device, e.Type)
	}
	p := &preparedMPS{GPU: e.ID, ThreadPercentage: 100, Whole: !share}
	if share {
		p.ThreadPercentage = int(max((100*consumed+total-1)/total, 1))
		p.PinnedMemoryMiB = uint64(consumed) >> 20
	}
	if cfg.mps() && cfg.Sharing.MPS != nil {
		m := cfg.Sharing.MPS
		if m.ActiveThreadPercentage > 0 {
			p.ThreadPercentage = m.ActiveThreadPercentage
		}
		if q := m.PinnedMemoryLimit; q != nil {
			if share && q.Value() > consumed {
				return nil, fmt.Errorf("device %s: sharing.mps.pinnedMemoryLimit %s is more than the %s of memory the claim was allocated; ask for that much memory, or lower the limit", r.Device, q, resource.NewQuantity(consumed, resource.BinarySI))
			}
			p.PinnedMemoryMiB = uint64(q.Value()) >> 20
		}
	}
	return p, nil
}

// capacityBytes is the device's capacity name in bytes, 0 if none.
func capacityBytes(e *draslice.Device, name string) int64 {
	c, ok := e.Capacity[name]
	if !ok {
		return 0
	}
	q, err := resource.ParseQuantity(c.Value)
	if err != nil {
		return 0
	}
	return q.Value()
}

// mpsDeviceName is the cdi.MPSKind device of one claim's MPS client: a claim
// has at most one (a container reaches one daemon).
func mpsDeviceName(uid types.UID, device string) string { return string(uid) + "-" + device }

// mpsGPUsLocked is the daemons the prepared claims (and pending, not yet
// in the checkpoint) need, by GPU UUID (mpsDaemonsLocked), in UUID order.
func (d *Driver) mpsGPUsLocked(pending map[types.UID]preparedClaim) []mpsd.GPU {
	byGPU := d.mpsDaemonsLocked(pending)
	out := make([]mpsd.GPU, 0, len(byGPU))
	for _, id := range slices.Sorted(maps.Keys(byGPU)) {
		out = append(out, byGPU[id])
	}
	return out
}

// mpsDaemonsLocked is the daemon each GPU with MPS clients in the prepared
// claims and pending needs, by UUID. Its defaults, which hold whatever a
// client's environment says, are the largest client limits on the GPU:
// the largest thread percentage, and the largest pinned memory (none if a
// client has no memory limit). A claim holding the GPU whole is its only
// client, so its limits hold exactly; memory shares are each held to the
// largest share on their GPU, exactly their own when the shares are of one
// size. Recomputed at every Prepare and Unprepare, as shares come and go.
func (d *Driver) mpsDaemonsLocked(pending map[types.UID]preparedClaim) map[string]mpsd.GPU {
	type largest struct {
		threads   int
		mib       uint64
		unlimited bool // a client has no memory limit
	}
	byGPU := map[string]*largest{}
	add := func(claims map[types.UID]preparedClaim) {
		for _, c := range claims {
			for _, dv := range c.Devices {
				m := dv.MPS
				if m == nil {
					continue
				}
				l := byGPU[m.GPU]
				if l == nil {
					l = &largest{}
					byGPU[m.GPU] = l
				}
				l.threads, l.mib = max(l.threads, m.ThreadPercentage), max(l.mib, m.PinnedMemoryMiB)
				l.unlimited = l.unlimited || m.PinnedMemoryMiB == 0
			}
		}
	}
	add(d.cp.Claims)
	add(pending)
	out := make(map[string]mpsd.GPU, len(byGPU))
	for id, l := range byGPU {
		g := mpsd.GPU{UUID: id, Replicas: 1, MaxShares: 1, ThreadPercentage: l.threads}
		if !l.unlimited {
			g.Memory = l.mib << 20
		}
		out[id] = g
	}
	return out
}

// applyMPSLocked makes the daemons and the MPS spec those of the prepared
// claims and pending. It does not wait for the daemons: Prepare does,
// without the lock (awaitMPS).
func (d *Driver) applyMPSLocked(pending map[types.UID]preparedClaim) error {
	if d.mps == nil {
		return nil
	}
	d.mps.Set(d.mpsCtx, d.mpsGPUsLocked(pending))
	var devs []cdi.Device
	add := func(claims map[types.UID]preparedClaim) {
		for _, uid := range slices.Sorted(maps.Keys(claims)) {
			for _, dv := range claims[uid].Devices {
				if dv.MPS == nil {
					continue
				}
				env, mounts := sharing.MPSClient(d.mpsRoot, dv.MPS.GPU, dv.MPS.ThreadPercentage, dv.MPS.PinnedMemoryMiB)
				e := cdi.Edits{}
				for _, k := range slices.Sorted(maps.Keys(env)) {
					e.Env = append(e.Env, k+"="+env[k])
				}
				for _, m := range mounts {
					e.Mounts = append(e.Mounts, cdi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: []string{"rw", "nosuid", "nodev", "bind"}})
				}
				devs = append(devs, cdi.Device{Name: mpsDeviceName(uid, dv.Device), Edits: e})
			}
		}
	}
	add(d.cp.Claims)
	add(pending)
	if err := d.mpsSpec(devs); err != nil {
		return fmt.Errorf("MPS CDI spec: %w", err)
	}
	return nil
}

// mpsWait is, for one claim, the daemons its answer waits for.
type mpsWait struct {
	m MPSDaemons
	// claim names it (namespace/name) in errors; fresh: it was prepared
	// by this call, and is undone if its daemons do not come up.
	claim string
	fresh bool
	// devices are its MPS clients' devices, and gpus their GPUs.
	devices, gpus []string
}

// mpsWaitLocked is what claim p's answer waits for; false when it has no
// MPS client. Without daemons yet (NVML not loaded) it fails at once.
func (d *Driver) mpsWaitLocked(p preparedClaim) (mpsWait, bool, error) {
	w := mpsWait{m: d.mps, claim: p.Namespace + "/" + p.Name}
	for _, dv := range p.Devices {
		if dv.MPS == nil {
			continue
		}
		if d.mps == nil {
			return w, false, mpsNotReady(dv.Device)
		}
		w.devices, w.gpus = append(w.devices, dv.Device), append(w.gpus, dv.MPS.GPU)
	}
	return w, len(w.gpus) > 0, nil
}

// awaitMPS waits, within ctx and mpsUpTimeout and without the driver's
// lock (other claims are prepared meanwhile), for the daemons each claim's
// MPS clients use; a claim whose daemon is not up gets that error in
// place of its answer, and the kubelet prepares it again. It returns the
// claims this call prepared whose daemons did not come up, to be undone.
func awaitMPS(ctx context.Context, waits map[types.UID]mpsWait, out map[types.UID]kubelet.PrepareResult) (undo []types.UID) {
	ctx, cancel := context.WithTimeout(ctx, mpsUpTimeout)
	defer cancel()
	for _, uid := range slices.Sorted(maps.Keys(waits)) {
		w := waits[uid]
		for i, id := range w.gpus {
			if err := w.m.WaitUp(ctx, id); err != nil {
				out[uid] = kubelet.PrepareResult{Err: fmt.Errorf("claim %s: device %s: %w", w.claim, w.devices[i], err)}
				if w.fresh {
					undo = append(undo, uid)
				}
				break
			}
		}
	}
	return undo
}

// undoPrepared takes back claims prepared by a call whose MPS daemons did
// not come up: nothing of them stays (checkpoint, time slices, MIG
// instances, daemons, spec devices), as for any refused claim.
func (d *Driver) undoPrepared(ctx context.Context, uids []types.UID) {
	if len(uids) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	undone := false
	for _, uid := range uids {
		p, ok := d.cp.Claims[uid]
		if !ok {
			continue
		}
		d.resetTimeSlicesLocked(ctx, p)
		undone = d.undoMIGLocked(p) || undone
		delete(d.cp.Claims, uid)
	}
	if err := d.cp.save(d.o.CheckpointPath); err != nil {
		d.o.Log.Warn("MPS: saving the checkpoint without claims whose daemons did not come up", "err", err)
	}
	if undone {
		if err := d.writeMIGSpecLocked(); err != nil {
			d.o.Log.Warn("MIG: CDI spec", "err", err)
		}
	}
	if err := d.applyMPSLocked(nil); err != nil {
		d.o.Log.Warn("MPS: after taking back claims whose daemons did not come up", "err", err)
	}
}

// hasMPS says whether any of the claim's devices is an MPS client.
func (p preparedClaim) hasMPS() bool {
	return slices.ContainsFunc(p.Devices, func(dv preparedDevice) bool { return dv.MPS != nil })
}

// mpsNotReady is Prepare's error for an MPS claim before NVML loaded.
func mpsNotReady(device string) error {
	return fmt.Errorf("device %s is shared through MPS, and the MPS control daemons are not running yet (the GPUs are not discovered yet); the kubelet retries", device)
}

// describeMPS is a prepared device's MPS client and what its GPU's daemon
// holds every client to, for logs.
func describeMPS(m *preparedMPS, daemon mpsd.GPU) string {
	own := describeLimits(m.ThreadPercentage, m.PinnedMemoryMiB)
	held := describeLimits(daemon.DefaultThreadPercentage(), daemon.DefaultMemoryMiB())
	if own == held {
		return own + ", enforced by the daemon"
	}
	return own + " through its environment only; the daemon holds every client of the GPU to " + held + ", the largest share prepared on it"
}

func describeLimits(threadPercent int, pinnedMiB uint64) string {
	if pinnedMiB == 0 {
		return fmt.Sprintf("%d%% of the threads, no pinned memory limit", threadPercent)
	}
	return fmt.Sprintf("%d%% of the threads, %d MiB pinned", threadPercent, pinnedMiB)
}

package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// PrepareResourceClaims answers each claim with the CDI device IDs of its
// devices on this node. A claim prepared before (by this process or an
// earlier one) gets the same answer again. A claim is reported prepared
// only once the checkpoint on disk holds it. Then, outside the lock, the
// prepared claims' status.devices entries are written (writeClaimStatus).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubelet.PrepareResult, error) {
	d.pods.record(claims)
	gates := d.channelGates(ctx, claims)
	out, waits, err := d.prepareClaims(ctx, claims, gates)
	d.undoPrepared(ctx, awaitMPS(ctx, waits, out))
	d.writeClaimStatus(ctx, claims, out)
	return out, err
}

// prepareClaims prepares claims under the lock, and says which answers
// wait for MPS daemons to come up.
func (d *Driver) prepareClaims(ctx context.Context, claims []*resourceapi.ResourceClaim, gates map[types.UID]channelGate) (map[types.UID]kubelet.PrepareResult, map[types.UID]mpsWait, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	waits := map[types.UID]mpsWait{}
	d.reloadLocked()
	d.rebuildIfNeededLocked(ctx)
	d.reconcileMIGLocked()
	out := make(map[types.UID]kubelet.PrepareResult, len(claims))
	var added []types.UID
	filled, mpsChanged := false, false
	for _, c := range claims {
		if p, ok := d.cp.Claims[c.UID]; ok {
			if d.fillCDILocked(&p) {
				d.cp.Claims[c.UID], filled = p, true
			}
			if p.hasMIG() {
				// After a reboot the instances are gone: made again.
				if err := d.ensureMIGLocked(&p); err != nil {
					out[c.UID] = kubelet.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
					continue
				}
				d.cp.Claims[c.UID], filled = p, true
			}
			// The kubelet prepares again at each pod start: the answer
			// waits for the daemons again.
			w, ok, err := d.mpsWaitLocked(p)
			if err != nil {
				out[c.UID] = kubelet.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
				continue
			}
			if ok {
				waits[c.UID] = w
			}
			out[c.UID] = kubelet.PrepareResult{Devices: d.resultLocked(p)}
			continue
		}
		p, err := d.prepareLocked(ctx, c, gates)
		if err == nil && p.hasMIG() {
			if err = d.prepareMIGLocked(c.UID, &p); err != nil {
				d.resetTimeSlicesLocked(ctx, p)
			}
		}
		var w mpsWait
		if err == nil && p.hasMPS() {
			mpsChanged = true
			if w, _, err = d.mpsWaitLocked(p); err == nil {
				err = d.applyMPSLocked(map[types.UID]preparedClaim{c.UID: p})
			}
			if err != nil {
				d.resetTimeSlicesLocked(ctx, p)
			}
		}
		if err != nil {
			out[c.UID] = kubelet.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
			continue
		}
		if p.hasMPS() {
			daemons := d.mpsDaemonsLocked(map[types.UID]preparedClaim{c.UID: p})
			for _, dv := range p.Devices {
				if dv.MPS != nil {
					d.o.Log.Info("prepared an MPS client", "claim", c.Namespace+"/"+c.Name, "device", dv.Device, "gpu", dv.MPS.GPU, "limits", describeMPS(dv.MPS, daemons[dv.MPS.GPU]))
				}
			}
		}
		d.cp.Claims[c.UID] = p
		added = append(added, c.UID)
		out[c.UID] = kubelet.PrepareResult{Devices: d.resultLocked(p)}
		if len(w.gpus) > 0 {
			w.fresh = true
			waits[c.UID] = w
		}
	}
	if len(added) > 0 || filled {
		if err := d.cp.save(d.o.CheckpointPath); err != nil {
			undone := false
			for _, uid := range added {
				d.resetTimeSlicesLocked(ctx, d.cp.Claims[uid])
				undone = d.undoMIGLocked(d.cp.Claims[uid]) || undone
				delete(d.cp.Claims, uid)
				delete(waits, uid)
				out[uid] = kubelet.PrepareResult{Err: err}
			}
			if undone {
				if err := d.writeMIGSpecLocked(); err != nil {
					d.o.Log.Warn("MIG: CDI spec", "err", err)
				}
			}
		}
	}
	if mpsChanged {
		// What the claims that failed or were not saved no longer need.
		if err := d.applyMPSLocked(nil); err != nil {
			d.o.Log.Warn("MPS: after Prepare", "err", err)
		}
	}
	return out, waits, nil
}

func (d *Driver) prepareLocked(ctx context.Context, c *resourceapi.ResourceClaim, gates map[types.UID]channelGate) (preparedClaim, error) {
	p := preparedClaim{Namespace: c.Namespace, Name: c.Name}
	if c.Status.Allocation == nil {
		return p, errors.New("not allocated")
	}
	configOf, err := requestConfigs(d.o.DriverName, c.Status.Allocation.Devices.Config)
	if err != nil {
		return p, err
	}
	holders := d.holdersLocked()
	mpsDevice := ""
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.o.DriverName {
			continue
		}
		if r.Pool != d.o.NodeName {
			return p, fmt.Errorf("request %q: pool %q is not this node's (%q)", r.Request, r.Pool, d.o.NodeName)
		}
		e, ok := d.byName[r.Device]
		if !ok {
			return p, fmt.Errorf("request %q: device %q is not on this node, or not discovered yet", r.Request, r.Device)
		}
		admin := r.AdminAccess != nil && *r.AdminAccess
		if !admin {
			if err := holders.conflict(r.Device, r.ShareID); err != nil {
				return p, fmt.Errorf("request %q: %w", r.Request, err)
			}
		}
		if e.Type == draslice.TypeChannel {
			g, ok := gates[c.UID]
			switch {
			case d.cd == nil:
				return p, fmt.Errorf("request %q: device %s is an IMEX channel, and this node serves no ComputeDomains (imex.computeDomains is false)", r.Request, r.Device)
			case !ok:
				return p, fmt.Errorf("request %q: device %s: the claim's ComputeDomain was not looked at; the kubelet retries", r.Request, r.Device)
			case g.err != nil:
				return p, fmt.Errorf("request %q: %w", r.Request, g.err)
			}
			if d.o.Specs != nil {
				if err := d.o.Specs.Ensure(cdi.ChannelKind); err != nil {
					return p, fmt.Errorf("request %q: device %s: %w", r.Request, r.Device, err)
				}
			}
			dom := g.dom
			p.Devices = append(p.Devices, preparedDevice{
				Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device,
				CDIDeviceIDs: []string{cdi.QualifiedName(cdi.ChannelKind, cdi.ChannelDevice(dom.Channel))},
				Domain:       &dom,
			})
			continue
		}
		if h := d.health[e.ID]; h != nil && !h.healthy {
			d.o.Log.Warn("preparing an unhealthy device (the claim tolerates its taint)", "device", r.Device, "reason", h.reason, "claim", c.Namespace+"/"+c.Name)
		}
		for _, id := range e.CDIIDs {
			kind, _, _ := strings.Cut(id, "=")
			if d.o.Specs != nil {
				if err := d.o.Specs.Ensure(kind); err != nil {
					return p, fmt.Errorf("request %q: device %s: %w", r.Request, r.Device, err)
				}
			}
		}
		mps, err := mpsOf(r, e, configOf(r.Request))
		if err != nil {
			return p, fmt.Errorf("request %q: %w", r.Request, err)
		}
		interval, _ := configOf(r.Request).timeSlice()
		if interval != "" && e.Type != draslice.TypeGPU {
			return p, fmt.Errorf("request %q: device %s is a %s device, and a time-slice interval is set for whole GPUs; remove timeSlicing.interval for it", r.Request, r.Device, e.Type)
		}
		ids := slices.Clone(e.CDIIDs)
		var mig *preparedMIG
		if pl := e.Placement; pl != nil && admin {
			// A monitor watches the instance a claim made there; it
			// makes none of its own.
			held, err := d.heldInstanceLocked(r.Device)
			if err != nil {
				return p, fmt.Errorf("request %q: %w", r.Request, err)
			}
			ids = held
		} else if pl != nil {
			if d.mig == nil {
				return p, fmt.Errorf("request %q: device %s is a MIG placement, and MIG instances cannot be created yet (the GPUs are not discovered yet); the kubelet retries", r.Request, r.Device)
			}
			if err := d.migConflictLocked(e.ID, *pl, p.Devices); err != nil {
				return p, fmt.Errorf("request %q: %w", r.Request, err)
			}
			mig = &preparedMIG{GPU: e.ID, Profile: pl.Profile, ProfileIndex: pl.ProfileIndex, ProfileID: pl.ProfileID, Start: pl.Start, Size: pl.Size}
		}
		if mps != nil {
			switch {
			case mpsDevice != "":
				return p, fmt.Errorf("request %q: devices %s and %s would both be MPS clients, and a container reaches one MPS daemon; ask for one shared GPU per claim", r.Request, mpsDevice, r.Device)
			case d.mps == nil:
				return p, fmt.Errorf("request %q: %w", r.Request, mpsNotReady(r.Device))
			}
			mpsDevice = r.Device
			ids = append(ids, cdi.QualifiedName(cdi.MPSKind, mpsDeviceName(c.UID, r.Device)))
		}
		p.Devices = append(p.Devices, preparedDevice{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device,
			CDIDeviceIDs: ids, AdminAccess: admin, ShareID: r.ShareID, MPS: mps,
			TimeSlice: interval, MIG: mig, gpu: e.ID,
		})
	}
	if err := d.setTimeSlicesLocked(ctx, p); err != nil {
		return p, err
	}
	return p, nil
}

// reloadLocked reads the checkpoint again: during a rolling update two
// plugin processes serve side by side, the helper serialising their calls
// with a file lock, and the other one may have prepared or unprepared a
// claim since. A file that cannot be read keeps what this process knows.
// So does one that does not parse (it is set aside, see readCheckpoint) or
// that vanished while this process holds claims: neither is a reason to
// forget them, and the claims the other process prepared are rebuilt.
func (d *Driver) reloadLocked() {
	if d.o.CheckpointPath == "" {
		return
	}
	cp, found, err := readCheckpoint(d.o.CheckpointPath)
	switch {
	case errors.Is(err, errCorrupt):
		d.o.Log.Error("DRA checkpoint", "err", err)
		d.rebuild = whyCorrupt
		return
	case err != nil:
		d.o.Log.Error("DRA checkpoint", "err", err)
		return
	case !found && len(d.cp.Claims) > 0:
		d.o.Log.Error("DRA checkpoint vanished; keeping the claims this process knows and rebuilding the others", "path", d.o.CheckpointPath, "claims", len(d.cp.Claims))
		d.rebuild = whyVanished
		return
	}
	d.cp = cp
}

// holders are the claims holding each device (not for admin access).
type holders map[string][]holder

type holder struct {
	claim string // namespace/name
	share *types.UID
}

// conflict says why a claim may not have device (with share, a share of
// a device several claims may hold): another claim holds it whole, or
// holds the same share.
func (hs holders) conflict(device string, share *types.UID) error {
	for _, h := range hs[device] {
		switch {
		case share == nil || h.share == nil:
			return fmt.Errorf("device %s is prepared for claim %s", device, h.claim)
		case *share == *h.share:
			return fmt.Errorf("share %s of device %s is prepared for claim %s", *share, device, h.claim)
		}
	}
	return nil
}

// holdersLocked is who holds each device, of the prepared claims.
func (d *Driver) holdersLocked() holders {
	out := holders{}
	for _, c := range d.cp.Claims {
		for _, dv := range c.Devices {
			if !dv.AdminAccess {
				out[dv.Device] = append(out[dv.Device], holder{claim: c.Namespace + "/" + c.Name, share: dv.ShareID})
			}
		}
	}
	return out
}

func (p preparedClaim) result() []kubelet.Device {
	out := make([]kubelet.Device, len(p.Devices))
	for i, dv := range p.Devices {
		out[i] = kubelet.Device{
			Requests: slices.Clone(dv.Requests), PoolName: dv.Pool, DeviceName: dv.Device,
			CDIDeviceIDs: slices.Clone(dv.CDIDeviceIDs), ShareID: dv.ShareID,
		}
	}
	return out
}

// UnprepareResourceClaims forgets the claims. One not prepared is no
// error: the kubelet retries, and restarts.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubelet.NamespacedObject) (map[types.UID]error, error) {
	d.pods.forget(claims)
	out, err := d.unprepareClaims(ctx, claims)
	d.mu.Lock()
	ds := d.cd
	d.mu.Unlock()
	if ds != nil {
		// The domains no claim of this node needs any more are left: their
		// daemons stopped, this node's entries removed.
		var gone []types.UID
		for _, c := range claims {
			if out[c.UID] == nil {
				gone = append(gone, c.UID)
			}
		}
		ds.release(ctx, gone)
	}
	return out, err
}

func (d *Driver) unprepareClaims(ctx context.Context, claims []kubelet.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reloadLocked()
	d.rebuildIfNeededLocked(ctx)
	d.reconcileMIGLocked()
	out := make(map[types.UID]error, len(claims))
	removed := map[types.UID]preparedClaim{}
	migChanged := false
	for _, c := range claims {
		out[c.UID] = nil
		p, ok := d.cp.Claims[c.UID]
		if !ok {
			continue
		}
		if p.hasMIG() {
			// Destroyed before the claim leaves the checkpoint: a crash in
			// between leaves an entry whose instance is gone, which the
			// kubelet's retry clears, never an instance no entry names.
			if err := d.unprepareMIGLocked(p); err != nil {
				out[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
				continue
			}
			migChanged = true
		}
		removed[c.UID] = p
		delete(d.cp.Claims, c.UID)
	}
	if len(removed) > 0 {
		if err := d.cp.save(d.o.CheckpointPath); err != nil {
			maps.Copy(d.cp.Claims, removed)
			for uid := range removed {
				out[uid] = err
			}
			return out, nil
		}
	}
	if migChanged {
		if err := d.writeMIGSpecLocked(); err != nil {
			d.o.Log.Warn("MIG: after Unprepare", "err", err)
		}
	}
	for _, p := range removed {
		d.resetTimeSlicesLocked(ctx, p)
	}
	for _, p := range removed {
		if p.hasMPS() {
			// Daemons no claim needs stop; the others are not waited for.
			if err := d.applyMPSLocked(nil); err != nil {
				d.o.Log.Warn("MPS: after Unprepare", "err", err)
			}
			break
		}
	}
	return out, nil
}

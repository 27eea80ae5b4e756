package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// PodResources is the kubelet's PodResources API: which claims each
// container holds, with each device's pool, name and CDI device IDs.
// podresources.Client is one.
type PodResources interface {
	List(ctx context.Context) ([]podresources.Pod, error)
}

// ClaimGetter reads one ResourceClaim by namespace and name: a GET, never
// a list, so a node agent reads only claims its node's pods hold.
type ClaimGetter interface {
	GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// Why a rebuild is due (Driver.rebuild).
const (
	whyCorrupt  = "the checkpoint did not parse"
	whyMissing  = "the checkpoint is missing"
	whyVanished = "the checkpoint vanished"
)

// rebuildTimeout bounds one rebuild: the kubelet's List and a GET per
// claim. A rebuild runs at start, before the kubelet can call, and again
// before a Prepare or Unprepare while the last one fell short.
const rebuildTimeout = 20 * time.Second

// heldClaim is one claim of this driver that the kubelet's containers
// hold, as PodResources says.
type heldClaim struct {
	namespace, name string
	// cdi are the CDI device IDs of each device (by name) of this node's
	// pool that the kubelet has for the claim.
	cdi  map[string][]string
	pods []string
}

// rebuildLocked brings back the claims of this driver that the kubelet's
// pods still hold, when the checkpoint could not say (it did not parse, or
// it was missing): from PodResources (which claims, which devices) and a
// GET of each claim (its UID and allocation). They enter the checkpoint, so
// a device held by one is not prepared for another claim and Unprepare
// finds it. Claims the checkpoint already has are left as they are.
//
// It reports whether it should run again: the kubelet or the API server
// could not be asked, or a GET failed for another reason than the claim
// being gone. A claim that cannot be rebuilt for good (gone, no longer
// allocated, allocated other devices than its pod holds) is logged once.
func (d *Driver) rebuildLocked(ctx context.Context) (again bool) {
	log := d.o.Log.With("checkpoint", d.o.CheckpointPath, "why", d.rebuild)
	if d.o.PodResources == nil || d.o.Claims == nil {
		const msg = "DRA: prepared claims cannot be rebuilt without the kubelet's PodResources API (podResourcesSocket, --pod-resources-socket); claims prepared before are not guarded against a second claim until their pods end"
		if d.rebuild == whyMissing {
			// Most often a first start, with nothing to lose.
			log.Info(msg)
		} else {
			log.Error(msg)
		}
		return false
	}
	// A failure is said once; the retries before each Prepare are quiet.
	level := slog.LevelError
	if d.rebuildTries > 0 {
		level = slog.LevelDebug
	}
	d.rebuildTries++
	ctx, cancel := context.WithTimeout(ctx, rebuildTimeout)
	defer cancel()
	resp, err := d.o.PodResources.List(ctx)
	if err != nil {
		if d.rebuild == whyMissing && errors.Is(err, podresources.ErrUnavailable) {
			// No checkpoint and no kubelet to ask: most often a first
			// start on a node without the PodResources socket mounted.
			log.Info("DRA: no checkpoint, and the kubelet's PodResources API cannot say whether pods hold claims prepared before", "err", err)
			return false
		}
		log.Log(ctx, level, "DRA: rebuilding prepared claims: asking the kubelet which claims its pods hold; trying again before the next Prepare", "err", err)
		return true
	}
	known := map[string]bool{}
	for _, c := range d.cp.Claims {
		known[c.Namespace+"/"+c.Name] = true
	}
	if d.rebuildSkip == nil {
		d.rebuildSkip = map[string]bool{}
	}
	var rebuilt []string
	for _, h := range d.heldClaims(resp) {
		key := h.namespace + "/" + h.name
		if known[key] || d.rebuildSkip[key] {
			continue
		}
		c, err := d.o.Claims.GetClaim(ctx, h.namespace, h.name)
		switch {
		case apierrors.IsNotFound(err):
			log.Warn("DRA: a claim the kubelet's pods hold is gone from the API server; not rebuilt, its devices are not guarded until its pods end", "claim", key, "pods", h.pods)
			d.rebuildSkip[key] = true
			continue
		case err != nil:
			log.Log(ctx, level, "DRA: rebuilding prepared claims: reading a claim; trying again before the next Prepare", "claim", key, "err", err)
			again = true
			continue
		}
		p, err := d.rebuiltClaim(c, h)
		if err != nil {
			log.Warn("DRA: a claim the kubelet's pods hold is not rebuilt", "claim", key, "pods", h.pods, "err", err)
			d.rebuildSkip[key] = true
			continue
		}
		if _, ok := d.cp.Claims[c.UID]; ok {
			continue
		}
		d.cp.Claims[c.UID] = p
		rebuilt = append(rebuilt, key)
	}
	if len(rebuilt) == 0 {
		if !again {
			// A first start has no checkpoint either: said quietly.
			log.Debug("DRA: no prepared claim to rebuild: the kubelet's pods hold none of this driver's claims that the checkpoint lacks")
		}
		return again
	}
	// During a rolling update the other process may have written the file
	// since this one read it: what it prepared meanwhile is kept.
	if cur, found, err := readCheckpoint(d.o.CheckpointPath); err == nil && found {
		for uid, c := range cur.Claims {
			if _, ok := d.cp.Claims[uid]; !ok {
				d.cp.Claims[uid] = c
			}
		}
	}
	if err := d.cp.save(d.o.CheckpointPath); err != nil {
		// Kept in memory: the guard and Unprepare work in this process.
		log.Error("DRA: rebuilt prepared claims but could not write them", "claims", rebuilt, "err", err)
		return again
	}
	log.Warn("DRA: rebuilt prepared claims from the kubelet and the API server", "count", len(rebuilt), "claims", rebuilt)
	return again
}

// heldClaims lists the claims of this driver on this node's pool that
// PodResources says containers hold, each once, sorted.
func (d *Driver) heldClaims(pods []podresources.Pod) []heldClaim {
	byKey := map[string]*heldClaim{}
	for _, p := range pods {
		pod := p.Namespace + "/" + p.Name
		for _, c := range p.Containers {
			for _, dr := range c.Claims {
				for _, r := range dr.Devices {
					if r.Driver != d.o.DriverName || r.Pool != d.o.NodeName {
						continue
					}
					key := dr.Namespace + "/" + dr.Name
					h := byKey[key]
					if h == nil {
						h = &heldClaim{namespace: dr.Namespace, name: dr.Name, cdi: map[string][]string{}}
						byKey[key] = h
					}
					ids := h.cdi[r.Device]
					for _, cd := range r.CDIDevices {
						// The metadata file's CDI device is the helper's: it
						// adds one at each Prepare, and one kept here would
						// outlive draDeviceMetadata being turned off.
						if strings.HasPrefix(cd, d.o.DriverName+"/metadata=") {
							continue
						}
						if !slices.Contains(ids, cd) {
							ids = append(ids, cd)
						}
					}
					h.cdi[r.Device] = ids
					if !slices.Contains(h.pods, pod) {
						h.pods = append(h.pods, pod)
					}
				}
			}
		}
	}
	out := make([]heldClaim, 0, len(byKey))
	for _, h := range byKey {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b heldClaim) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	return out
}

// rebuiltClaim is c as Prepare would have checkpointed it: a device per
// allocation result of this driver on this node, with the CDI device IDs
// the kubelet holds for it. A claim whose allocation lacks a device its
// pods hold is another claim of the same name (deleted and made again), and
// is refused.
func (d *Driver) rebuiltClaim(c *resourceapi.ResourceClaim, h heldClaim) (preparedClaim, error) {
	p := preparedClaim{Namespace: c.Namespace, Name: c.Name}
	if c.Status.Allocation == nil {
		return p, errors.New("not allocated any more")
	}
	allocated := map[string]bool{}
	configOf, cerr := requestConfigs(d.o.DriverName, c.Status.Allocation.Devices.Config)
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.o.DriverName || r.Pool != d.o.NodeName {
			continue
		}
		allocated[r.Device] = true
		dv := preparedDevice{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device,
			CDIDeviceIDs: slices.Clone(h.cdi[r.Device]),
			AdminAccess:  r.AdminAccess != nil && *r.AdminAccess,
			ShareID:      r.ShareID,
		}
		// An MPS client's limits and the interval set, as Prepare found
		// them, so its daemon is run again and the interval put back at
		// Unprepare: the device and the config were accepted then.
		if r.Device == draslice.ChannelDeviceName {
			if cc, err := channelConfigOf(d.o.DriverName, c.Status.Allocation.Devices.Config); err == nil {
				dv.Domain = &preparedDomain{UID: cc.DomainUID, Namespace: cc.DomainNamespace, Name: cc.DomainName, Channel: domainChannel}
			}
		}
		if e, ok := d.byName[r.Device]; ok && cerr == nil {
			dv.MPS, _ = mpsOf(r, e, configOf(r.Request))
			dv.TimeSlice, _ = configOf(r.Request).timeSlice()
		}
		p.Devices = append(p.Devices, dv)
	}
	for dev := range h.cdi {
		if !allocated[dev] {
			return p, fmt.Errorf("its allocation (UID %s) lacks device %s that its pods hold: the claim was made again under the same name", c.UID, dev)
		}
	}
	return p, nil
}

// fillCDILocked gives the devices of a rebuilt claim that the kubelet
// named no CDI device IDs for the IDs of the device now discovered, so a
// repeated Prepare answers as the first one did. It reports whether p
// changed.
func (d *Driver) fillCDILocked(p *preparedClaim) bool {
	changed := false
	for i := range p.Devices {
		dv := &p.Devices[i]
		if len(dv.CDIDeviceIDs) > 0 {
			continue
		}
		if e, ok := d.byName[dv.Device]; ok && len(e.CDIIDs) > 0 {
			dv.CDIDeviceIDs = slices.Clone(e.CDIIDs)
			changed = true
		}
	}
	return changed
}

// Rebuild brings back prepared claims when the checkpoint could not be
// read at start (see rebuildLocked); it does nothing otherwise. Call it
// before the kubelet can call Prepare. What it could not do for lack of
// the kubelet or the API server is tried again before the next Prepare or
// Unprepare.
func (d *Driver) Rebuild(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rebuildIfNeededLocked(ctx)
}

func (d *Driver) rebuildIfNeededLocked(ctx context.Context) {
	if d.rebuild == "" {
		return
	}
	if !d.rebuildLocked(ctx) {
		d.rebuild, d.rebuildTries, d.rebuildSkip = "", 0, nil
	}
}

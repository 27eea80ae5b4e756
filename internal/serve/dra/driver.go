package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// CDISpecs is asked before Prepare hands out a CDI device ID: nil when the
// spec defining kind's devices is on disk and current, else why not. The
// daemon's spec store implements it.
type CDISpecs interface {
	Ensure(kind string) error
}

// Publisher publishes the node's ResourceSlices; *kubeletplugin.Helper is
// one.
type Publisher interface {
	PublishResources(ctx context.Context, r resourceslice.DriverResources) error
}

// Options configure a Driver.
type Options struct {
	// DriverName is the DRA driver name, also the domain of attributes
	// and taint keys.
	DriverName string
	// NodeName names the node and its pool.
	NodeName string
	// SysfsRoot is where sysfs is mounted (PCIe roots are read there).
	SysfsRoot string
	// DevRoot is the host's /dev, for the CDI devices of MIG instances
	// claims create; "" is /dev.
	DevRoot string
	// CheckpointPath keeps prepared claims across restarts; empty makes
	// a driver that only previews its devices (list) and prepares none.
	CheckpointPath string
	// GPUCDIID and NICCDIID name a device's CDI device ID; NICCDIID
	// returns "" for a NIC without one.
	GPUCDIID func(uuid string) string
	NICCDIID func(pool, address string) string
	// Specs, when set, gates Prepare on each CDI kind's spec being on disk.
	Specs CDISpecs
	// PodResources and Claims rebuild the prepared claims when the
	// checkpoint does not parse or is missing (see Rebuild); without
	// either, such claims are logged as lost.
	PodResources PodResources
	Claims       ClaimGetter
	// ClaimStatus, when set, writes the prepared claims' status.devices
	// entries (status.go).
	ClaimStatus ClaimStatuses
	// Sources is how many device sources (GPUs, NIC pools) report before
	// the first publication, so a restart does not briefly publish a
	// slice without the devices of a slower source.
	Sources int
	// HealthResend is how often health is re-sent unchanged; the kubelet
	// takes health not refreshed in HealthTimeout as unknown.
	HealthResend, HealthTimeout time.Duration
	// PublishQuiet and PublishMaxDelay debounce the ResourceSlice
	// updates that health changes make: a change is published once no
	// other came for PublishQuiet, at most PublishMaxDelay after the first
	// change of the burst, and health changes publish at most once per
	// PublishMaxDelay. Zero is DefaultPublishQuiet, DefaultPublishMaxDelay.
	PublishQuiet, PublishMaxDelay time.Duration
	Log                           *slog.Logger
	Now                           func() time.Time
	// AfterFunc runs f in its own goroutine after d, as time.AfterFunc
	// does (the default); tests pass their own clock's.
	AfterFunc func(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc; *time.Timer is one.
type Timer interface {
	Stop() bool
}

// The debounce bounds (docs/api-load.md states them): an XID storm on one
// node is one slice update a second at most, and a change reaches the
// API server within a second.
const (
	DefaultPublishQuiet    = 250 * time.Millisecond
	DefaultPublishMaxDelay = time.Second
)

// devHealth is one device's health as last reported by the model.
type devHealth struct {
	healthy bool
	reason  string
	since   time.Time
	taints  []draslice.Taint
}

// Driver implements kubeletplugin.DRAPlugin over the node's model.
type Driver struct {
	o Options

	// pods are the pods each prepared claim is reserved for, by claim
	// UID, for the UIDs of their Events (PodUID).
	pods reservations

	mu       sync.Mutex
	gpus     []draslice.Device
	counters []draslice.CounterSet
	nics     map[string][]draslice.Device // by pool name
	byName   map[string]*draslice.Device
	// health is by model ID (GPU UUID, NIC PCI address): the watcher may
	// report before the devices are set.
	health   map[string]*devHealth
	reported map[string]bool // sources that have reported
	cp       checkpoint
	// rebuild says why the checkpoint's claims must be rebuilt from the
	// kubelet and the API server; empty when they need not be.
	rebuild string
	// rebuildTries counts rebuilds tried, so a failure is said once;
	// rebuildSkip are the claims (namespace/name) that cannot be rebuilt
	// for good, not asked for again while a rebuild is retried.
	rebuildTries int
	rebuildSkip  map[string]bool
	// seeds are the taints this node's slices carried when the process
	// started, by device name (SeedTaints); published tells they are
	// spent: the first publication carries their times into health.
	seeds     map[string][]draslice.Taint
	published bool
	// changed is closed and replaced at every health change, waking
	// every WatchHealthStatus stream at once.
	changed chan struct{}

	// mps runs the MPS daemons of the prepared MPS clients, their
	// directories under mpsRoot, until mpsCtx ends; nil until SetMPS.
	mps     MPSDaemons
	mpsRoot string
	mpsSpec MPSSpec
	mpsCtx  context.Context
	// timeSlice sets a GPU's time-slice interval; nil until SetMPS.
	timeSlice TimeSlicer

	// mig creates the MIG instances of claims on the partitioned GPUs
	// (parents, by UUID), their CDI spec written through migSpec; nil
	// until SetMIG. migReconciled: the instances an interrupted Prepare
	// left were destroyed.
	mig           MIGInstances
	migSpec       MIGSpec
	migReconciled bool
	parents       map[string]nvml.GPU

	pubMu   sync.Mutex // orders publications
	pub     Publisher
	pubCtx  context.Context
	lastPub *resourceslice.DriverResources // as last published
	ready   func(why string)               // readiness: "" once published

	deb debounce

	statusLog     statusLog
	statusTimeout time.Duration // statusWriteTimeout; tests shorten it
}

// debounce is the publication pending after health changes.
type debounce struct {
	mu    sync.Mutex
	timer Timer
	gen   uint64    // of the pending timer: a stale one does nothing
	first time.Time // first change not yet published; zero: none
	last  time.Time // when the last publication was made
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New makes a driver and loads its checkpoint. A checkpoint that does not
// parse is set aside and logged, and a missing one may have lost claims
// too: Rebuild then brings back the claims the kubelet's pods still hold.
func New(o Options) (*Driver, error) {
	if o.DriverName == "" || o.NodeName == "" {
		return nil, errors.New("dra: driver and node names are required")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = 30 * time.Second
	}
	if o.HealthResend <= 0 {
		o.HealthResend = o.HealthTimeout / 3
	}
	if o.GPUCDIID == nil || o.NICCDIID == nil {
		return nil, errors.New("dra: CDI naming functions are required")
	}
	if o.PublishQuiet <= 0 {
		o.PublishQuiet = DefaultPublishQuiet
	}
	if o.PublishMaxDelay <= 0 {
		o.PublishMaxDelay = DefaultPublishMaxDelay
	}
	if o.AfterFunc == nil {
		o.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	cp, found, err := readCheckpoint(o.CheckpointPath)
	var rebuild string
	switch {
	case errors.Is(err, errCorrupt):
		o.Log.Error("DRA checkpoint", "err", err)
		rebuild = whyCorrupt
	case err != nil:
		o.Log.Error("DRA checkpoint", "err", err)
	case !found && o.CheckpointPath != "":
		rebuild = whyMissing
	case len(cp.Claims) > 0:
		o.Log.Info("restored prepared claims", "count", len(cp.Claims), "path", o.CheckpointPath)
	}
	return &Driver{
		rebuild:       rebuild,
		o:             o,
		nics:          map[string][]draslice.Device{},
		byName:        map[string]*draslice.Device{},
		health:        map[string]*devHealth{},
		reported:      map[string]bool{},
		cp:            cp,
		changed:       make(chan struct{}),
		statusLog:     statusLog{failed: map[types.UID]bool{}},
		statusTimeout: statusWriteTimeout,
	}, nil
}

// NodeName is the node, and the name of its pool.
func (d *Driver) NodeName() string { return d.o.NodeName }

// SetPublisher starts publishing through p, at once if every source has
// reported. Debounced publications use ctx; they stop when it ends.
func (d *Driver) SetPublisher(ctx context.Context, p Publisher) {
	d.pubMu.Lock()
	d.pub, d.pubCtx = p, ctx
	d.pubMu.Unlock()
	d.publish(ctx)
}

// SeedTaints gives the driver the taints this node's slices carry now,
// as an earlier process published them, by device name: a device still
// unhealthy for the same condition keeps its taint's timeAdded, so a
// restart or an upgrade neither rewrites the slice nor shows operators
// the restart's time. Only before the first publication; later, it does
// nothing.
func (d *Driver) SeedTaints(byDevice map[string][]draslice.Taint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.published {
		d.seeds = byDevice
	}
}

// SetGPUs replaces the node's GPUs and publishes at once; none when NVML
// is not there (yet). Their health starts as what SetHealth said last for
// the same UUID, else healthy.
func (d *Driver) SetGPUs(ctx context.Context, in draslice.GPUs) {
	d.mu.Lock()
	d.parents = map[string]nvml.GPU{}
	if len(in.Partitions) > 0 {
		parts := make(map[string]draslice.Partition, len(in.Partitions))
		for _, g := range in.GPUs {
			part, ok := in.Partitions[g.UUID]
			if !ok || !g.MIGEnabled {
				continue
			}
			part.Foreign = d.foreignLocked(g.UUID, part.Layout.Instances)
			for _, gi := range part.Foreign {
				d.o.Log.Warn("MIG: a GPU instance on a partitioned GPU was not made for a claim; it is not served, and no placement over its slices is published",
					"device", g.UUID, "gpuInstance", gi.ID, "profileID", gi.ProfileID, "start", gi.Start, "size", gi.Size)
			}
			parts[g.UUID] = part
			d.parents[g.UUID] = g
		}
		in.Partitions = parts
	}
	d.gpus = draslice.GPUDevices(in, d.o.SysfsRoot, d.o.GPUCDIID, d.o.Log)
	d.counters = draslice.CounterSets(in)
	d.reindex()
	d.reported["gpus"] = true
	d.mu.Unlock()
	d.publish(ctx)
}

// SetNICPool replaces one pool's NICs and their health (devs, by PCI
// address) and publishes: at once for the scan at start (first), when a
// pool reports like a source, debounced like a health change after.
func (d *Driver) SetNICPool(ctx context.Context, p draslice.NICPool, devs []device.Device, first bool) {
	es := draslice.NICDevices(p, d.o.SysfsRoot, d.o.NICCDIID, d.o.Log)
	d.mu.Lock()
	d.nics[p.Name] = es
	d.reindex()
	if first {
		d.reported["nic:"+p.Name] = true
	}
	for _, dv := range devs {
		d.setHealthLocked(dv.ID, dv.Healthy, dv.Reason)
	}
	d.mu.Unlock()
	if first {
		d.publish(ctx)
		return
	}
	d.schedulePublish()
}

// SetHealth records a GPU's or MIG device's health (by its UUID, which is
// the device's model ID) and, on a change, wakes the health streams at
// once and publishes its taints, debounced (schedulePublish). It is
// health.Notifier. The health of a MIG-enabled GPU itself reaches no
// device: it is published as its MIG devices.
func (d *Driver) SetHealth(uuid string, healthy bool, reason string) bool {
	d.mu.Lock()
	changed := d.setHealthLocked(uuid, healthy, reason)
	d.mu.Unlock()
	if changed {
		d.schedulePublish()
	}
	return changed
}

func (d *Driver) setHealthLocked(id string, healthy bool, reason string) bool {
	h := d.health[id]
	if h == nil {
		h = &devHealth{healthy: true}
		d.health[id] = h
	}
	if h.healthy == healthy && h.reason == reason {
		return false
	}
	now := d.o.Now()
	var ts []draslice.Taint
	if !healthy {
		ts = draslice.TaintsOf(d.o.DriverName, reason)
	}
	h.healthy, h.reason, h.since, h.taints = healthy, reason, now, draslice.Stamp(ts, h.taints, now)
	close(d.changed)
	d.changed = make(chan struct{})
	return true
}

func (d *Driver) reindex() {
	clear(d.byName)
	for i := range d.gpus {
		d.byName[d.gpus[i].Name] = &d.gpus[i]
	}
	for _, es := range d.nics {
		for i := range es {
			d.byName[es[i].Name] = &es[i]
		}
	}
}

// Resources is what the driver publishes now: one pool named after the
// node, its devices in slices of at most sliceMaxDevices.
func (d *Driver) Resources() resourceslice.DriverResources {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resourcesLocked()
}

// sliceMaxDevices is the most devices a slice holds. A slice with any
// tainted device takes at most ResourceSliceMaxDevicesWithAdvancedFeatures;
// chunking at that always keeps a device in the same slice when a taint
// comes or goes, instead of splitting the pool anew on the first XID.
const sliceMaxDevices = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

func (d *Driver) resourcesLocked() resourceslice.DriverResources {
	var devs []resourceapi.Device
	add := func(es []draslice.Device) {
		for _, e := range es {
			var taints []draslice.Taint
			if h := d.health[e.ID]; h != nil {
				if s := d.seeds[e.Name]; len(s) > 0 && len(h.taints) > 0 {
					// Kept in health, so the time stays once the seeds go.
					h.taints = draslice.Backdate(h.taints, s)
				}
				taints = h.taints
			}
			devs = append(devs, apiDevice(e, taints))
		}
	}
	add(d.gpus)
	for _, pool := range slices.Sorted(maps.Keys(d.nics)) {
		add(d.nics[pool])
	}
	var sl []resourceslice.Slice
	for chunk := range slices.Chunk(devs, sliceMaxDevices) {
		sl = append(sl, resourceslice.Slice{Devices: chunk})
	}
	// Counter sets have slices of their own: the API takes devices or
	// counter sets in one slice, not both.
	for chunk := range slices.Chunk(d.counters, resourceapi.ResourceSliceMaxCounterSets) {
		sl = append(sl, resourceslice.Slice{SharedCounters: apiCounterSets(chunk)})
	}
	if len(sl) == 0 {
		sl = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{d.o.NodeName: {Slices: sl}}}
}

// schedulePublish publishes after a health change, debounced: a burst of
// changes (an XID storm, a NIC flapping) is one publication, made once no
// change came for PublishQuiet, at most PublishMaxDelay after the burst's
// first change, and never sooner than PublishMaxDelay after the last
// publication. The kubelet's health streams are not delayed.
func (d *Driver) schedulePublish() {
	now := d.o.Now()
	d.deb.mu.Lock()
	defer d.deb.mu.Unlock()
	if d.deb.first.IsZero() {
		d.deb.first = now
	}
	due := d.deb.first.Add(d.o.PublishMaxDelay)
	if quiet := now.Add(d.o.PublishQuiet); quiet.Before(due) {
		due = quiet
	}
	if spaced := d.deb.last.Add(d.o.PublishMaxDelay); due.Before(spaced) {
		due = spaced
	}
	if d.deb.timer != nil {
		d.deb.timer.Stop()
	}
	d.deb.gen++
	gen := d.deb.gen
	d.deb.timer = d.o.AfterFunc(max(due.Sub(now), 0), func() { d.flush(gen) })
}

// flush makes the publication timer gen was set for, unless another
// publication took its place.
func (d *Driver) flush(gen uint64) {
	d.deb.mu.Lock()
	stale := gen != d.deb.gen
	d.deb.mu.Unlock()
	if stale {
		return
	}
	d.pubMu.Lock()
	ctx := d.pubCtx
	d.pubMu.Unlock()
	if ctx == nil || ctx.Err() != nil {
		return
	}
	d.publish(ctx)
}

// UseReadiness has the driver say whether its ResourceSlices were handed
// to the publisher: ready("") once the first complete set was (every
// source reported), else ready(why not).
func (d *Driver) UseReadiness(ready func(why string)) {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	d.ready = ready
	if d.lastPub == nil {
		ready("waiting for the GPUs and every NIC pool to be discovered before publishing ResourceSlices")
	} else {
		ready("")
	}
}

// setReady tells readiness; pubMu is held.
func (d *Driver) setReady(why string) {
	if d.ready != nil {
		d.ready(why)
	}
}

// publish hands the slices to the publisher now, unless they are the
// ones it has: the helper's controller would find nothing to write, and
// at rest nothing is sent. It takes the place of any pending debounced
// publication, whose changes it carries.
func (d *Driver) publish(ctx context.Context) {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	if d.pub == nil {
		return
	}
	d.mu.Lock()
	if len(d.reported) < d.o.Sources {
		d.mu.Unlock()
		return
	}
	d.deb.mu.Lock()
	if d.deb.timer != nil {
		d.deb.timer.Stop()
		d.deb.timer = nil
	}
	d.deb.gen++
	d.deb.first = time.Time{}
	d.deb.mu.Unlock()
	res := d.resourcesLocked()
	// The seeds' times are in health now; a device unhealthy only from
	// here on is a new condition.
	d.seeds, d.published = nil, true
	d.mu.Unlock()
	if d.lastPub != nil && apiequality.Semantic.DeepEqual(*d.lastPub, res) {
		return
	}
	if err := d.pub.PublishResources(ctx, res); err != nil {
		d.o.Log.Error("publishing ResourceSlices", "err", err)
		d.setReady(fmt.Sprintf("publishing ResourceSlices: %v", err))
		return
	}
	d.setReady("")
	d.lastPub = &res
	d.deb.mu.Lock()
	d.deb.last = d.o.Now()
	d.deb.mu.Unlock()
}

// PrepareResourceClaims answers each claim with the CDI device IDs of its
// devices on this node. A claim prepared before (by this process or an
// earlier one) gets the same answer again. A claim is reported prepared
// only once the checkpoint on disk holds it. Then, outside the lock, the
// prepared claims' status.devices entries are written (writeClaimStatus).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.pods.record(claims)
	out, waits, err := d.prepareClaims(ctx, claims)
	d.undoPrepared(ctx, awaitMPS(ctx, waits, out))
	d.writeClaimStatus(ctx, claims, out)
	return out, err
}

// prepareClaims prepares claims under the lock, and says which answers
// wait for MPS daemons to come up.
func (d *Driver) prepareClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, map[types.UID]mpsWait, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	waits := map[types.UID]mpsWait{}
	d.reloadLocked()
	d.rebuildIfNeededLocked(ctx)
	d.reconcileMIGLocked()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
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
					out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
					continue
				}
				d.cp.Claims[c.UID], filled = p, true
			}
			// The kubelet prepares again at each pod start: the answer
			// waits for the daemons again.
			w, ok, err := d.mpsWaitLocked(p)
			if err != nil {
				out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
				continue
			}
			if ok {
				waits[c.UID] = w
			}
			out[c.UID] = kubeletplugin.PrepareResult{Devices: p.result()}
			continue
		}
		p, err := d.prepareLocked(ctx, c)
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
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
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
		out[c.UID] = kubeletplugin.PrepareResult{Devices: p.result()}
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
				out[uid] = kubeletplugin.PrepareResult{Err: err}
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

func (d *Driver) prepareLocked(ctx context.Context, c *resourceapi.ResourceClaim) (preparedClaim, error) {
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

func (p preparedClaim) result() []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(p.Devices))
	for i, dv := range p.Devices {
		out[i] = kubeletplugin.Device{
			Requests: slices.Clone(dv.Requests), PoolName: dv.Pool, DeviceName: dv.Device,
			CDIDeviceIDs: slices.Clone(dv.CDIDeviceIDs), ShareID: dv.ShareID,
		}
	}
	return out
}

// UnprepareResourceClaims forgets the claims. One not prepared is no
// error: the kubelet retries, and restarts.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.pods.forget(claims)
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

// HandleError logs background errors (publishing slices). The helper
// retries them; none is a reason to stop serving prepared claims.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.o.Log.Error("DRA: "+msg, "err", err)
}

// WatchHealthStatus sends every device's health now, at every change, and
// at least every HealthResend, until ctx ends. The message is the reason,
// spelled out (xid=79: fallen off the bus).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		d.mu.Lock()
		rep, changed := d.healthReportLocked(), d.changed
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- rep:
		}
		t := time.NewTimer(d.o.HealthResend)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

func (d *Driver) healthReportLocked() kubeletplugin.DeviceHealthReport {
	var rep kubeletplugin.DeviceHealthReport
	add := func(es []draslice.Device) {
		for _, e := range es {
			dh := kubeletplugin.DeviceHealth{
				PoolName: d.o.NodeName, DeviceName: e.Name, Health: kubeletplugin.HealthStatusHealthy,
				HealthCheckTimeout: d.o.HealthTimeout,
			}
			if h := d.health[e.ID]; h != nil {
				dh.LastUpdated = h.since
				if !h.healthy {
					dh.Health = kubeletplugin.HealthStatusUnhealthy
					dh.Message = h.reason
					if e.Type == draslice.TypeGPU || e.Type == draslice.TypeMIG {
						dh.Message = health.Describe(h.reason)
					}
				}
			}
			rep.Devices = append(rep.Devices, dh)
		}
	}
	add(d.gpus)
	for _, pool := range slices.Sorted(maps.Keys(d.nics)) {
		add(d.nics[pool])
	}
	return rep
}

// apiDevice is d as the API has it, with taints.
func apiDevice(d draslice.Device, taints []draslice.Taint) resourceapi.Device {
	out := resourceapi.Device{Name: d.Name, Attributes: make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))}
	if d.AllowMultipleAllocations {
		out.AllowMultipleAllocations = &d.AllowMultipleAllocations
	}
	for k, a := range d.Attributes {
		out.Attributes[resourceapi.QualifiedName(k)] = resourceapi.DeviceAttribute{IntValue: a.Int, BoolValue: a.Bool, StringValue: a.String, VersionValue: a.Version}
	}
	if len(d.Capacity) > 0 {
		out.Capacity = make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(d.Capacity))
		for k, c := range d.Capacity {
			// draslice writes valid quantities; a bad one would be dropped
			// by the API server anyway.
			q, err := resource.ParseQuantity(c.Value)
			if err != nil {
				continue
			}
			dc := resourceapi.DeviceCapacity{Value: q}
			if p := c.RequestPolicy; p != nil {
				def, derr := resource.ParseQuantity(p.Default)
				lo, lerr := resource.ParseQuantity(p.Min)
				if derr == nil && lerr == nil {
					dc.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: &def, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &lo}}
				}
			}
			out.Capacity[resourceapi.QualifiedName(k)] = dc
		}
	}
	for _, c := range d.ConsumesCounters {
		out.ConsumesCounters = append(out.ConsumesCounters, resourceapi.DeviceCounterConsumption{CounterSet: c.CounterSet, Counters: apiCounters(c.Counters)})
	}
	for _, t := range taints {
		dt := resourceapi.DeviceTaint{Key: t.Key, Value: t.Value, Effect: resourceapi.DeviceTaintEffect(t.Effect)}
		if t.TimeAdded != nil {
			dt.TimeAdded = &metav1.Time{Time: *t.TimeAdded}
		}
		out.Taints = append(out.Taints, dt)
	}
	return out
}

// apiCounterSets are the counter sets as the API has them.
func apiCounterSets(sets []draslice.CounterSet) []resourceapi.CounterSet {
	out := make([]resourceapi.CounterSet, len(sets))
	for i, c := range sets {
		out[i] = resourceapi.CounterSet{Name: c.Name, Counters: apiCounters(c.Counters)}
	}
	return out
}

func apiCounters(in map[string]int64) map[string]resourceapi.Counter {
	out := make(map[string]resourceapi.Counter, len(in))
	for k, v := range in {
		out[k] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
	}
	return out
}

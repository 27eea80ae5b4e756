package dra

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
)

// The debounce bounds (docs/api-load.md states them): an XID storm on one
// node is one slice update a second at most, and a change reaches the
// API server within a second.
const (
	DefaultPublishQuiet    = 250 * time.Millisecond
	DefaultPublishMaxDelay = time.Second
)

// debounce is the publication pending after health changes.
type debounce struct {
	mu    sync.Mutex
	timer Timer
	gen   uint64    // of the pending timer: a stale one does nothing
	first time.Time // first change not yet published; zero: none
	last  time.Time // when the last publication was made
}

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

// Resources is what the driver publishes now: one pool named after the
// node, its devices in slices of at most sliceMaxDevices.
func (d *Driver) Resources() slicepub.DriverResources {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resourcesLocked()
}

// sliceMaxDevices is the most devices a slice holds. A slice with any
// tainted device takes at most ResourceSliceMaxDevicesWithAdvancedFeatures;
// chunking at that always keeps a device in the same slice when a taint
// comes or goes, instead of splitting the pool anew on the first XID.
const sliceMaxDevices = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

func (d *Driver) resourcesLocked() slicepub.DriverResources {
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
				if d.evict[gpuOf(e)] {
					taints = draslice.Evicting(taints)
				}
			}
			devs = append(devs, apiDevice(e, taints))
		}
	}
	add(d.gpus)
	for _, pool := range slices.Sorted(maps.Keys(d.nics)) {
		add(d.nics[pool])
	}
	var sl []slicepub.Slice
	for chunk := range slices.Chunk(devs, sliceMaxDevices) {
		sl = append(sl, slicepub.Slice{Devices: chunk})
	}
	// Counter sets have slices of their own: the API takes devices or
	// counter sets in one slice, not both.
	for chunk := range slices.Chunk(d.counters, resourceapi.ResourceSliceMaxCounterSets) {
		sl = append(sl, slicepub.Slice{SharedCounters: apiCounterSets(chunk)})
	}
	if len(sl) == 0 {
		sl = []slicepub.Slice{{}}
	}
	return slicepub.DriverResources{Pools: map[string]slicepub.Pool{d.o.NodeName: {Slices: sl}}}
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

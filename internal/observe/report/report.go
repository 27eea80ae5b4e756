package report

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// DefaultComponent is the Events' source and reporting component.
const DefaultComponent = "gpu-device-plugin"

// Class is the kind of device: it picks the Event reasons and the Node
// condition.
type Class int

// The classes.
const (
	GPU Class = iota
	NIC
	numClasses
)

// ClassOf is the class of a resource's devices.
func ClassOf(resource string) Class {
	if resource == resname.GPU {
		return GPU
	}
	return NIC
}

// The Event reasons, Node condition types and condition reasons.
const (
	ReasonGPUUnhealthy   = "GPUUnhealthy"
	ReasonGPURecovered   = "GPURecovered"
	ReasonNICUnhealthy   = "NICUnhealthy"
	ReasonNICRecovered   = "NICRecovered"
	ConditionGPUHealthy  = "GPUHealthy"
	ConditionNICHealthy  = "NICHealthy"
	ReasonAllGPUsHealthy = "AllGPUsHealthy"
	ReasonAllNICsHealthy = "AllNICsHealthy"
	// ReasonNodeRebootRequired is the GPUHealthy condition's reason
	// while a GPU's remediation says the node needs a reboot (SetReboot).
	ReasonNodeRebootRequired = "NodeRebootRequired"
)

type classInfo struct {
	noun, condType, unhealthy, recovered, allHealthy string
}

var classes = [numClasses]classInfo{
	GPU: {"GPU", ConditionGPUHealthy, ReasonGPUUnhealthy, ReasonGPURecovered, ReasonAllGPUsHealthy},
	NIC: {"NIC", ConditionNICHealthy, ReasonNICUnhealthy, ReasonNICRecovered, ReasonAllNICsHealthy},
}

// The limits doc.go describes.
const (
	eventBurst      = 20
	eventRefill     = 3 * time.Second
	aggregateWindow = 10 * time.Minute
	updateInterval  = time.Minute
	queueSize       = 1024
	maxRecords      = 4096
	logInterval     = time.Minute
	// maxMessage bounds an Event's message and the condition's:
	// events.k8s.io refuses notes over 1 kB, and a condition listing
	// every GPU of a broken node should stay readable.
	maxMessage = 1024
	// conditionInterval spaces a condition's PATCHes.
	conditionInterval = time.Second
)

// Pod names a Pod. UID is its UID when the node could tell it (the
// kubelet's device-manager checkpoint, a DRA claim's reservedFor); the
// reporter never asks the API server, so that no node may read pods.
type Pod struct {
	Namespace, Name string
	UID             string
}

// Holders says which Pods hold a device now. It may be slow (it asks the
// kubelet); it is called on Run's goroutine only.
type Holders interface {
	HoldersOf(ctx context.Context, resource, deviceID string) ([]Pod, error)
}

// HoldersFunc is a function as Holders.
type HoldersFunc func(ctx context.Context, resource, deviceID string) ([]Pod, error)

// HoldersOf calls f.
func (f HoldersFunc) HoldersOf(ctx context.Context, resource, deviceID string) ([]Pod, error) {
	return f(ctx, resource, deviceID)
}

// API is the calls made; *kubeapi.Client is one.
type API interface {
	CreateEvent(ctx context.Context, e kubeapi.Event) error
	PatchEvent(ctx context.Context, namespace, name string, count int32, last kubeapi.Time) error
	GetNode(ctx context.Context, name string) (kubeapi.Node, error)
	PatchNodeCondition(ctx context.Context, node string, c kubeapi.NodeCondition) error
}

// Options configure a Reporter.
type Options struct {
	// Node is this node's name. Required.
	Node string
	// Events turns on Events; NodeCondition the GPUHealthy condition, and
	// NICHealthy too when NICs is set (NIC pools are configured).
	Events, NodeCondition, NICs bool
	// Holders finds the Pods holding a device, for their Events; nil:
	// Events go to the Node only.
	Holders Holders
	// Component is the Events' source; empty is DefaultComponent.
	Component string
	Log       *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Backoff is the retry policy after a failed write; zero is
	// backoff.Default.
	Backoff backoff.Policy
}

type devKey struct{ resource, id string }

type devState struct {
	label   string
	healthy bool
	reason  string
}

// transition is a change of state waiting to become Events.
type transition struct {
	resource, id, label string
	healthy             bool
	reason, oldReason   string
	at                  time.Time
	// event is set for an Event of its own (Reporter.Event), not a change
	// of health; with no id, one about the Node (Reporter.NodeEvent).
	event *event
}

type event struct {
	reason, message string
	warning         bool
}

// Reporter turns health transitions into Events and Node conditions.
type Reporter struct {
	api API
	o   Options
	log *slog.Logger
	now func() time.Time

	wake chan struct{}

	mu           sync.Mutex
	devs         map[devKey]*devState
	queue        []transition
	synced       [numClasses]bool
	dirty        [numClasses]bool
	notices      [numClasses]notice
	remarks      [numClasses]string
	reboots      [numClasses]string
	dropped      int // since the last log line
	droppedTotal int

	// Run's goroutine only.
	records  map[evKey]*record
	seq      uint64
	bucket   bucket
	lastName int64
	conds    [numClasses]condState
	nodeUID  string
	lastDrop time.Time
	warned   map[string]warnState
	// noPodUIDLogged: an Event about a pod went without its UID, and
	// that was logged.
	noPodUIDLogged bool
	// evBackoff is the run of failed Event requests; no Event is sent
	// before evPause.
	evBackoff backoff.Backoff
	evPause   time.Time
	// hold is when the server's last throttle (429, or a 5xx with
	// Retry-After) ends: nothing at all is sent before.
	hold time.Time
}

// New builds a Reporter; Run sends what it reports.
func New(api API, o Options) (*Reporter, error) {
	if api == nil {
		return nil, errors.New("report: no API client")
	}
	if o.Node == "" {
		return nil, errors.New("report: no node name")
	}
	if o.Component == "" {
		o.Component = DefaultComponent
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Reporter{
		api: api, o: o, log: o.Log, now: o.Now,
		wake:      make(chan struct{}, 1),
		devs:      map[devKey]*devState{},
		records:   map[evKey]*record{},
		bucket:    bucket{burst: eventBurst, every: eventRefill},
		warned:    map[string]warnState{},
		evBackoff: backoff.Backoff{Policy: o.Backoff},
	}
	for c := range r.conds {
		r.conds[c].backoff.Policy = o.Backoff
	}
	return r, nil
}

// Transition reports a device's health now. It may be called for every
// notification, changed or not: only changes count. A device first seen
// healthy is recorded without an Event; one first seen unhealthy gets
// one. label names the device for people ("GPU-… (index 3)",
// "0000:3b:00.0"); empty is deviceID. It never blocks.
func (r *Reporter) Transition(resource, deviceID, label string, healthy bool, reason string) {
	if healthy {
		reason = ""
	}
	if label == "" {
		label = deviceID
	}
	k := devKey{resource, deviceID}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.devs[k]
	if st == nil {
		st = &devState{healthy: true}
		r.devs[k] = st
	}
	st.label = label
	if st.healthy == healthy && st.reason == reason {
		return
	}
	was, oldReason := st.healthy, st.reason
	st.healthy, st.reason = healthy, reason
	r.dirty[ClassOf(resource)] = true
	if r.o.Events && was != healthy {
		r.enqueue(transition{resource: resource, id: deviceID, label: label, healthy: healthy, reason: reason, oldReason: oldReason, at: r.now()})
	}
	r.signal()
}

// enqueue queues an Event, or counts it dropped when the queue is full;
// r.mu is held.
func (r *Reporter) enqueue(t transition) {
	if len(r.queue) >= queueSize {
		r.dropped++
		r.droppedTotal++
		return
	}
	r.queue = append(r.queue, t)
}

// Event reports something that happened to a device beyond its health
// (a remediation withheld, reset or gave back a GPU): an Event with
// reason and message on the Node and on the pods holding the device,
// aggregated and rate-limited as health's. It never blocks.
func (r *Reporter) Event(resource, deviceID, label, reason, message string, warning bool) {
	if label == "" {
		label = deviceID
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.o.Events {
		return
	}
	r.enqueue(transition{resource: resource, id: deviceID, label: label, at: r.now(), event: &event{reason, message, warning}})
	r.signal()
}

// NodeEvent reports something that happened to the Node itself (the
// remediation cordoned it): an Event on the Node only, aggregated and
// rate-limited as the others. It never blocks.
func (r *Reporter) NodeEvent(reason, message string, warning bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.o.Events {
		return
	}
	r.enqueue(transition{at: r.now(), event: &event{reason, message, warning}})
	r.signal()
}

// Forget drops a device that is gone (a NIC that left its pool), so the
// condition no longer lists it.
func (r *Reporter) Forget(resource, deviceID string) {
	k := devKey{resource, deviceID}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.devs[k]
	if st == nil {
		return
	}
	delete(r.devs, k)
	if !st.healthy {
		r.dirty[ClassOf(resource)] = true
		r.signal()
	}
}

// Synced says every device of class c has reported its first state: its
// Node condition may be sent.
func (r *Reporter) Synced(c Class) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.synced[c] {
		r.synced[c] = true
		r.signal()
	}
}

// Dropped is how many Events were dropped, in all.
func (r *Reporter) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.droppedTotal
}

func (r *Reporter) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run sends Events and conditions until ctx ends.
func (r *Reporter) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		next := r.pump(ctx)
		var fire <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(next.Sub(r.now()), 0))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-fire:
		}
		timer.Stop()
	}
}

// pump does everything due now and says when it next has something to
// do (zero: only when woken).
func (r *Reporter) pump(ctx context.Context) time.Time {
	r.mu.Lock()
	q := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, t := range q {
		r.observe(ctx, t)
	}
	next := r.flushEvents(ctx)
	next = earliest(next, r.syncConditions(ctx))
	return earliest(next, r.logDrops())
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// Events.

// warnState throttles one kind of warning.
type warnState struct {
	last       time.Time
	suppressed int
}

// warn logs at most once per logInterval per key, with a count of those
// left out: an unreachable API server must not fill the log.
func (r *Reporter) warn(key, msg string, args ...any) {
	now := r.now()
	w := r.warned[key]
	if !w.last.IsZero() && now.Sub(w.last) < logInterval {
		w.suppressed++
		r.warned[key] = w
		return
	}
	if w.suppressed > 0 {
		args = append(args, "suppressed", w.suppressed)
	}
	r.log.Warn(msg, args...)
	r.warned[key] = warnState{last: now}
}

// warnErr is warn, quiet when ctx ended (shutdown).
func (r *Reporter) warnErr(ctx context.Context, key, msg string, err error, args ...any) {
	if ctx.Err() != nil {
		return
	}
	r.warn(key, msg, append(args, "err", err)...)
}

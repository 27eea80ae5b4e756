package report

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/kubeapi"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// GPUResource is the resource whose devices are GPUs; every other
// resource is a NIC pool.
const GPUResource = device.GPUResource

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
	if resource == GPUResource {
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
	retryMin   = time.Second
	retryMax   = 2 * time.Minute
)

// Pod names a Pod.
type Pod struct {
	Namespace, Name string
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
	GetPod(ctx context.Context, namespace, name string) (kubeapi.Pod, error)
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
	return &Reporter{
		api: api, o: o, log: o.Log, now: o.Now,
		wake:    make(chan struct{}, 1),
		devs:    map[devKey]*devState{},
		records: map[evKey]*record{},
		bucket:  bucket{burst: eventBurst, every: eventRefill},
		warned:  map[string]warnState{},
	}, nil
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
		if len(r.queue) >= queueSize {
			r.dropped++
			r.droppedTotal++
		} else {
			r.queue = append(r.queue, transition{resource: resource, id: deviceID, label: label, healthy: healthy, reason: reason, oldReason: oldReason, at: r.now()})
		}
	}
	r.signal()
}

// notice is a node-wide problem with a class's devices that no one device's
// health shows: the condition carries it.
type notice struct{ reason, message string }

// SetNotice puts a node-wide problem on class c's condition (empty reason
// clears it): the condition's reason becomes reason while every device is
// healthy, and its message ends with message either way. The GPU CDI hook
// missing is one: each GPU is fine, yet CUDA may fail in containers.
func (r *Reporter) SetNotice(c Class, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := notice{reason, message}
	if reason == "" {
		n = notice{}
	}
	if r.notices[c] == n {
		return
	}
	r.notices[c] = n
	r.dirty[c] = true
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

// evKey is what makes two Events the same.
type evKey struct {
	kind, namespace, name, reason, message string
}

// record is one Event as sent (or to be sent): count is every
// occurrence, sent how many the API has been told of.
type record struct {
	key         evKey
	typ         string
	seq         uint64
	uid         string // a Pod's, once read
	apiName     string // the Event's name once created
	count, sent int32
	first, last time.Time
	lastSent    time.Time
}

func (r *Reporter) observe(ctx context.Context, t transition) {
	c := classes[ClassOf(t.resource)]
	reason, typ := c.unhealthy, kubeapi.EventWarning
	msg := describe(t.resource, t.label, t.reason)
	if t.healthy {
		reason, typ = c.recovered, kubeapi.EventNormal
		msg = deviceName(t.resource, t.label) + " is healthy again"
		if t.oldReason != "" {
			msg += " (was: " + health.Describe(t.oldReason) + ")"
		}
	}
	msg = truncate(msg, maxMessage)
	targets := []evKey{{kind: "Node", name: r.o.Node}}
	if r.o.Holders != nil {
		pods, err := r.o.Holders.HoldersOf(ctx, t.resource, t.id)
		if err != nil {
			r.warn("holders", "cannot tell which pods hold the device; its Event goes to the Node only", "resource", t.resource, "device", t.id, "err", err)
		}
		seen := map[Pod]bool{}
		for _, p := range pods {
			if !seen[p] {
				seen[p] = true
				targets = append(targets, evKey{kind: "Pod", namespace: p.Namespace, name: p.Name})
			}
		}
	}
	for _, k := range targets {
		k.reason, k.message = reason, msg
		rec := r.records[k]
		if rec != nil && t.at.Sub(rec.last) < aggregateWindow {
			rec.count++
			rec.last = t.at
			continue
		}
		if rec != nil {
			r.expire(k, rec)
		}
		if len(r.records) >= maxRecords {
			r.prune(t.at)
			if len(r.records) >= maxRecords {
				r.drop(1)
				continue
			}
		}
		r.seq++
		r.records[k] = &record{key: k, typ: typ, seq: r.seq, count: 1, first: t.at, last: t.at}
	}
}

// describe is "label: reason", each XID named.
func describe(resource, label, reason string) string {
	return deviceName(resource, label) + ": " + health.Describe(reason)
}

// deviceName is a device's label; a NIC's pool is named too, as several
// pools may take NICs of one model.
func deviceName(resource, label string) string {
	if ClassOf(resource) == NIC {
		return label + " (" + resource + ")"
	}
	return label
}

func (r *Reporter) expire(k evKey, rec *record) {
	if rec.count > rec.sent {
		r.drop(int(rec.count - rec.sent))
	}
	delete(r.records, k)
}

// prune forgets Events not seen for the aggregation window.
func (r *Reporter) prune(now time.Time) {
	for k, rec := range r.records {
		if now.Sub(rec.last) >= aggregateWindow {
			r.expire(k, rec)
		}
	}
}

func (r *Reporter) drop(n int) {
	r.mu.Lock()
	r.dropped += n
	r.droppedTotal += n
	r.mu.Unlock()
}

// flushEvents sends the Events due, as tokens allow: new ones first,
// oldest first, then count updates.
func (r *Reporter) flushEvents(ctx context.Context) time.Time {
	now := r.now()
	r.prune(now)
	var next time.Time
	var creates, updates []*record
	for _, rec := range r.records {
		if rec.count <= rec.sent {
			continue
		}
		if rec.sent > 0 {
			if due := rec.lastSent.Add(updateInterval); now.Before(due) {
				next = earliest(next, due)
				continue
			}
		}
		if rec.apiName == "" {
			creates = append(creates, rec)
		} else {
			updates = append(updates, rec)
		}
	}
	bySeq := func(a, b *record) int { return cmp.Compare(a.seq, b.seq) }
	slices.SortFunc(creates, bySeq)
	slices.SortFunc(updates, bySeq)
	for _, rec := range append(creates, updates...) {
		if ctx.Err() != nil {
			return time.Time{}
		}
		if !r.bucket.take(now) {
			return earliest(next, r.bucket.next(now))
		}
		r.send(ctx, rec, now)
	}
	return next
}

// send creates rec's Event, or updates its count. A failure is logged
// and not retried: the next occurrence tries again.
func (r *Reporter) send(ctx context.Context, rec *record, now time.Time) {
	k := rec.key
	ns := k.namespace
	if k.kind == "Node" {
		// Events about cluster-scoped objects live in "default".
		ns = "default"
	}
	defer func() { rec.sent, rec.lastSent = rec.count, now }()
	if rec.apiName != "" {
		err := r.api.PatchEvent(ctx, ns, rec.apiName, rec.count, kubeapi.NewTime(rec.last))
		if err == nil {
			r.log.Debug("updated Event count", "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason, "count", rec.count)
			return
		}
		if !kubeapi.IsNotFound(err) {
			r.warnErr(ctx, "event", "updating a Kubernetes Event", err, "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason)
			return
		}
		// The API server let it expire (an hour, by default): a new one.
		rec.apiName = ""
	}
	ref := kubeapi.ObjectReference{Kind: k.kind, Namespace: k.namespace, Name: k.name, APIVersion: "v1"}
	switch k.kind {
	case "Node":
		ref.UID = r.nodeUIDFor(ctx)
	case "Pod":
		if rec.uid == "" {
			p, err := r.api.GetPod(ctx, k.namespace, k.name)
			switch {
			case kubeapi.IsNotFound(err):
				r.log.Debug("pod holding a device is gone; no Event for it", "pod", k.namespace+"/"+k.name, "reason", k.reason)
				return
			case err != nil:
				// Sent without its UID: kubectl get events still lists it.
				r.warnErr(ctx, "pod", "reading a pod's UID for its Event", err, "pod", k.namespace+"/"+k.name)
			default:
				rec.uid = p.Metadata.UID
			}
		}
		ref.UID = rec.uid
	}
	name := fmt.Sprintf("%s.%x", k.name, r.uniqueNano(now))
	e := kubeapi.Event{
		Metadata:           kubeapi.ObjectMeta{Name: name, Namespace: ns},
		InvolvedObject:     ref,
		Reason:             k.reason,
		Message:            k.message,
		Type:               rec.typ,
		Source:             kubeapi.EventSource{Component: r.o.Component, Host: r.o.Node},
		FirstTimestamp:     kubeapi.NewTime(rec.first),
		LastTimestamp:      kubeapi.NewTime(rec.last),
		Count:              rec.count,
		ReportingComponent: r.o.Component,
		ReportingInstance:  r.o.Node,
	}
	if err := r.api.CreateEvent(ctx, e); err != nil {
		r.warnErr(ctx, "event", "creating a Kubernetes Event", err, "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason)
		return
	}
	rec.apiName = name
	r.log.Debug("created Event", "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason, "message", k.message)
}

// nodeUIDFor is the Node's UID, read once. Until it can be read, the
// node's name stands in: the kubelet's own Node Events use it, and
// kubectl describe node finds Events by either.
func (r *Reporter) nodeUIDFor(ctx context.Context) string {
	if r.nodeUID == "" {
		n, err := r.api.GetNode(ctx, r.o.Node)
		if err != nil {
			r.warnErr(ctx, "node", "reading the Node's UID", err, "node", r.o.Node)
			return r.o.Node
		}
		r.nodeUID = n.Metadata.UID
	}
	return r.nodeUID
}

// uniqueNano makes Event names unique, as client-go does (name.hex
// nanoseconds), even for two Events in one clock tick.
func (r *Reporter) uniqueNano(now time.Time) int64 {
	n := now.UnixNano()
	if n <= r.lastName {
		n = r.lastName + 1
	}
	r.lastName = n
	return n
}

func (r *Reporter) logDrops() time.Time {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped == 0 {
		return time.Time{}
	}
	if due := r.lastDrop.Add(logInterval); !r.lastDrop.IsZero() && now.Before(due) {
		return due
	}
	r.log.Warn("Kubernetes Events dropped to spare the API server", "dropped", r.dropped, "droppedTotal", r.droppedTotal)
	r.dropped, r.lastDrop = 0, now
	return time.Time{}
}

// bucket is a token bucket over Event writes.
type bucket struct {
	burst  float64
	every  time.Duration
	tokens float64
	at     time.Time
}

func (b *bucket) refill(now time.Time) {
	if b.at.IsZero() {
		b.tokens, b.at = b.burst, now
		return
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(b.burst, b.tokens+float64(d)/float64(b.every))
		b.at = now
	}
}

func (b *bucket) take(now time.Time) bool {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// next is when the next token is there.
func (b *bucket) next(now time.Time) time.Time {
	b.refill(now)
	return now.Add(time.Duration((1 - b.tokens) * float64(b.every)))
}

// Node conditions.

// condState is what the Node was last told of one condition.
type condState struct {
	read    bool // the Node's own copy was read, for its transition time
	sent    bool // a PATCH succeeded
	status  string
	since   time.Time
	retryAt time.Time
	backoff time.Duration
}

func (r *Reporter) syncConditions(ctx context.Context) time.Time {
	if !r.o.NodeCondition {
		return time.Time{}
	}
	var next time.Time
	for c := range numClasses {
		if c == NIC && !r.o.NICs {
			continue
		}
		cs := &r.conds[c]
		r.mu.Lock()
		need := r.synced[c] && (r.dirty[c] || !cs.sent)
		r.mu.Unlock()
		if !need || ctx.Err() != nil {
			continue
		}
		now := r.now()
		if now.Before(cs.retryAt) {
			next = earliest(next, cs.retryAt)
			continue
		}
		typ := classes[c].condType
		if !cs.read {
			// Keep the transition time the Node has, so a restart is not
			// a transition.
			n, err := r.api.GetNode(ctx, r.o.Node)
			var se *kubeapi.StatusError
			switch {
			case err == nil:
				cs.read = true
				r.nodeUID = n.Metadata.UID
				if old, ok := n.Condition(typ); ok {
					cs.status, cs.since = old.Status, old.LastTransitionTime.Time
				}
			case errors.As(err, &se):
				// Answered (not allowed to read, say): patch anyway.
				cs.read = true
				r.warnErr(ctx, "node", "reading the Node's conditions; the first "+typ+" sets a new transition time", err, "node", r.o.Node)
			}
		}
		r.mu.Lock()
		cond := r.conditionLocked(c)
		r.dirty[c] = false
		r.mu.Unlock()
		since := cs.since
		if cond.Status != cs.status || since.IsZero() {
			since = now
		}
		cond.LastHeartbeatTime, cond.LastTransitionTime = kubeapi.NewTime(now), kubeapi.NewTime(since)
		if err := r.api.PatchNodeCondition(ctx, r.o.Node, cond); err != nil {
			r.mu.Lock()
			r.dirty[c] = true
			r.mu.Unlock()
			cs.backoff = min(max(2*cs.backoff, retryMin), retryMax)
			cs.retryAt = now.Add(cs.backoff)
			next = earliest(next, cs.retryAt)
			r.warnErr(ctx, "condition", "setting the Node condition; retrying", err, "node", r.o.Node, "condition", typ, "retryIn", cs.backoff.String())
			continue
		}
		if cond.Status != cs.status || !cs.sent {
			r.log.Info("Node condition set", "node", r.o.Node, "condition", typ, "status", cond.Status, "reason", cond.Reason, "message", cond.Message)
		}
		cs.sent, cs.status, cs.since, cs.backoff, cs.retryAt = true, cond.Status, since, 0, time.Time{}
	}
	return next
}

// conditionLocked is class c's condition now, without times.
func (r *Reporter) conditionLocked(c Class) kubeapi.NodeCondition {
	info := classes[c]
	type bad struct{ resource, label, reason string }
	var bads []bad
	n := 0
	for k, st := range r.devs {
		if ClassOf(k.resource) != c {
			continue
		}
		n++
		if !st.healthy {
			bads = append(bads, bad{k.resource, st.label, st.reason})
		}
	}
	note := r.notices[c]
	withNote := func(msg string) string {
		if note.reason == "" {
			return msg
		}
		return msg + "; " + note.message
	}
	if len(bads) == 0 {
		msg := fmt.Sprintf("all %d %ss are healthy", n, info.noun)
		if n == 0 {
			msg = "no " + info.noun + "s found"
		}
		reason := info.allHealthy
		if note.reason != "" {
			reason = note.reason
		}
		return kubeapi.NodeCondition{Type: info.condType, Status: kubeapi.ConditionTrue, Reason: reason, Message: withNote(msg)}
	}
	slices.SortFunc(bads, func(a, b bad) int { return cmp.Or(cmp.Compare(a.label, b.label), cmp.Compare(a.resource, b.resource)) })
	items := make([]string, len(bads))
	for i, b := range bads {
		items[i] = describe(b.resource, b.label, b.reason)
	}
	limit := maxMessage
	if note.reason != "" {
		limit -= len(note.message) + 2
	}
	return kubeapi.NodeCondition{Type: info.condType, Status: kubeapi.ConditionFalse, Reason: info.unhealthy, Message: withNote(joinLimited(items, limit))}
}

// joinLimited joins items with "; ", as many as fit in limit bytes, and
// says how many more there are.
func joinLimited(items []string, limit int) string {
	for n := len(items); n > 0; n-- {
		s := strings.Join(items[:n], "; ")
		if n < len(items) {
			s += fmt.Sprintf("; and %d more", len(items)-n)
		}
		if len(s) <= limit {
			return s
		}
	}
	more := ""
	if len(items) > 1 {
		more = fmt.Sprintf("; and %d more", len(items)-1)
	}
	return truncate(items[0], limit-len(more)) + more
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	m := mark
	if n < len(mark) {
		m = ""
	}
	cut := max(n-len(m), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + m
}

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

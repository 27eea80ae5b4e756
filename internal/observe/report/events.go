package report

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

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
	uid         string // a Pod's, when the node could tell it
	apiName     string // the Event's name once created
	count, sent int32
	first, last time.Time
	lastSent    time.Time
}

func (r *Reporter) observe(ctx context.Context, t transition) {
	c := classes[ClassOf(t.resource)]
	reason, typ := c.unhealthy, kubeapi.EventWarning
	msg := describe(t.resource, t.label, t.reason)
	switch {
	case t.event != nil:
		reason, msg, typ = t.event.reason, t.event.message, kubeapi.EventNormal
		if t.id != "" {
			msg = deviceName(t.resource, t.label) + ": " + msg
		}
		if t.event.warning {
			typ = kubeapi.EventWarning
		}
	case t.healthy:
		reason, typ = c.recovered, kubeapi.EventNormal
		msg = deviceName(t.resource, t.label) + " is healthy again"
		if t.oldReason != "" {
			msg += " (was: " + health.Describe(t.oldReason) + ")"
		}
	}
	msg = truncate(msg, maxMessage)
	targets := []evKey{{kind: "Node", name: r.o.Node}}
	uids := map[evKey]string{}
	if r.o.Holders != nil && t.id != "" {
		pods, err := r.o.Holders.HoldersOf(ctx, t.resource, t.id)
		if err != nil {
			r.warn("holders", "cannot tell which pods hold the device; its Event goes to the Node only", "resource", t.resource, "device", t.id, "err", err)
		}
		for _, p := range pods {
			k := evKey{kind: "Pod", namespace: p.Namespace, name: p.Name}
			if _, seen := uids[k]; !seen {
				targets = append(targets, k)
			}
			if uids[k] == "" {
				uids[k] = p.UID
			}
		}
	}
	for _, k := range targets {
		uid := uids[k]
		k.reason, k.message = reason, msg
		rec := r.records[k]
		if rec != nil && t.at.Sub(rec.last) < aggregateWindow {
			rec.count++
			rec.last = t.at
			if rec.uid == "" {
				rec.uid = uid
			}
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
		r.records[k] = &record{key: k, typ: typ, seq: r.seq, uid: uid, count: 1, first: t.at, last: t.at}
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
// oldest first, then count updates. Nothing is sent while the sender is
// paused after a failure (eventFailed) or the server throttled.
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
	if len(creates)+len(updates) == 0 {
		return next
	}
	if pause := laterOf(r.evPause, r.hold); now.Before(pause) {
		return earliest(next, pause)
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
		if pause := laterOf(r.evPause, r.hold); now.Before(pause) {
			// One failure stops the round: the rest would fail alike.
			return earliest(next, pause)
		}
	}
	return next
}

// eventFailed pauses every Event write for the backoff policy's wait
// after a failed Event request (at least the server's Retry-After); a
// throttle holds the Node condition too. It says whether the server
// throttled: the request was then not processed, and is sent again once
// the wait is over instead of being dropped.
func (r *Reporter) eventFailed(ctx context.Context, what string, err error, now time.Time, args ...any) bool {
	wait, class := r.evBackoff.Fail(err)
	r.evPause = now.Add(wait)
	if class == kubeapi.Throttled {
		r.hold = laterOf(r.hold, r.evPause)
	}
	r.warnErr(ctx, "event", what+"; pausing Events", err, append(args, "class", class.String(), "pause", wait.String())...)
	return class == kubeapi.Throttled
}

// send creates rec's Event, or updates its count. A failure pauses the
// sender (eventFailed); the write is dropped, the next occurrence trying
// again, unless the server throttled it.
func (r *Reporter) send(ctx context.Context, rec *record, now time.Time) {
	k := rec.key
	ns := k.namespace
	if k.kind == "Node" {
		// Events about cluster-scoped objects live in "default".
		ns = "default"
	}
	retry := false
	defer func() {
		if !retry {
			rec.sent, rec.lastSent = rec.count, now
		}
	}()
	about := []any{"object", k.kind + "/" + k.name, "namespace", k.namespace, "reason", k.reason}
	if rec.apiName != "" {
		err := r.api.PatchEvent(ctx, ns, rec.apiName, rec.count, kubeapi.NewTime(rec.last))
		if err == nil {
			r.evBackoff.Reset()
			r.log.Debug("updated Event count", "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason, "count", rec.count)
			return
		}
		if !kubeapi.IsNotFound(err) {
			retry = ctx.Err() == nil && r.eventFailed(ctx, "updating a Kubernetes Event", err, now, about...)
			return
		}
		// The API server let it expire (an hour, by default): a new one.
		rec.apiName = ""
	}
	ref := kubeapi.ObjectReference{Kind: k.kind, Namespace: k.namespace, Name: k.name, APIVersion: "v1"}
	switch k.kind {
	case "Node":
		uid, err := r.nodeUIDFor(ctx)
		if err != nil && kubeapi.Classify(err) == kubeapi.Throttled {
			retry = r.eventFailed(ctx, "reading the Node's UID", err, now, "node", r.o.Node)
			return
		}
		ref.UID = uid
	case "Pod":
		if rec.uid == "" && !r.noPodUIDLogged {
			// Still found by kubectl get events --field-selector
			// involvedObject.name=POD, though not by kubectl describe pod.
			r.noPodUIDLogged = true
			r.log.Info("an Event about a pod goes without the pod's UID: the node could not tell it, and the plugin may not read pods; logged once",
				"pod", k.namespace+"/"+k.name, "reason", k.reason)
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
		retry = ctx.Err() == nil && r.eventFailed(ctx, "creating a Kubernetes Event", err, now, about...)
		return
	}
	r.evBackoff.Reset()
	rec.apiName = name
	r.log.Debug("created Event", "object", k.kind+"/"+k.name, "namespace", k.namespace, "reason", k.reason, "message", k.message)
}

// nodeUIDFor is the Node's UID, read once. Until it can be read, the
// node's name stands in: the kubelet's own Node Events use it, and
// kubectl describe node finds Events by either. The error is the read's.
func (r *Reporter) nodeUIDFor(ctx context.Context) (string, error) {
	if r.nodeUID == "" {
		n, err := r.api.GetNode(ctx, r.o.Node)
		if err != nil {
			if kubeapi.Classify(err) != kubeapi.Throttled {
				r.warnErr(ctx, "node", "reading the Node's UID", err, "node", r.o.Node)
			}
			return r.o.Node, err
		}
		r.nodeUID = n.Metadata.UID
	}
	return r.nodeUID, nil
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

package report

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
)

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

// SetRemark ends class c's condition message with message (empty clears
// it), leaving its status and reason alone: a fact about the node that no
// device's health shows and that is no fault of theirs, such as the
// container runtime opening every GPU to NVIDIA_VISIBLE_DEVICES.
func (r *Reporter) SetRemark(c Class, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.remarks[c] == message {
		return
	}
	r.remarks[c] = message
	r.dirty[c] = true
	r.signal()
}

// SetReboot says class c's devices need the node rebooted, and why (empty
// clears it): the condition is then False with reason
// ReasonNodeRebootRequired, whatever the devices' health, and its message
// starts with why.
func (r *Reporter) SetReboot(c Class, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reboots[c] == why {
		return
	}
	r.reboots[c] = why
	r.dirty[c] = true
	r.signal()
}

// condState is what the Node was last told of one condition.
type condState struct {
	read    bool // the Node's own copy was read, for its transition time
	sent    bool // a PATCH succeeded
	status  string
	since   time.Time
	last    kubeapi.NodeCondition // as last sent, without times
	sentAt  time.Time
	retryAt time.Time
	backoff backoff.Backoff
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
		at := laterOf(cs.retryAt, r.hold)
		if cs.sent {
			// A device flapping is not a PATCH per flap.
			at = laterOf(at, cs.sentAt.Add(conditionInterval))
		}
		if now.Before(at) {
			next = earliest(next, at)
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
			case kubeapi.Classify(err) == kubeapi.Throttled:
				next = earliest(next, r.conditionFailed(ctx, cs, typ, err, now))
				continue
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
		if cs.sent && cond == cs.last {
			// Changes that cancel out (a device down and back up between
			// two sends) are no write.
			continue
		}
		since := cs.since
		if cond.Status != cs.status || since.IsZero() {
			since = now
		}
		cond.LastHeartbeatTime, cond.LastTransitionTime = kubeapi.NewTime(now), kubeapi.NewTime(since)
		if err := r.api.PatchNodeCondition(ctx, r.o.Node, cond); err != nil {
			r.mu.Lock()
			r.dirty[c] = true
			r.mu.Unlock()
			next = earliest(next, r.conditionFailed(ctx, cs, typ, err, now))
			continue
		}
		if cond.Status != cs.status || !cs.sent {
			r.log.Info("Node condition set", "node", r.o.Node, "condition", typ, "status", cond.Status, "reason", cond.Reason, "message", cond.Message)
		}
		cond.LastHeartbeatTime, cond.LastTransitionTime = kubeapi.Time{}, kubeapi.Time{}
		cs.sent, cs.status, cs.since, cs.last, cs.sentAt, cs.retryAt = true, cond.Status, since, cond, now, time.Time{}
		cs.backoff.Reset()
	}
	return next
}

// conditionFailed schedules the retry of a condition's failed request by
// the backoff policy, holds every write when the server throttled, and
// says when to retry.
func (r *Reporter) conditionFailed(ctx context.Context, cs *condState, typ string, err error, now time.Time) time.Time {
	wait, class := cs.backoff.Fail(err)
	cs.retryAt = now.Add(wait)
	if class == kubeapi.Throttled {
		r.hold = laterOf(r.hold, cs.retryAt)
	}
	r.warnErr(ctx, "condition", "setting the Node condition; retrying", err, "node", r.o.Node, "condition", typ, "class", class.String(), "retryIn", wait.String())
	return cs.retryAt
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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
	note, remark := r.notices[c], r.remarks[c]
	withNote := func(msg string) string {
		if note.reason != "" {
			msg += "; " + note.message
		}
		if remark != "" {
			msg += "; " + remark
		}
		return msg
	}
	if why := r.reboots[c]; why != "" {
		msg := "the node needs a reboot: " + why
		if len(bads) > 0 {
			slices.SortFunc(bads, func(a, b bad) int { return cmp.Or(cmp.Compare(a.label, b.label), cmp.Compare(a.resource, b.resource)) })
			items := make([]string, len(bads))
			for i, b := range bads {
				items[i] = describe(b.resource, b.label, b.reason)
			}
			msg += "; " + joinLimited(items, maxMessage-len(msg)-2)
		}
		return kubeapi.NodeCondition{Type: info.condType, Status: kubeapi.ConditionFalse, Reason: ReasonNodeRebootRequired, Message: truncate(withNote(msg), maxMessage)}
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
	if remark != "" {
		limit -= len(remark) + 2
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

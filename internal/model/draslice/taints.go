package draslice

import (
	"slices"
	"strings"
	"time"
)

// EffectNoSchedule keeps new claims off a device and leaves running ones.
const EffectNoSchedule = "NoSchedule"

// EffectNoExecute also evicts the pods whose claims allocate the device
// (Kubernetes' device-taint eviction), unless they tolerate it.
const EffectNoExecute = "NoExecute"

// RemediationPrefix starts the health reason of a GPU its remediation
// withholds ("remediation: draining: xid=48: ..."): one taint,
// <domain>/remediation, valued with its state.
const RemediationPrefix = "remediation: "

// Evicting returns ts with the NoExecute effect.
func Evicting(ts []Taint) []Taint {
	out := slices.Clone(ts)
	for i := range out {
		out[i].Effect = EffectNoExecute
	}
	return out
}

// Taint is a device taint. TimeAdded is when its condition was first seen;
// nil where nobody watched (list).
type Taint struct {
	Key       string     `json:"key"`
	Value     string     `json:"value,omitempty"`
	Effect    string     `json:"effect"`
	TimeAdded *time.Time `json:"timeAdded,omitempty"`
}

// A health reason ("xid=79, thermal=95C>=slowdown 90C",
// "RDMA port down: mlx5_1/1") into taints: each condition "name=value" or
// "name: detail" becomes <domain>/name (lower case) with the value or
// detail made a label value; "name" alone a taint without value; a name
// joined with "+" (hw-slowdown+hw-power-brake) one taint per part.
// TaintsOf turns a health reason into NoSchedule taints, without times.
func TaintsOf(domain, reason string) []Taint {
	if rest, ok := strings.CutPrefix(reason, RemediationPrefix); ok {
		// Its own why is free text with commas: one taint says it all.
		state, _, _ := strings.Cut(rest, ":")
		return []Taint{{Key: domain + "/remediation", Value: labelish(state), Effect: EffectNoSchedule}}
	}
	var out []Taint
	seen := map[string]bool{}
	for _, cond := range strings.Split(reason, ", ") {
		cond = strings.TrimSpace(cond)
		if cond == "" {
			continue
		}
		name, value, ok := strings.Cut(cond, "=")
		if !ok {
			name, value, _ = strings.Cut(cond, ":")
		}
		for _, part := range strings.Split(name, "+") {
			k := strings.ToLower(labelish(part))
			if k == "" || seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, Taint{Key: domain + "/" + k, Value: labelish(value), Effect: EffectNoSchedule})
		}
	}
	// The API refuses a device with more taints, and with it the node's
	// whole slice: the first conditions the reason names are kept.
	if len(out) > TaintsMax {
		out = out[:TaintsMax]
	}
	return out
}

// TaintsMax is the most taints the resource.k8s.io API takes on one
// device.
const TaintsMax = 16

// labelish makes s a label value: runs of other characters become "-",
// it starts and ends alphanumeric and is at most 63 long.
func labelish(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			if !dash {
				b.WriteByte('-')
			}
			dash = true
			continue
		}
		b.WriteRune(r)
		dash = false
	}
	out := b.String()
	if len(out) > labelValueMax {
		out = out[:labelValueMax]
	}
	return strings.TrimFunc(out, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// labelValueMax is the longest label value Kubernetes takes.
const labelValueMax = 63

// Stamp gives each of ts the TimeAdded of the same taint in old, so
// republishing an unchanged slice writes the same bytes, or now (whole
// seconds, as the API server keeps it) when it is new.
func Stamp(ts, old []Taint, now time.Time) []Taint {
	if len(ts) == 0 {
		return nil
	}
	out := make([]Taint, 0, len(ts))
	for _, t := range ts {
		i := slices.IndexFunc(old, func(o Taint) bool { return o.Key == t.Key && o.Value == t.Value && o.TimeAdded != nil })
		if i >= 0 {
			t.TimeAdded = old[i].TimeAdded
		} else {
			at := now.Truncate(time.Second)
			t.TimeAdded = &at
		}
		out = append(out, t)
	}
	return out
}

// Backdate gives each of ts the TimeAdded of the same taint (key and
// value) in seeds where that is earlier: seeds are the taints a previous
// process published, so a condition that outlived a restart keeps the
// time it was first seen, and the restart rewrites no slice. A seed for
// another condition, or without a time, changes nothing.
func Backdate(ts, seeds []Taint) []Taint {
	out := slices.Clone(ts)
	for i, t := range out {
		for _, s := range seeds {
			if s.Key != t.Key || s.Value != t.Value || s.TimeAdded == nil {
				continue
			}
			if t.TimeAdded == nil || s.TimeAdded.Before(*out[i].TimeAdded) {
				at := *s.TimeAdded
				out[i].TimeAdded = &at
			}
		}
	}
	return out
}

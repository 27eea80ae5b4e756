package dra

import (
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// taint is one health condition as a device taint: key (under the
// driver's domain) and value.
type taint struct{ key, value string }

// taintsOf turns a health reason ("xid=79, thermal=95C>=slowdown 90C",
// "RDMA port down: mlx5_1/1") into taints: each condition "name=value" or
// "name: detail" becomes <domain>/name (lower case) with the value or
// detail made a label value; "name" alone a taint without value; a name
// joined with "+" (hw-slowdown+hw-power-brake) one taint per part.
func taintsOf(domain, reason string) []taint {
	var out []taint
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
			out = append(out, taint{key: domain + "/" + k, value: labelish(value)})
		}
	}
	return out
}

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
	if len(out) > validation.LabelValueMaxLength {
		out = out[:validation.LabelValueMaxLength]
	}
	return strings.TrimFunc(out, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// nextTaints are the NoSchedule taints for conditions ts, keeping the
// TimeAdded of a taint that was already there with the same value, so
// republishing an unchanged slice writes the same bytes; a new taint is
// stamped now (seconds, as the API server keeps it).
func nextTaints(ts []taint, old []resourceapi.DeviceTaint, now time.Time) []resourceapi.DeviceTaint {
	if len(ts) == 0 {
		return nil
	}
	out := make([]resourceapi.DeviceTaint, 0, len(ts))
	for _, t := range ts {
		i := slices.IndexFunc(old, func(o resourceapi.DeviceTaint) bool { return o.Key == t.key && o.Value == t.value })
		if i >= 0 {
			out = append(out, old[i])
			continue
		}
		out = append(out, resourceapi.DeviceTaint{
			Key: t.key, Value: t.value, Effect: resourceapi.DeviceTaintEffectNoSchedule,
			TimeAdded: &metav1.Time{Time: now.Truncate(time.Second)},
		})
	}
	return out
}

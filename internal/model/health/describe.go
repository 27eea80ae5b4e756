package health

import (
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

// Describe spells out a reason for people: each XID gets its name in
// NVIDIA's XID catalog (package xid) ("xid=79: fallen off the bus"); other conditions already say
// what they are. Conditions stay separated by ", " as in the reason.
func Describe(reason string) string {
	if reason == "" {
		return ""
	}
	parts := strings.Split(reason, ", ")
	for i, p := range parts {
		if n, ok := strings.CutPrefix(p, "xid="); ok {
			if x, err := strconv.ParseUint(n, 10, 64); err == nil {
				if d := xid.Name(x); d != "" {
					parts[i] = p + ": " + d
				}
			}
		}
	}
	return strings.Join(parts, ", ")
}

package health

import (
	"strconv"
	"strings"
)

// Describe spells out a reason for people: each XID gets NVIDIA's name
// for it ("xid=79: fallen off the bus"); other conditions already say
// what they are. Conditions stay separated by ", " as in the reason.
func Describe(reason string) string {
	if reason == "" {
		return ""
	}
	parts := strings.Split(reason, ", ")
	for i, p := range parts {
		if n, ok := strings.CutPrefix(p, "xid="); ok {
			if x, err := strconv.ParseUint(n, 10, 64); err == nil {
				if d := xidName(x); d != "" {
					parts[i] = p + ": " + d
				}
			}
		}
	}
	return strings.Join(parts, ", ")
}

// xidName is the short name of the XIDs that matter to a node agent
// (NVIDIA's XID catalogue); others get none rather than a guess.
func xidName(x uint64) string {
	switch x {
	case 13:
		return "graphics engine exception"
	case 31:
		return "GPU memory page fault"
	case 43:
		return "GPU stopped processing"
	case 45:
		return "preemptive cleanup"
	case 48:
		return "double-bit ECC error"
	case 61, 62:
		return "internal micro-controller error"
	case 63:
		return "ECC page retirement or row remapping recorded"
	case 64:
		return "ECC page retirement or row remapping failed"
	case 74:
		return "NVLink error"
	case 79:
		return "fallen off the bus"
	case 92:
		return "high single-bit ECC error rate"
	case 94:
		return "contained ECC error"
	case 95:
		return "uncontained ECC error"
	case 109:
		return "context switch timeout"
	case 119, 120:
		return "GSP error"
	case 140:
		return "unrecovered ECC error"
	}
	return ""
}

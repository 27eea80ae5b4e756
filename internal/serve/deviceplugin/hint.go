package deviceplugin

import (
	"fmt"
	"log/slog"
	"slices"

	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// maxLoggedIDs bounds each list of ignored IDs in a log line: a request
// may carry thousands.
const maxLoggedIDs = 8

// hint is one container's preferred-allocation request, cleaned: known
// IDs only, each once, must-include ones among the available ones, and a
// size between the two counts.
type hint struct {
	available, must []string
	size            int
	asked           int32
	// byID is the snapshot's index; inAvail and inMust mark devices by it
	// (a bitmap beats a map per request: requests name every device).
	byID            map[string]int
	inAvail, inMust []bool

	unknown, repeated, unavailable []string
}

func (s *snapshot) hint(req *api.ContainerPreferredAllocationRequest) hint {
	h := hint{asked: req.AllocationSize, byID: s.byID}
	marks := make([]bool, 2*len(s.devices))
	h.inAvail, h.inMust = marks[:len(s.devices)], marks[len(s.devices):]
	h.available = make([]string, 0, len(req.AvailableDeviceIDs))
	for _, id := range req.AvailableDeviceIDs {
		i, known := s.byID[id]
		switch {
		case !known:
			h.unknown = append(h.unknown, id)
		case h.inAvail[i]:
			h.repeated = append(h.repeated, id)
		default:
			h.inAvail[i] = true
			h.available = append(h.available, id)
		}
	}
	for _, id := range req.MustIncludeDeviceIDs {
		i, known := s.byID[id]
		switch {
		case !known:
			h.unknown = append(h.unknown, id)
		case h.inMust[i]:
			h.repeated = append(h.repeated, id)
		case !h.inAvail[i]:
			h.unavailable = append(h.unavailable, id)
		default:
			h.inMust[i] = true
			h.must = append(h.must, id)
		}
	}
	h.size = min(max(int(req.AllocationSize), len(h.must)), len(h.available))
	return h
}

func (s *snapshot) has(id string) bool {
	_, ok := s.byID[id]
	return ok
}

// check reports whether ids answers h: size distinct available IDs with
// every must-include one among them.
func (h hint) check(ids []string) error {
	if len(ids) != h.size {
		return fmt.Errorf("%d devices chosen, want %d", len(ids), h.size)
	}
	seen := make([]bool, len(h.inAvail))
	for _, id := range ids {
		i, ok := h.byID[id]
		if !ok || !h.inAvail[i] {
			return fmt.Errorf("device %q chosen but not available", id)
		}
		if seen[i] {
			return fmt.Errorf("device %q chosen twice", id)
		}
		seen[i] = true
	}
	for _, id := range h.must {
		if !seen[h.byID[id]] {
			return fmt.Errorf("must-include device %q not chosen", id)
		}
	}
	return nil
}

// fallback is the must-include devices topped up with the first available
// ones: a valid answer when the backend has none.
func (h hint) fallback() []string {
	out := slices.Clone(h.must)
	chosen := make(map[string]struct{}, h.size)
	for _, id := range h.must {
		chosen[id] = struct{}{}
	}
	for _, id := range h.available {
		if len(out) >= h.size {
			break
		}
		if _, ok := chosen[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

func (h hint) ignored() bool {
	return len(h.unknown)+len(h.repeated)+len(h.unavailable) > 0 || int(h.asked) != h.size
}

// attrs describes what was ignored, for the log.
func (h hint) attrs(container int) []any {
	a := []any{"container", container}
	add := func(key string, ids []string) {
		if len(ids) == 0 {
			return
		}
		shown := ids[:min(len(ids), maxLoggedIDs)]
		a = append(a, slog.Group(key, "count", len(ids), "ids", shown))
	}
	add("unknown", h.unknown)
	add("repeated", h.repeated)
	add("mustIncludeNotAvailable", h.unavailable)
	if int(h.asked) != h.size {
		a = append(a, "askedSize", h.asked, "size", h.size)
	}
	return a
}

// Package gcpercent sets the Go collector's target of the long-running
// processes, gpu-device-plugin-dp (or serve in its own process) and
// gpu-device-plugin-dra, when the environment leaves GOGC unset. The
// one-shot commands keep Go's default: they exit before a collection
// matters.
package gcpercent

import (
	"runtime/debug"
	"strconv"
)

// Serve is the target when GOGC is not set: half Go's default. Both
// processes keep a small live heap (about 1 MiB in device-plugin mode, 3
// to 4 MiB in DRA mode), so the heap's resident size is set by the goal
// GOGC puts above it; at 50 that goal is half as far above, with request
// latency unchanged (docs/architecture.md, "Where the memory goes").
const Serve = 50

// Tune sets Serve unless the environment's GOGC, which the Go runtime
// has already applied, says otherwise. It returns the GOGC in effect, for
// the start line.
func Tune(lookupEnv func(string) (string, bool)) string {
	if v, ok := lookupEnv("GOGC"); ok && v != "" {
		return v
	}
	debug.SetGCPercent(Serve)
	return strconv.Itoa(Serve)
}

package main

import (
	"runtime/debug"
	"strconv"
)

// serveGCPercent is the collector's target for serve in device-plugin mode
// when GOGC is not set: half Go's default. The live heap after start-up is
// about 1 MiB, so Go's 4 MiB minimum heap goal is what sets the heap's
// resident size; at 50 the goal is 2 MiB and the process is about 2 MiB
// smaller after idling, with Allocate's latency unchanged
// (docs/architecture.md, "Where the memory goes").
const serveGCPercent = 50

// tuneGC sets serveGCPercent unless the environment's GOGC, which the Go
// runtime has already applied, says otherwise. It returns the GOGC in
// effect, for the start line.
func tuneGC(lookupEnv func(string) (string, bool)) string {
	if v, ok := lookupEnv("GOGC"); ok && v != "" {
		return v
	}
	debug.SetGCPercent(serveGCPercent)
	return strconv.Itoa(serveGCPercent)
}

package sharing

// The time-slice intervals a DRA claim's GPUConfig may ask for: how long
// each process runs before the GPU switches to the next. Not replicas: in
// DRA mode a claim holds a device, and its interval is set on the GPU.
const (
	IntervalDefault = "Default"
	IntervalShort   = "Short"
	IntervalMedium  = "Medium"
	IntervalLong    = "Long"
)

// intervalLevels are nvidia-smi compute-policy's levels for the intervals.
var intervalLevels = map[string]int{IntervalDefault: 0, IntervalShort: 1, IntervalMedium: 2, IntervalLong: 3}

// IntervalNames lists the intervals, shortest last as the docs do.
const IntervalNames = "Default, Short, Medium or Long"

// IntervalLevel is nvidia-smi compute-policy's level for interval; false
// when interval is not one.
func IntervalLevel(interval string) (level int, ok bool) {
	level, ok = intervalLevels[interval]
	return level, ok
}

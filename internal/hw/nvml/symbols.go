package nvml

import (
	"context"
	"log/slog"
	"strings"
)

// MinimumDriver is the oldest driver branch the plugin supports: every NVML
// function it calls unguarded is in R470, and every newer one is in
// optionalSymbols, checked once at start.
const MinimumDriver = "R470"

// Optional NVML functions: newer than MinimumDriver, or deprecated and due
// to go. go-nvml binds symbols lazily, so calling one the loaded
// libnvidia-ml.so.1 lacks kills the process ("symbol lookup error", exit
// 127); each is called only when Symbols says the library exports it.
const (
	symClocksEventReasons    = "nvmlDeviceGetCurrentClocksEventReasons"    // R535+
	symClocksThrottleReasons = "nvmlDeviceGetCurrentClocksThrottleReasons" // old name, deprecated in R535
	symTemperatureV          = "nvmlDeviceGetTemperatureV"                 // R565+
	symTemperature           = "nvmlDeviceGetTemperature"                  // deprecated in NVML 13
	symNumaNodeID            = "nvmlDeviceGetNumaNodeId"                   // R535+
	symMigMode               = "nvmlDeviceGetMigMode"                      // R450+
	symRemappedRows          = "nvmlDeviceGetRemappedRows"                 // R460+
	symFieldValues           = "nvmlDeviceGetFieldValues"                  // R410+; the recovery-action field is R550+
	symArchitecture          = "nvmlDeviceGetArchitecture"                 // R460+
	symVirtualizationMode    = "nvmlDeviceGetVirtualizationMode"           // in R470; optional for libraries that lack it

	// Listing MIG devices (R450+, with attributes v2). Without every one
	// of them a GPU's MIG mode is still read, but its MIG devices are not
	// listed, as if the driver had no MIG support beyond the mode.
	symMaxMigDeviceCount = "nvmlDeviceGetMaxMigDeviceCount"
	symMigDeviceHandle   = "nvmlDeviceGetMigDeviceHandleByIndex"
	symGpuInstanceID     = "nvmlDeviceGetGpuInstanceId"
	symComputeInstanceID = "nvmlDeviceGetComputeInstanceId"
	symAttributes        = "nvmlDeviceGetAttributes_v2"
	symGpuInstanceByID   = "nvmlDeviceGetGpuInstanceById"
	symGpuInstanceInfo   = "nvmlGpuInstanceGetInfo"
	symGIProfileInfo     = "nvmlDeviceGetGpuInstanceProfileInfo"
	// The versioned profile info (R510+) is preferred where exported.
	symGIProfileInfoV = "nvmlDeviceGetGpuInstanceProfileInfoV"
)

// migListingSymbols are the functions listing MIG devices needs.
func migListingSymbols() []string {
	return []string{
		symMaxMigDeviceCount, symMigDeviceHandle, symGpuInstanceID, symComputeInstanceID,
		symAttributes, symGpuInstanceByID, symGpuInstanceInfo, symGIProfileInfo,
	}
}

// optionalSymbols are checked at start, in this order.
func optionalSymbols() []string {
	return append([]string{
		symClocksEventReasons, symClocksThrottleReasons, symTemperatureV, symTemperature,
		symNumaNodeID, symMigMode, symRemappedRows, symFieldValues, symArchitecture, symGIProfileInfoV,
		symFabricInfoV, symFabricInfo, symVirtualizationMode,
	}, migListingSymbols()...)
}

// Symbols says which optional NVML functions the loaded library exports.
// The zero value has none: only the R470 baseline is called.
type Symbols struct {
	has map[string]bool
}

// Has reports whether the library exports the NVML function name.
func (s Symbols) Has(name string) bool { return s.has[name] }

// CheckSymbols looks up every optional NVML function once. A library that
// cannot say (Extensions returns nil) is taken to have none of them.
func CheckSymbols(lib Library) Symbols {
	s := Symbols{has: map[string]bool{}}
	ext := lib.Extensions()
	if ext == nil {
		return s
	}
	for _, name := range append(optionalSymbols(), resetSymbols()...) {
		s.has[name] = ext.LookupSymbol(name) == nil
	}
	return s
}

// hasMIGListing reports whether the library can list MIG devices.
func (s Symbols) hasMIGListing() bool {
	for _, name := range migListingSymbols() {
		if !s.Has(name) {
			return false
		}
	}
	return true
}

// log says, in one line, which fallbacks the library needs and which
// checks it turns off; a current driver logs nothing.
func (s Symbols) log(log *slog.Logger) {
	var missing, fallbacks, off []string
	for _, name := range optionalSymbols() {
		if !s.Has(name) {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return
	}
	switch {
	case s.Has(symClocksEventReasons):
	case s.Has(symClocksThrottleReasons):
		fallbacks = append(fallbacks, "clock reasons through "+symClocksThrottleReasons)
	default:
		off = append(off, "hw-slowdown", "power-brake")
	}
	switch {
	case s.Has(symTemperatureV):
	case s.Has(symTemperature):
		fallbacks = append(fallbacks, "temperature through "+symTemperature)
	default:
		off = append(off, "thermal")
	}
	if !s.Has(symNumaNodeID) {
		fallbacks = append(fallbacks, "NUMA node from sysfs only")
	}
	if !s.Has(symMigMode) {
		fallbacks = append(fallbacks, "MIG mode not read (the driver predates MIG)")
	} else if !s.hasMIGListing() {
		fallbacks = append(fallbacks, "MIG devices not listed (a GPU in MIG mode serves nothing)")
	} else if !s.Has(symGIProfileInfoV) {
		fallbacks = append(fallbacks, "GPU instance profiles through "+symGIProfileInfo)
	}
	if !s.Has(symFabricInfoV) && !s.Has(symFabricInfo) {
		fallbacks = append(fallbacks, "no fabric info (the driver predates NVLink domains; no gpu.clique)")
	}
	if !s.Has(symRemappedRows) {
		off = append(off, "remapped-rows")
	}
	if !s.Has(symFieldValues) {
		off = append(off, "recovery-action")
	}
	level := slog.LevelInfo
	if len(off) > 0 {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "NVML library predates some functions; using fallbacks",
		"missing", strings.Join(missing, ","), "fallbacks", strings.Join(fallbacks, "; "), "checksOff", strings.Join(off, ","))
}

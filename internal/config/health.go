package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The health settings' defaults. They equal package policy's (policy's
// TestConfigDefaults pins it): the settings sit below the model and
// import none of it.
const (
	DefaultHealthPollInterval     = 5 * time.Second
	DefaultXIDRecoveryPeriod      = 10 * time.Minute
	DefaultThermalMarginC         = 5
	DefaultHealthRecoveryPolls    = 3
	DefaultHealthSlowdownSamples  = 3
	DefaultHealthNVMLFailurePolls = 3
)

// DefaultXIDIgnore are the XIDs NVIDIA's XID catalog gives nothing to do
// on the GPU: see policy.DefaultIgnoredXIDs and package xid.
func DefaultXIDIgnore() []uint64 {
	return []uint64{8, 11, 13, 14, 25, 31, 32, 37, 38, 39, 40, 41, 43, 44, 45, 60, 63, 66, 67, 68, 69, 70, 71, 72, 75, 76, 77, 80,
		82, 83, 84, 85, 86, 88, 89, 92, 93, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 121,
		126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 137, 139, 141, 154, 157, 160, 161}
}

// DefaultXIDFatal are the XIDs NVIDIA's XID catalog says need a GPU reset
// or a node restart: see policy.DefaultFatalXIDs.
func DefaultXIDFatal() []uint64 {
	return []uint64{46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158}
}

// XIDClasses are the classes an xids entry sets, as package xid names
// them.
func XIDClasses() []string { return []string{"ignore", "transient", "fatal"} }

// XIDOverrides reads the xids setting: each XID and the class its entry
// gives. An entry that does not parse is left out: Validate reports it.
func (c Config) XIDOverrides() map[uint64]string {
	out := map[uint64]string{}
	for _, e := range c.XIDs {
		if x, class, err := parseXIDEntry(e); err == nil {
			out[x] = class
		}
	}
	return out
}

// parseXIDEntry reads one xids entry, "XID=CLASS".
func parseXIDEntry(e string) (uint64, string, error) {
	n, class, ok := strings.Cut(e, "=")
	x, err := strconv.ParseUint(strings.TrimSpace(n), 10, 32)
	if !ok || err != nil {
		return 0, "", fmt.Errorf("%q is not XID=CLASS (example: \"74=ignore\")", e)
	}
	if class = strings.TrimSpace(class); !slices.Contains(XIDClasses(), class) {
		return 0, "", fmt.Errorf("%q: class %q is not one of %s (example: \"%d=ignore\")", e, class, strings.Join(XIDClasses(), ", "), x)
	}
	return x, class, nil
}

// HealthChecks lists the checks healthChecksDisabled can name, as
// policy.Checks does.
func HealthChecks() []string {
	return []string{"thermal", "hw-slowdown", "power-brake", "lost", "recovery-action", "remapped-rows"}
}

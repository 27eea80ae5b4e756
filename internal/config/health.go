package config

import "time"

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

// DefaultXIDIgnore are the XIDs caused by the application, not the GPU:
// see policy.DefaultIgnoredXIDs.
func DefaultXIDIgnore() []uint64 { return []uint64{13, 31, 43, 45, 68, 109} }

// DefaultXIDFatal are the XIDs that mean the hardware needs a reset or
// replacement: see policy.DefaultFatalXIDs.
func DefaultXIDFatal() []uint64 { return []uint64{48, 64, 74, 79, 92, 95, 119, 120} }

// HealthChecks lists the checks healthChecksDisabled can name, as
// policy.Checks does.
func HealthChecks() []string {
	return []string{"thermal", "hw-slowdown", "power-brake", "lost", "recovery-action", "remapped-rows"}
}

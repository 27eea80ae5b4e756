package daemon

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// The translations from the settings to the option values each part of
// the model and the front-ends takes: plain field copies, made once here,
// so that no part below reads the whole configuration.

// HealthPolicy is the health part of the configuration.
func HealthPolicy(c config.Config) policy.Policy {
	return policy.Policy{
		IgnoredXIDs:    c.XIDIgnore,
		FatalXIDs:      c.XIDFatal,
		XIDRecovery:    c.XIDRecoveryPeriod.Duration,
		PollInterval:   c.HealthPollInterval.Duration,
		ThermalMarginC: c.ThermalMarginC,
		RecoveryPolls:  c.HealthRecoveryPolls,

		SlowdownSamples:  c.HealthSlowdownSamples,
		NVMLFailurePolls: c.HealthNVMLFailurePolls,
		Disabled:         c.HealthChecksDisabled,
	}
}

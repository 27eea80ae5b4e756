package policy_test

import (
	"reflect"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

// The settings keep their own copy of the health vocabulary, as they sit
// below the model: it must stay this package's.
func TestConfigDefaults(t *testing.T) {
	if got, want := config.HealthChecks(), policy.Checks(); !reflect.DeepEqual(got, want) {
		t.Errorf("config.HealthChecks() = %v, policy.Checks() = %v", got, want)
	}
	var classes []string
	for _, c := range xid.Classes() {
		classes = append(classes, string(c))
	}
	if got := config.XIDClasses(); !reflect.DeepEqual(got, classes) {
		t.Errorf("config.XIDClasses() = %v, xid.Classes() = %v", got, classes)
	}
	c, p := config.Default(), policy.Default()
	got := policy.Policy{
		IgnoredXIDs:      c.XIDIgnore,
		FatalXIDs:        c.XIDFatal,
		XIDRecovery:      c.XIDRecoveryPeriod.Duration,
		PollInterval:     c.HealthPollInterval.Duration,
		ThermalMarginC:   c.ThermalMarginC,
		RecoveryPolls:    c.HealthRecoveryPolls,
		SlowdownSamples:  c.HealthSlowdownSamples,
		NVMLFailurePolls: c.HealthNVMLFailurePolls,
	}
	if !reflect.DeepEqual(got, p) {
		t.Errorf("config's health defaults = %+v, policy.Default() = %+v", got, p)
	}
}

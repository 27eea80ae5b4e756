package daemon

import (
	"reflect"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// The health settings reach the watcher's policy field by field, and a
// policy built from settings config accepts is one health accepts.
func TestHealthPolicy(t *testing.T) {
	c := config.Default()
	for k, v := range map[string]string{"xidIgnore": "13", "xidFatal": "79,48", "xidRecoveryPeriod": "0s", "healthPollInterval": "2s", "thermalMarginC": "7"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	p := HealthPolicy(c)
	if !reflect.DeepEqual(p.IgnoredXIDs, []uint64{13}) || !reflect.DeepEqual(p.FatalXIDs, []uint64{79, 48}) ||
		p.XIDRecovery != 0 || p.PollInterval != 2*time.Second || p.ThermalMarginC != 7 || p.RecoveryPolls != 3 {
		t.Fatalf("policy = %+v", p)
	}
	c = config.Default()
	for k, v := range map[string]string{"healthChecksDisabled": "power-brake,recovery-action", "healthSlowdownSamples": "5", "healthNVMLFailurePolls": "4"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p = HealthPolicy(c)
	if !reflect.DeepEqual(p.Disabled, []string{"power-brake", "recovery-action"}) || p.SlowdownSamples != 5 || p.NVMLFailurePolls != 4 {
		t.Fatalf("policy = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("health refuses the policy config accepted: %v", err)
	}
}

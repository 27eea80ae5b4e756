package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// The config's remediation defaults are remedy's.
func TestRemediationDefaults(t *testing.T) {
	if got, want := RemediationPolicy(config.Default()), remedy.DefaultPolicy(); got != want {
		t.Fatalf("the config's defaults make %+v, remedy's are %+v", got, want)
	}
}

// Each of remedy's policy mistakes is one line naming its key and where
// it came from.
func TestRemediationPolicyValidation(t *testing.T) {
	from := func(key string) string {
		if key == "remediation.maxResets" {
			return "in f.yaml"
		}
		return ""
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Remediation)
		want string
	}{
		{"gracePeriod", func(r *config.Remediation) { r.GracePeriod = config.Duration{Duration: -time.Second} },
			"config: remediation.gracePeriod (--remediation-grace-period): -1s must not be negative (0s evicts at once)"},
		{"maxResets", func(r *config.Remediation) { r.MaxResets = 0 },
			"config: remediation.maxResets (in f.yaml): 0 must be at least 1 (to turn resets off, set reset to false)"},
		{"window", func(r *config.Remediation) { r.Window = config.Duration{} },
			"config: remediation.window (--remediation-window): 0s must be positive (example: 24h)"},
		{"resetPeers", func(r *config.Remediation) { r.Reset, r.ResetPeers = false, true },
			"config: remediation.resetPeers (--remediation-reset-peers): true has no effect while reset is false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			tc.edit(&c.Remediation)
			err := ValidateConfig(c, from)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
	if err := ValidateConfig(config.Default(), nil); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	c := config.Default()
	c.Remediation.MaxResets, c.Remediation.Window = 0, config.Duration{}
	if err := ValidateConfig(c, nil); err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("two mistakes, want two lines: %v", err)
	}
}

package config

import (
	"fmt"
	"time"
)

// Remediation is the remediation section: what the plugin may do, on
// its own, to heal a faulted GPU (docs/health.md#gpus-that-heal-themselves).
// Each key is a setting of its own (remediation.reset, --remediation-reset).
type Remediation struct {
	// Enabled turns the remediation on (the default: what it does on its
	// own touches only idle GPUs; eviction is a key of its own, off). Off,
	// the plugin behaves as before it existed: health alone decides, and
	// no GPU is withheld or reset.
	Enabled bool `json:"enabled"`
	// Reset allows resetting a withheld GPU once nothing runs on it.
	Reset bool `json:"reset"`
	// Evict allows evicting the pods holding a withheld GPU after
	// GracePeriod: DRA mode only, through the device taint's NoExecute
	// effect.
	Evict       bool     `json:"evict"`
	GracePeriod Duration `json:"gracePeriod"`
	// MaxResets in Window: a GPU that needs one more is out for a human.
	MaxResets int      `json:"maxResets"`
	Window    Duration `json:"window"`
	// ResetPeers allows resetting a GPU's NVLink peers with it where the
	// driver resets them only together.
	ResetPeers bool `json:"resetPeers"`
	// Cordon cordons the node while a GPU needs a reboot, and lifts only
	// that cordon.
	Cordon bool `json:"cordon"`
	// UsagePoll is how often the holders and processes of a withheld GPU
	// are looked at.
	UsagePoll Duration `json:"usagePoll"`
}

// The remediation defaults. They equal package remedy's DefaultPolicy
// (daemon's TestRemediationDefaults pins it): the settings sit below the
// model and import none of it.
const (
	DefaultRemediationGracePeriod = 10 * time.Minute
	DefaultRemediationMaxResets   = 3
	DefaultRemediationWindow      = 24 * time.Hour
	DefaultRemediationUsagePoll   = 5 * time.Second
)

// remediationSettings are the remediation section's keys.
func remediationSettings() []Setting {
	r := func(c *Config) *Remediation { return &c.Remediation }
	return []Setting{
		{Key: "remediation.enabled", Category: CategoryRemediation, Flag: "remediation-enabled", Default: "true",
			Usage: "heal faulted GPUs one at a time: withhold the GPU, wait until nothing uses it, reset it, probe it and give it back, as the keys below allow; needs stateDir. It evicts nothing unless remediation.evict is on. false: health alone decides, as before remediation existed",
			set:   boolean(func(c *Config) *bool { return &r(c).Enabled })},
		{Key: "remediation.reset", Category: CategoryRemediation, Flag: "remediation-reset", Default: "true",
			Usage: "reset a GPU whose fault calls for it (the driver's recovery action, a row remap pending, an XID that NVIDIA's XID catalog resets, such as 48, 74, 94, 95, 109, 119 or 120: docs/health.md) once no pod and no process uses it, probe it and give it back; with remediation.enabled. false: such a GPU is only shown (list, Events), health keeps it out as before",
			set:   boolean(func(c *Config) *bool { return &r(c).Reset })},
		{Key: "remediation.evict", Category: CategoryRemediation, Flag: "remediation-evict", Default: "false",
			Usage: "DRA mode only: after remediation.gracePeriod, evict the pods whose claims hold a withheld GPU, by making its device taint NoExecute (Kubernetes' device-taint eviction, which honours tolerations); false: the GPU waits for its pods to end",
			set:   boolean(func(c *Config) *bool { return &r(c).Evict })},
		{Key: "remediation.gracePeriod", Category: CategoryRemediation, Flag: "remediation-grace-period", Default: DefaultRemediationGracePeriod.String(),
			Usage: "how long the pods holding a withheld GPU are left alone before remediation.evict evicts them; 0s evicts at once",
			set:   duration(func(c *Config) *Duration { return &r(c).GracePeriod }, "10m")},
		{Key: "remediation.maxResets", Category: CategoryRemediation, Flag: "remediation-max-resets", Default: fmt.Sprint(DefaultRemediationMaxResets),
			Usage: "the most resets one GPU's faults may cause in remediation.window; a GPU that needs one more stays out for a human",
			set:   number(func(c *Config) *int { return &r(c).MaxResets })},
		{Key: "remediation.window", Category: CategoryRemediation, Flag: "remediation-window", Default: "24h0m0s",
			Usage: "the window remediation.maxResets counts resets in",
			set:   duration(func(c *Config) *Duration { return &r(c).Window }, "24h")},
		{Key: "remediation.resetPeers", Category: CategoryRemediation, Flag: "remediation-reset-peers", Default: "false",
			Usage: "also drain and reset a GPU's NVLink peers where the driver resets them only together (before Ampere; Ampere on NVSwitch without Fabric Manager); false: such a GPU stays out for a human",
			set:   boolean(func(c *Config) *bool { return &r(c).ResetPeers })},
		{Key: "remediation.cordon", Category: CategoryRemediation, Flag: "remediation-cordon", Default: "false",
			Usage: "while a GPU needs a node reboot, cordon the node (spec.unschedulable, marked with the annotation gpu-device-plugin.github.io/cordoned), unless it is cordoned already; once no GPU needs one (after the reboot, or a human's release), lift that cordon, and never anyone else's. Needs API access: nodes get and patch (the chart's remediation.cordon value)",
			set:   boolean(func(c *Config) *bool { return &r(c).Cordon })},
		{Key: "remediation.usagePoll", Category: CategoryRemediation, Flag: "remediation-usage-poll", Default: DefaultRemediationUsagePoll.String(),
			Usage: "how often the pods (PodResources API), processes and MPS daemon of a withheld GPU are looked at",
			set:   duration(func(c *Config) *Duration { return &r(c).UsagePoll }, "5s")},
	}
}

// validateRemediation checks what remedy's own Policy.Validate cannot:
// what depends on the rest of the configuration. field names a key with
// where its value came from.
func validateRemediation(c Config, field func(string) string) []error {
	var errs []error
	r := c.Remediation
	if r.Evict && c.KubeletAPI != KubeletAPIDRA {
		errs = append(errs, fmt.Errorf("config: %s: true needs kubeletAPI %s: eviction is DRA-only, through the device taint's NoExecute effect; in device-plugin mode set it to false (a withheld GPU then waits for its pods to end)", field("remediation.evict"), KubeletAPIDRA))
	}
	if r.UsagePoll.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 100ms", field("remediation.usagePoll"), r.UsagePoll))
	}
	return errs
}

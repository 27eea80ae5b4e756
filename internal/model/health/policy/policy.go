// Package policy holds the health rules a node runs with: which XIDs are
// ignored or fatal, recovery periods, hysteresis and the checks turned off.
// It imports no NVML, so config can build and check one.
package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

// Policy is what the operator configures.
type Policy struct {
	// IgnoredXIDs are application errors: they say nothing about the GPU.
	IgnoredXIDs []uint64
	// FatalXIDs mean the GPU itself is bad: Unhealthy whatever IgnoredXIDs
	// says, until the driver reports a recovery action for the GPU and
	// then none again (it was reset), or else until the plugin restarts.
	FatalXIDs []uint64
	// XIDs sets single XIDs' actions, winning over IgnoredXIDs and
	// FatalXIDs (the xids setting). XIDTransient with XIDRecovery zero is
	// XIDSticky, as for any other XID.
	XIDs map[uint64]XIDAction
	// XIDRecovery is how long a GPU with any other XID stays Unhealthy
	// after its last such XID. Zero keeps it Unhealthy, like a fatal XID.
	XIDRecovery time.Duration
	// PollInterval is how often temperature and clocks are read.
	PollInterval time.Duration
	// ThermalMarginC is how far below its slowdown threshold a GPU must
	// cool before a thermal condition may clear.
	ThermalMarginC int
	// RecoveryPolls is how many consecutive good polls clear a thermal,
	// hardware-slowdown, power-brake or lost condition.
	RecoveryPolls int
	// SlowdownSamples is how many consecutive polls must show a hardware
	// slowdown or power brake clock reason before the GPU turns Unhealthy:
	// they flicker under load on some SKUs. Zero means
	// DefaultSlowdownSamples.
	SlowdownSamples int
	// NVMLFailurePolls is how many consecutive polls in which no GPU could
	// be read at all make every GPU Unhealthy ("nvml: ..."). Zero means
	// DefaultNVMLFailurePolls.
	NVMLFailurePolls int
	// Disabled names checks that are off: any of Checks(). A GPU is never
	// made Unhealthy by a disabled check.
	Disabled []string
}

// The checks Policy.Disabled can name.
const (
	// CheckThermal is the temperature against the slowdown threshold.
	CheckThermal = "thermal"
	// CheckHWSlowdown is the hardware slowdown and hardware thermal
	// slowdown clock reasons.
	CheckHWSlowdown = "hw-slowdown"
	// CheckPowerBrake is the hardware power brake clock reason.
	CheckPowerBrake = "power-brake"
	// CheckLost is a GPU answering GPU_IS_LOST to polls.
	CheckLost = "lost"
	// CheckRecoveryAction is the driver's GPU recovery action.
	CheckRecoveryAction = "recovery-action"
	// CheckRemappedRows is remapped-row pending and failure.
	CheckRemappedRows = "remapped-rows"
)

// Checks lists the checks Policy.Disabled can name.
func Checks() []string {
	return []string{CheckThermal, CheckHWSlowdown, CheckPowerBrake, CheckLost, CheckRecoveryAction, CheckRemappedRows}
}

// Defaults of the counts whose zero value means "the default".
const (
	DefaultSlowdownSamples  = 3
	DefaultNVMLFailurePolls = 3
)

// DefaultIgnoredXIDs are those NVIDIA's XID catalog gives nothing to do on
// the GPU (restart the application, or ignore): xid.Default(xid.Ignore).
func DefaultIgnoredXIDs() []uint64 { return xid.Default(xid.Ignore) }

// DefaultFatalXIDs are those NVIDIA's XID catalog says need a GPU reset or
// a node restart: xid.Default(xid.Fatal).
func DefaultFatalXIDs() []uint64 { return xid.Default(xid.Fatal) }

// DefaultPolicy is the policy with nothing configured.
func Default() Policy {
	return Policy{
		IgnoredXIDs:      DefaultIgnoredXIDs(),
		FatalXIDs:        DefaultFatalXIDs(),
		XIDRecovery:      10 * time.Minute,
		PollInterval:     5 * time.Second,
		ThermalMarginC:   5,
		RecoveryPolls:    3,
		SlowdownSamples:  DefaultSlowdownSamples,
		NVMLFailurePolls: DefaultNVMLFailurePolls,
	}
}

// Enabled says whether check runs.
func (p Policy) Enabled(check string) bool { return !slices.Contains(p.Disabled, check) }

// SlowdownSampleCount is SlowdownSamples, or its default when 0.
func (p Policy) SlowdownSampleCount() int {
	if p.SlowdownSamples == 0 {
		return DefaultSlowdownSamples
	}
	return p.SlowdownSamples
}

// NVMLFailurePollCount is NVMLFailurePolls, or its default when 0.
func (p Policy) NVMLFailurePollCount() int {
	if p.NVMLFailurePolls == 0 {
		return DefaultNVMLFailurePolls
	}
	return p.NVMLFailurePolls
}

// XIDAction is what one XID does to a GPU.
type XIDAction int

// What an XID does: nothing, a condition until the driver says the GPU was
// reset, or one for XIDRecovery.
const (
	XIDIgnore XIDAction = iota
	XIDSticky
	XIDTransient
)

// XID says what code does to a GPU under p: as XIDs says, else fatal if
// FatalXIDs lists it, else ignored if IgnoredXIDs does, else transient.
func (p Policy) XID(code uint64) XIDAction {
	if a, ok := p.XIDs[code]; ok {
		if a == XIDTransient && p.XIDRecovery <= 0 {
			return XIDSticky
		}
		return a
	}
	switch {
	case slices.Contains(p.FatalXIDs, code):
		return XIDSticky
	case slices.Contains(p.IgnoredXIDs, code):
		return XIDIgnore
	case p.XIDRecovery <= 0:
		return XIDSticky
	default:
		return XIDTransient
	}
}

// Action is what health does with an XID of class c.
func Action(c xid.Class) XIDAction {
	switch c {
	case xid.Ignore:
		return XIDIgnore
	case xid.Fatal:
		return XIDSticky
	}
	return XIDTransient
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	if p.PollInterval <= 0 {
		return fmt.Errorf("poll interval %s must be positive", p.PollInterval)
	}
	if p.RecoveryPolls < 1 {
		return fmt.Errorf("recovery polls %d must be at least 1", p.RecoveryPolls)
	}
	if p.ThermalMarginC < 0 {
		return fmt.Errorf("thermal margin %dC must not be negative", p.ThermalMarginC)
	}
	if p.SlowdownSamples < 0 {
		return fmt.Errorf("slowdown samples %d must not be negative (0 means %d)", p.SlowdownSamples, DefaultSlowdownSamples)
	}
	if p.NVMLFailurePolls < 0 {
		return fmt.Errorf("NVML failure polls %d must not be negative (0 means %d)", p.NVMLFailurePolls, DefaultNVMLFailurePolls)
	}
	for i, c := range p.Disabled {
		if !slices.Contains(Checks(), c) {
			return fmt.Errorf("disabled checks[%d]: %q is not a check (use one of %s)", i, c, strings.Join(Checks(), ", "))
		}
	}
	return nil
}

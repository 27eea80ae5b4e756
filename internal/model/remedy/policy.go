package remedy

import (
	"fmt"
	"time"
)

// Policy is what the operator allows. The daemon builds it from the
// config.
type Policy struct {
	// Reset allows resetting a GPU once nothing runs on it. Resetting an
	// idle GPU touches no workload. Off, a GPU that needs a reset is only
	// watched: health keeps it out.
	Reset bool
	// Evict allows evicting the pods that hold a withheld GPU, once they
	// have had GracePeriod. Off, the GPU waits for them to end.
	Evict bool
	// GracePeriod is how long the holders of a withheld GPU are left alone
	// before they are evicted. 0 evicts at once.
	GracePeriod time.Duration
	// MaxResets is how many resets a GPU's faults may cause in Window; a
	// GPU that needs one more is out for a human.
	MaxResets int
	Window    time.Duration
	// ResetPeers allows draining and resetting a GPU's NVLink peers with
	// it where the driver resets them only together. Off, such a GPU is
	// out for a human.
	ResetPeers bool
	// Cordon asks for the node to be cordoned when it needs a reboot.
	Cordon bool
}

// DefaultPolicy resets idle GPUs, at most 3 times a day each, and touches
// no pod and no other GPU.
func DefaultPolicy() Policy {
	return Policy{
		Reset:       true,
		GracePeriod: 10 * time.Minute,
		MaxResets:   3,
		Window:      24 * time.Hour,
	}
}

// FieldError is one mistake in a Policy. Field is the field's
// lowerCamelCase name, which config prefixes with its key path.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate returns one error per mistake, each a *FieldError; nil when p
// can work.
func (p Policy) Validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{field, fmt.Sprintf(format, args...)})
	}
	if p.GracePeriod < 0 {
		bad("gracePeriod", "%s must not be negative (0s evicts at once)", p.GracePeriod)
	}
	if p.MaxResets < 1 {
		bad("maxResets", "%d must be at least 1 (to turn resets off, set reset to false)", p.MaxResets)
	}
	if p.Window <= 0 {
		bad("window", "%s must be positive (example: 24h)", p.Window)
	}
	if p.ResetPeers && !p.Reset {
		bad("resetPeers", "true has no effect while reset is false")
	}
	return errs
}

package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

// The opaque parameters this driver takes in a claim's or a class's
// config: apiVersion ConfigAPIVersion, kind GPUConfigKind. Documented in
// docs/dra.md and pinned by TestGPUConfigKeys.
const (
	ConfigAPIVersion = "gpu-device-plugin.github.io/v1alpha1"
	GPUConfigKind    = "GPUConfig"
)

// Sharing strategies of GPUConfig.
const (
	StrategyMPS         = "MPS"
	StrategyTimeSlicing = "TimeSlicing"
)

// GPUConfig is this driver's opaque configuration of a request's GPUs.
//
//	config:
//	- requests: [gpu]
//	  opaque:
//	    driver: gpu-device-plugin.github.io
//	    parameters:
//	      apiVersion: gpu-device-plugin.github.io/v1alpha1
//	      kind: GPUConfig
//	      sharing:
//	        strategy: MPS
//	        mps: {activeThreadPercentage: 50, pinnedMemoryLimit: 10Gi}
type GPUConfig struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Sharing    *SharingConfig `json:"sharing,omitempty"`
}

// SharingConfig is how the containers that reference the claim share its
// GPUs: TimeSlicing (the driver's default) or MPS.
type SharingConfig struct {
	Strategy    string             `json:"strategy"`
	MPS         *MPSConfig         `json:"mps,omitempty"`
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`
}

// MPSConfig are the limits of each MPS client (process) of the claim.
type MPSConfig struct {
	// ActiveThreadPercentage is the share of the GPU's SMs, 1 to 100;
	// 0: the claim's share of the memory (all of a whole GPU).
	ActiveThreadPercentage int `json:"activeThreadPercentage,omitempty"`
	// PinnedMemoryLimit is the device memory each client may pin; nil:
	// the memory the claim was allocated (none for a whole GPU).
	PinnedMemoryLimit *resource.Quantity `json:"pinnedMemoryLimit,omitempty"`
}

// TimeSlicingConfig is the time-slicing of the claim's GPUs.
type TimeSlicingConfig struct {
	// Interval is how long each process runs before the GPU switches to
	// another: Default, Short, Medium or Long (nvidia-smi compute-policy
	// --set-timeslice). Empty: the GPU's setting is left as it is.
	Interval string `json:"interval,omitempty"`
}

// requestConfigs resolves, per request, the GPUConfig that applies: the
// last entry for this driver that names the request (or its parent
// request of a subrequest "req/sub") or names none; class entries come
// before claim entries in the allocation, so a claim's own wins. Entries
// for other drivers are theirs. Every entry for this driver is decoded and
// checked, named by its position and source, whether or not it applies.
func requestConfigs(driver string, cfgs []resourceapi.DeviceAllocationConfiguration) (func(request string) *GPUConfig, error) {
	type entry struct {
		requests []string
		cfg      *GPUConfig
	}
	var entries []entry
	for i, c := range cfgs {
		if c.Opaque == nil || c.Opaque.Driver != driver {
			continue
		}
		src := "claim"
		if c.Source == resourceapi.AllocationConfigSourceClass {
			src = "class"
		}
		at := fmt.Sprintf("config[%d] (from the %s", i, src)
		if len(c.Requests) > 0 {
			at += ", for requests " + strings.Join(c.Requests, ", ")
		}
		at += ")"
		if isChannelConfig(c.Opaque.Parameters.Raw) {
			// A ComputeDomain's: read by channelConfigOf.
			continue
		}
		g, err := decodeGPUConfig(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("opaque %s for driver %s: %w", at, driver, err)
		}
		entries = append(entries, entry{c.Requests, g})
	}
	return func(request string) *GPUConfig {
		parent, _, _ := strings.Cut(request, "/")
		var out *GPUConfig
		for _, e := range entries {
			if len(e.requests) == 0 || slices.Contains(e.requests, request) || slices.Contains(e.requests, parent) {
				out = e.cfg
			}
		}
		return out
	}, nil
}

// decodeGPUConfig decodes and checks one entry's parameters: unknown keys
// and bad values are errors naming the key and the fix.
func decodeGPUConfig(raw []byte) (*GPUConfig, error) {
	example := fmt.Sprintf("{apiVersion: %s, kind: %s, sharing: {strategy: MPS, mps: {pinnedMemoryLimit: 10Gi}}}", ConfigAPIVersion, GPUConfigKind)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var g GPUConfig
	if err := dec.Decode(&g); err != nil {
		return nil, fmt.Errorf("parameters do not decode (%v); write them as %s", err, example)
	}
	if g.APIVersion != ConfigAPIVersion || g.Kind != GPUConfigKind {
		return nil, fmt.Errorf("parameters are apiVersion %q kind %q; this driver takes apiVersion %s kind %s (example: %s)", g.APIVersion, g.Kind, ConfigAPIVersion, GPUConfigKind, example)
	}
	s := g.Sharing
	if s == nil {
		return &g, nil
	}
	switch s.Strategy {
	case StrategyMPS:
		if s.TimeSlicing != nil {
			return nil, errors.New("sharing.timeSlicing is set with strategy MPS; remove it, or set strategy TimeSlicing")
		}
		if m := s.MPS; m != nil {
			if p := m.ActiveThreadPercentage; p < 0 || p > 100 {
				return nil, fmt.Errorf("sharing.mps.activeThreadPercentage: %d is out of range; use 1 to 100, or leave it out for the claim's share", p)
			}
			if q := m.PinnedMemoryLimit; q != nil && q.Value() < 1<<20 {
				return nil, fmt.Errorf("sharing.mps.pinnedMemoryLimit: %s is under 1Mi; use a size such as 10Gi, or leave it out for the claim's share", q)
			}
		}
	case StrategyTimeSlicing:
		if s.MPS != nil {
			return nil, errors.New("sharing.mps is set with strategy TimeSlicing; remove it, or set strategy MPS")
		}
		if t := s.TimeSlicing; t != nil && t.Interval != "" {
			if _, ok := sharing.IntervalLevel(t.Interval); !ok {
				return nil, fmt.Errorf("sharing.timeSlicing.interval: %q is not an interval; use %s (as written)", t.Interval, sharing.IntervalNames)
			}
		}
	case "":
		return nil, fmt.Errorf("sharing.strategy: missing; use %s or %s", StrategyMPS, StrategyTimeSlicing)
	default:
		return nil, fmt.Errorf("sharing.strategy: %q is not a strategy; use %s or %s (as written)", s.Strategy, StrategyMPS, StrategyTimeSlicing)
	}
	return &g, nil
}

// mps says whether the config asks for MPS.
func (g *GPUConfig) mps() bool {
	return g != nil && g.Sharing != nil && g.Sharing.Strategy == StrategyMPS
}

// timeSlice is the interval the config asks for ("" for none) and its
// nvidia-smi level.
func (g *GPUConfig) timeSlice() (string, int) {
	if g == nil || g.Sharing == nil || g.Sharing.Strategy != StrategyTimeSlicing || g.Sharing.TimeSlicing == nil {
		return "", 0
	}
	i := g.Sharing.TimeSlicing.Interval
	level, _ := sharing.IntervalLevel(i)
	return i, level
}

// level is nvidia-smi's level for a time-slice interval Decode accepted.
func level(interval string) int {
	l, _ := sharing.IntervalLevel(interval)
	return l
}

// TimeSlicer sets the compute time-slice of the GPU with uuid to an
// nvidia-smi level and returns what nvidia-smi said
// (mpsexec.SetTimeSlice).
type TimeSlicer func(ctx context.Context, uuid string, level int) (string, error)

// setTimeSlicesLocked sets the time-slice intervals p's devices ask for;
// on a failure those set are put back and the claim fails.
func (d *Driver) setTimeSlicesLocked(ctx context.Context, p preparedClaim) error {
	var done []preparedDevice
	for _, dv := range p.Devices {
		if dv.TimeSlice == "" {
			continue
		}
		if d.timeSlice == nil {
			return fmt.Errorf("device %s: its time-slice interval cannot be set yet (the GPUs are not discovered yet); the kubelet retries", dv.Device)
		}
		said, err := d.timeSlice(ctx, dv.gpu, level(dv.TimeSlice))
		if err != nil {
			for _, u := range done {
				_, _ = d.timeSlice(ctx, u.gpu, level(sharing.IntervalDefault))
			}
			return fmt.Errorf("device %s: setting time-slice interval %s: %w", dv.Device, dv.TimeSlice, err)
		}
		d.o.Log.Info("set the GPU's time-slice interval for a claim", "device", dv.Device, "gpu", dv.gpu, "interval", dv.TimeSlice, "nvidiaSMI", said)
		done = append(done, dv)
	}
	return nil
}

// resetTimeSlicesLocked puts the GPUs of p's devices whose interval it set
// back to Default, as it goes.
func (d *Driver) resetTimeSlicesLocked(ctx context.Context, p preparedClaim) {
	for _, dv := range p.Devices {
		if dv.TimeSlice == "" || dv.TimeSlice == sharing.IntervalDefault || d.timeSlice == nil {
			continue
		}
		e, ok := d.byName[dv.Device]
		if !ok {
			continue
		}
		said, err := d.timeSlice(ctx, e.ID, level(sharing.IntervalDefault))
		if err != nil {
			d.o.Log.Warn("putting the GPU's time-slice interval back to Default", "device", dv.Device, "err", err)
			continue
		}
		d.o.Log.Info("put the GPU's time-slice interval back to Default", "device", dv.Device, "gpu", e.ID, "nvidiaSMI", said)
	}
}

// isChannelConfig says whether raw is a ComputeDomain channel's config.
func isChannelConfig(raw []byte) bool {
	var k struct {
		Kind string `json:"kind"`
	}
	return json.Unmarshal(raw, &k) == nil && k.Kind == ChannelConfigKind
}

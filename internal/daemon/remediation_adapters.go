package daemon

import (
	"context"
	"errors"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
)

// The resetter and prober the remediation uses until GPU reset through
// NVML (drain, remove, rediscover by PCI bus ID; Processes; Verify) and the
// confined CUDA probe land: each answers errNotYet, so a withheld GPU stays
// withheld (its usage is not known, so it is never reset), and never half
// remediated. Replace newResetter and newProber, and this file, with the
// real ones.

// errNotYet is what the stand-ins answer.
var errNotYet = errors.New("GPU reset and probe are not available in this build yet")

func newResetter() remediate.Resetter { return notYet{} }
func newProber() remediate.Prober     { return notYet{} }

type notYet struct{}

func (notYet) Processes(string) (int, error)         { return 0, errNotYet }
func (notYet) Reset(context.Context, []string) error { return errNotYet }
func (notYet) Verify(string) error                   { return errNotYet }
func (notYet) Probe(context.Context, string) error   { return errNotYet }

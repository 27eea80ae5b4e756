package cuda

import (
	"encoding/json"
	"fmt"
	"time"
)

// Step is one step of the probe, named after the CUDA call it makes.
type Step string

// The steps, in the order the probe takes them. StepConfine is the
// confined runner's (node/cudaprobe), between loading and cuInit.
const (
	StepLoad    Step = "load"    // dlopen libcuda.so.1 and look up its functions
	StepConfine Step = "confine" // the runner's own: the process's root, namespaces and limits
	StepInit    Step = "cuInit"
	// StepDevice finds the GPU: cuDeviceGetByPCIBusId, or by UUID through
	// cuDeviceGetCount and cuDeviceGet when no bus ID is given.
	StepDevice  Step = "cuDeviceGetByPCIBusId"
	StepUUID    Step = "cuDeviceGetUuid" // the call, or a UUID other than the one asked for
	StepContext Step = "cuCtxCreate"
	StepAlloc   Step = "cuMemAlloc"
	StepFree    Step = "cuMemFree"
	StepDestroy Step = "cuCtxDestroy"
)

// Result is what one probe found. It is the hidden cuda-probe command's
// report, as JSON (lowerCamelCase keys, durationMs for Duration).
type Result struct {
	// OK: every step succeeded.
	OK bool `json:"ok"`
	// Step is the step that failed; with TimedOut, the one that never
	// returned.
	Step Step `json:"step,omitempty"`
	// Code is the failed step's CUresult, and Name the driver's name for it
	// (cuGetErrorName: CUDA_ERROR_NO_DEVICE). Both are empty when the step
	// failed otherwise: a UUID mismatch, a missing library, a timeout.
	Code int    `json:"code,omitempty"`
	Name string `json:"name,omitempty"`
	// Message says what failed in words.
	Message string `json:"message,omitempty"`
	// UUID is the GPU's UUID as CUDA reports it, where the driver has
	// cuDeviceGetUuid.
	UUID string `json:"uuid,omitempty"`
	// TimedOut: the probe did not finish in time and was killed.
	TimedOut bool `json:"timedOut,omitempty"`
	// Stderr is the end of what the probe process wrote on stderr (the
	// driver's own complaints), filled in by the runner.
	Stderr string `json:"stderr,omitempty"`
	// Duration is how long the probe took, or ran before it was killed.
	Duration time.Duration `json:"-"`
}

// String is the result in one line, for logs and errors.
func (r Result) String() string {
	if r.OK {
		return fmt.Sprintf("ok in %v", r.Duration.Round(time.Millisecond))
	}
	s := fmt.Sprintf("failed at %s", r.Step)
	if r.Name != "" {
		s += fmt.Sprintf(": %s (%d)", r.Name, r.Code)
	} else if r.Code != 0 {
		s += fmt.Sprintf(": CUresult %d", r.Code)
	}
	if r.Message != "" {
		s += ": " + r.Message
	}
	return s
}

type resultJSON Result

// MarshalJSON writes Duration as durationMs.
func (r Result) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		resultJSON
		DurationMs float64 `json:"durationMs"`
	}{resultJSON(r), float64(r.Duration.Microseconds()) / 1000})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Result) UnmarshalJSON(b []byte) error {
	var v struct {
		resultJSON
		DurationMs float64 `json:"durationMs"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Result(v.resultJSON)
	r.Duration = time.Duration(v.DurationMs * float64(time.Millisecond))
	return nil
}

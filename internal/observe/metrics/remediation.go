package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// Remediation exports GPUs' remediation (package remediate's Recorder):
// gpu_device_plugin_remediation_resets_total{result},
// _recoveries_total, _recovery_seconds and _state{gpu,state}, one series
// per GPU, for the state it is in.
type Remediation struct {
	resets     *exposition.Counter
	recoveries *exposition.Counter
	took       *exposition.Histogram
	stateDesc  *exposition.Desc

	mu    sync.Mutex
	state map[string]string // GPU -> the state it is in
}

// NewRemediation registers the remediation metrics with reg.
func NewRemediation(reg *exposition.Registry) (*Remediation, error) {
	r := &Remediation{
		resets: exposition.NewCounter(exposition.Desc{Name: "gpu_device_plugin_remediation_resets_total",
			Help:   "GPU resets the remediation made, by result (success, failure); a reset of NVLink peers together counts once.",
			Labels: []string{"result"}}),
		recoveries: exposition.NewCounter(exposition.Desc{Name: "gpu_device_plugin_remediation_recoveries_total",
			Help: "GPUs given back after their remediation (reset or drain, then probe), or released by a human."}),
		took: exposition.NewHistogram(exposition.Desc{Name: "gpu_device_plugin_remediation_recovery_seconds",
			Help: "How long a GPU given back was withheld, from withheld to given back."},
			[]float64{10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400}),
		stateDesc: &exposition.Desc{Name: "gpu_device_plugin_remediation_state",
			Help:   "1 for the remediation state each GPU is in: serving, watching, draining, waitingIdle, resetting, probing, needsHuman, needsReboot.",
			Type:   exposition.TypeGauge,
			Labels: []string{"gpu", "state"}},
		state: map[string]string{},
	}
	for _, c := range []exposition.Collector{r.resets, r.recoveries, r.took, remediationState{r}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the remediation metrics: %w", err)
		}
	}
	return r, nil
}

// Reset counts a reset's result.
func (r *Remediation) Reset(result string) { r.resets.Inc(result) }

// Recovered counts a GPU given back after took.
func (r *Remediation) Recovered(took time.Duration) {
	r.recoveries.Inc()
	r.took.Observe(took.Seconds())
}

// State is gpu's state now; its series for the state before goes.
func (r *Remediation) State(gpu, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state[gpu] = state
}

// remediationState writes gpu_device_plugin_remediation_state from the
// states kept.
type remediationState struct{ r *Remediation }

func (c remediationState) Describe() []*exposition.Desc {
	return []*exposition.Desc{c.r.stateDesc}
}

func (c remediationState) Collect(s *exposition.Scrape) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	for gpu, state := range c.r.state {
		s.Add(c.r.stateDesc, 1, gpu, state)
	}
}

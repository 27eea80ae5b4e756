package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Remediation exports GPUs' remediation (package remediate's Recorder):
// gpu_device_plugin_remediation_resets_total{result},
// _recoveries_total, _recovery_seconds and _state{gpu,state}, one series
// per GPU, for the state it is in.
type Remediation struct {
	resets     *prometheus.CounterVec
	recoveries prometheus.Counter
	took       prometheus.Histogram
	state      *prometheus.GaugeVec

	mu   sync.Mutex
	last map[string]string // GPU -> the state its series says
}

// NewRemediation registers the remediation metrics with reg.
func NewRemediation(reg prometheus.Registerer) (*Remediation, error) {
	r := &Remediation{
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_device_plugin_remediation_resets_total",
			Help: "GPU resets the remediation made, by result (success, failure); a reset of NVLink peers together counts once.",
		}, []string{"result"}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_device_plugin_remediation_recoveries_total",
			Help: "GPUs given back after their remediation (reset or drain, then probe), or released by a human.",
		}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpu_device_plugin_remediation_recovery_seconds",
			Help:    "How long a GPU given back was withheld, from withheld to given back.",
			Buckets: []float64{10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400},
		}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_device_plugin_remediation_state",
			Help: "1 for the remediation state each GPU is in: serving, watching, draining, waitingIdle, resetting, probing, needsHuman, needsReboot.",
		}, []string{"gpu", "state"}),
		last: map[string]string{},
	}
	for _, c := range []prometheus.Collector{r.resets, r.recoveries, r.took, r.state} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Reset counts a reset's result.
func (r *Remediation) Reset(result string) { r.resets.WithLabelValues(result).Inc() }

// Recovered counts a GPU given back after took.
func (r *Remediation) Recovered(took time.Duration) {
	r.recoveries.Inc()
	r.took.Observe(took.Seconds())
}

// State is gpu's state now; its series for the state before goes.
func (r *Remediation) State(gpu, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.last[gpu]; ok && old != state {
		r.state.DeleteLabelValues(gpu, old)
	}
	r.last[gpu] = state
	r.state.WithLabelValues(gpu, state).Set(1)
}

package health

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exposes device health to Prometheus, for every resource.
type Metrics struct {
	healthy     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
}

// NewMetrics registers the health metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_device_plugin_device_healthy",
			Help: "1 when the device is healthy, 0 when it is not.",
		}, []string{"resource", "device"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_device_plugin_health_transitions_total",
			Help: "Health transitions per device, by the state entered.",
		}, []string{"resource", "device", "to"}),
	}
	for _, c := range []prometheus.Collector{m.healthy, m.transitions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// For returns a Recorder that labels its samples with resource.
func (m *Metrics) For(resource string) Recorder {
	return resourceMetrics{m: m, resource: resource}
}

type resourceMetrics struct {
	m        *Metrics
	resource string
}

func (r resourceMetrics) Health(device string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	r.m.healthy.WithLabelValues(r.resource, device).Set(v)
}

func (r resourceMetrics) Transition(device string, healthy bool) {
	to := "Unhealthy"
	if healthy {
		to = "Healthy"
	}
	r.m.transitions.WithLabelValues(r.resource, device, to).Inc()
}

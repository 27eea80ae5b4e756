package metrics

import "github.com/prometheus/client_golang/prometheus"

// Probes is what the liveness and readiness probes answer (package probe).
type Probes interface {
	Ready() error
	Live() error
}

// RegisterProbes registers gpu_device_plugin_ready and _live, read from p
// at each scrape, so an alert sees what the kubelet's probes see.
func RegisterProbes(reg prometheus.Registerer, p Probes) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpu_device_plugin_ready",
			Help: "1 when the plugin is ready: the kubelet holds every resource's registration (device-plugin API), or its ResourceSlices were handed to the publisher (DRA); 0 while not, as the readiness probe says.",
		}, func() float64 { return ok(p.Ready()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpu_device_plugin_live",
			Help: "1 while every main loop of the plugin (GPU health polls, NIC scans) turns in time; 0 when one is stuck, as the liveness probe says.",
		}, func() float64 { return ok(p.Live()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func ok(err error) float64 {
	if err != nil {
		return 0
	}
	return 1
}

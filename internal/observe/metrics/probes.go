package metrics

import (
	"fmt"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// Probes is what the liveness and readiness probes answer (package probe).
type Probes interface {
	Ready() error
	Live() error
}

// RegisterProbes registers gpu_device_plugin_ready and _live, read from p
// at each scrape, so an alert sees what the kubelet's probes see.
func RegisterProbes(reg *exposition.Registry, p Probes) error {
	c := probesCollector{p: p,
		ready: &exposition.Desc{Name: "gpu_device_plugin_ready",
			Help: "1 when the plugin is ready: the kubelet holds every resource's registration (device-plugin API), or its ResourceSlices were handed to the publisher (DRA); 0 while not, as the readiness probe says.",
			Type: exposition.TypeGauge},
		live: &exposition.Desc{Name: "gpu_device_plugin_live",
			Help: "1 while every main loop of the plugin (GPU health polls, NIC scans) turns in time; 0 when one is stuck, as the liveness probe says.",
			Type: exposition.TypeGauge},
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("registering the probes' metrics: %w", err)
	}
	return nil
}

type probesCollector struct {
	p           Probes
	ready, live *exposition.Desc
}

func (c probesCollector) Describe() []*exposition.Desc { return []*exposition.Desc{c.ready, c.live} }

func (c probesCollector) Collect(s *exposition.Scrape) {
	s.Add(c.ready, one(c.p.Ready() == nil))
	s.Add(c.live, one(c.p.Live() == nil))
}

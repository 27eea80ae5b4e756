package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// AllocationOptions configure Metrics.Allocations.
type AllocationOptions struct {
	// Holders asks the kubelet; podresources.Client.Holders is one.
	Holders func(context.Context) (podresources.Holders, error)
	// Driver and Pool are this node's DRA driver and pool, to find the
	// holders of devices prepared through DRA.
	Driver, Pool string
	// Timeout bounds each scrape's question, well inside a scrape
	// timeout; zero is 2s.
	Timeout time.Duration
	// Source names where holders come from in the log (the socket and
	// the setting that moves it).
	Source string
	Log    *slog.Logger
}

// AllocationCollector is the exposition.Collector of
// gpu_device_plugin_device_allocated. It asks the kubelet at each scrape,
// as dcgm-exporter does, rather than keep a copy that would go stale
// between pods.
type AllocationCollector struct {
	m    *Metrics
	o    AllocationOptions
	desc *exposition.Desc

	mu      sync.Mutex // guards failing: scrapes may overlap
	failing bool
}

// Allocations returns the collector of who holds the devices m has facts
// for (SetInfo): by their device ID under their resource, and by DRAName
// in o's driver and pool.
func (m *Metrics) Allocations(o AllocationOptions) *AllocationCollector {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &AllocationCollector{m: m, o: o, desc: &exposition.Desc{Name: "gpu_device_plugin_device_allocated",
		Help:   "1 for every container holding a device, as the kubelet's PodResources API says at scrape time.",
		Type:   exposition.TypeGauge,
		Labels: []string{"resource", "device", "namespace", "pod", "container"}}}
}

// Describe implements exposition.Collector.
func (c *AllocationCollector) Describe() []*exposition.Desc { return []*exposition.Desc{c.desc} }

// Collect implements exposition.Collector. When the kubelet cannot be
// asked there are no series, and one warning per run of failures: a
// missing socket would otherwise log at every scrape.
func (c *AllocationCollector) Collect(s *exposition.Scrape) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	h, err := c.o.Holders(ctx)
	c.mu.Lock()
	switch {
	case err != nil && !c.failing:
		c.o.Log.Warn("cannot read who holds the devices; gpu_device_plugin_device_allocated is left out until it can", "source", c.o.Source, "err", err)
	case err == nil && c.failing:
		c.o.Log.Info("reading who holds the devices works again", "source", c.o.Source)
	}
	c.failing = err != nil
	c.mu.Unlock()
	if err != nil {
		return
	}
	for _, d := range c.m.served() {
		names := podresources.Names{Resource: d.resource, IDs: []string{d.device}, Driver: c.o.Driver, Pool: c.o.Pool, DRADevice: d.info.DRAName}
		for _, who := range h.Of(names) {
			s.Add(c.desc, 1, d.resource, d.device, who.Namespace, who.Pod, who.Container)
		}
	}
}

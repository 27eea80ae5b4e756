package metrics

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// GoRuntime is the collector of the Go runtime's series that dashboards
// use, named, typed and meant as client_golang's Go collector has them:
// go_goroutines, go_threads, go_info, go_memstats_heap_alloc_bytes,
// go_memstats_sys_bytes, go_gc_duration_seconds, go_gc_gogc_percent and
// go_gc_gomemlimit_bytes.
func GoRuntime() exposition.Collector {
	gauge := func(name, help string, labels ...string) *exposition.Desc {
		return &exposition.Desc{Name: name, Help: help, Type: exposition.TypeGauge, Labels: labels}
	}
	return goRuntime{
		goroutines: gauge("go_goroutines", "Number of goroutines that currently exist."),
		threads:    gauge("go_threads", "Number of OS threads created."),
		info:       gauge("go_info", "Information about the Go environment.", "version"),
		gcPauses: &exposition.Desc{Name: "go_gc_duration_seconds",
			Help: "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.",
			Type: exposition.TypeSummary},
		// Read from runtime/metrics, as client_golang's collector does
		// since Go 1.17: cheaper than runtime.ReadMemStats, which stops
		// the world.
		read: []runtimeGauge{
			{"/memory/classes/heap/objects:bytes", gauge("go_memstats_heap_alloc_bytes",
				"Number of heap bytes allocated and currently in use. Equals to /memory/classes/heap/objects:bytes.")},
			{"/memory/classes/total:bytes", gauge("go_memstats_sys_bytes",
				"Number of bytes obtained from system. Equals to /memory/classes/total:bytes.")},
			{"/gc/gogc:percent", gauge("go_gc_gogc_percent",
				"Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.")},
			{"/gc/gomemlimit:bytes", gauge("go_gc_gomemlimit_bytes",
				"Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.")},
		},
	}
}

type goRuntime struct {
	goroutines, threads, info, gcPauses *exposition.Desc
	read                                []runtimeGauge
}

// runtimeGauge is a gauge read from the runtime/metrics sample of that
// name.
type runtimeGauge struct {
	sample string
	desc   *exposition.Desc
}

func (c goRuntime) Describe() []*exposition.Desc {
	out := []*exposition.Desc{c.goroutines, c.threads, c.info, c.gcPauses}
	for _, g := range c.read {
		out = append(out, g.desc)
	}
	return out
}

func (c goRuntime) Collect(s *exposition.Scrape) {
	s.Add(c.goroutines, float64(runtime.NumGoroutine()))
	threads, _ := runtime.ThreadCreateProfile(nil)
	s.Add(c.threads, float64(threads))
	s.Add(c.info, 1, runtime.Version())

	samples := make([]rtmetrics.Sample, len(c.read))
	for i, g := range c.read {
		samples[i].Name = g.sample
	}
	rtmetrics.Read(samples)
	for i, g := range c.read {
		// KindBad: a runtime without the metric; its series is left out.
		if samples[i].Value.Kind() == rtmetrics.KindUint64 {
			s.Add(g.desc, float64(samples[i].Value.Uint64()))
		}
	}

	// The minimum, quartiles and maximum of the last (up to 256) pauses,
	// as client_golang gives them.
	stats := debug.GCStats{PauseQuantiles: make([]time.Duration, 5)}
	debug.ReadGCStats(&stats)
	pauses := exposition.Distribution{Count: uint64(stats.NumGC), Sum: stats.PauseTotal.Seconds()}
	for i, q := range stats.PauseQuantiles {
		pauses.Quantiles = append(pauses.Quantiles, exposition.Quantile{Quantile: float64(i) / 4, Value: q.Seconds()})
	}
	s.AddDistribution(c.gcPauses, pauses)
}

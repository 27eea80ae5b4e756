package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// healthPoll is how often the watch reads every signal: the plugin's own
// default poll is slower, so each signal is read many times.
const healthPoll = time.Second

var signals = []nvml.Signal{nvml.SignalTemperature, nvml.SignalClockReasons, nvml.SignalRecoveryAction, nvml.SignalRemappedRows}

type healthData struct {
	Seconds float64     `json:"seconds"`
	Polls   int         `json:"polls"`
	GPUs    []gpuHealth `json:"gpus"`
	// Events are the NVML events (XID, double-bit ECC, recovery action)
	// seen while watching.
	Events []string `json:"events"`
	// EventsError is why events could not be watched, if so.
	EventsError string `json:"eventsError,omitempty"`
	// PluginSaid are the serving plugin's log lines about health signals.
	PluginSaid []string `json:"pluginSaid"`
}

type gpuHealth struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// Signals are per-signal counts: read, unsupported (the driver said
	// NOT_SUPPORTED or lacks the function), failed.
	Signals          map[string]*signalStats `json:"signals"`
	TempMinC         int                     `json:"tempMinC"`
	TempMaxC         int                     `json:"tempMaxC"`
	SlowdownC        int                     `json:"slowdownC"`
	ShutdownC        int                     `json:"shutdownC"`
	ClockReasonsSeen []string                `json:"clockReasonsSeen"`
	RecoveryAction   string                  `json:"recoveryAction"`
	RowRemapPending  bool                    `json:"rowRemapPending"`
	RowRemapFailure  bool                    `json:"rowRemapFailure"`
}

type signalStats struct {
	Read        int    `json:"read"`
	Unsupported int    `json:"unsupported"`
	Failed      int    `json:"failed"`
	LastError   string `json:"lastError,omitempty"`
}

// watchHealth reads every health signal the plugin reads, through NVML in
// this process, for -health, while the plugin from the serve step keeps
// serving: no GPU may turn Unhealthy on a quiet machine.
func (c *checker) watchHealth(ctx context.Context, s *Step) {
	lib, err := c.nvml()
	if !s.check("NVML loads in-process", err == nil, "%s", errText(err)) {
		return
	}
	log := c.logger()
	inv, err := nvml.Discover(lib, c.sysfs, log)
	if !s.check("discovery in-process", err == nil, "%s", errText(err)) {
		return
	}
	m := nvml.NewMonitor(lib, inv, log)
	data := &healthData{Events: []string{}, PluginSaid: []string{}}
	s.Data = data
	for _, g := range inv.GPUs {
		gh := gpuHealth{Index: g.Index, UUID: g.UUID, Signals: map[string]*signalStats{}, TempMinC: 1 << 30, ClockReasonsSeen: []string{}}
		for _, sig := range signals {
			gh.Signals[sig.String()] = &signalStats{}
		}
		data.GPUs = append(data.GPUs, gh)
	}

	watch, cancel := context.WithTimeout(ctx, c.o.health)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	events := make(chan nvml.Event, 16)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := m.WatchEvents(watch, events); err != nil {
			mu.Lock()
			data.EventsError = err.Error()
			mu.Unlock()
		}
	}()
	// A GPU turning Unhealthy in what the kubelet's client receives.
	var flipped string
	if c.served != nil && c.served.ep.Plugin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.served.kubelet.WaitDevices(watch, harness.ResourceName, "a GPU turning unhealthy", func(l harness.List) bool {
				for _, d := range l.Devices {
					if d.Health != api.Healthy {
						return true
					}
				}
				return false
			})
			if err == nil {
				mu.Lock()
				flipped = fmt.Sprint(l.Devices)
				mu.Unlock()
			}
		}()
	}
	began := time.Now()
	tick := time.NewTicker(healthPoll)
	defer tick.Stop()
poll:
	for {
		for i := range data.GPUs {
			record(&data.GPUs[i], m.Sample(i))
		}
		data.Polls++
		select {
		case <-watch.Done():
			break poll
		case e := <-events:
			mu.Lock()
			data.Events = append(data.Events, describeEvent(e))
			mu.Unlock()
		case <-tick.C:
		}
	}
	wg.Wait()
	for len(events) > 0 {
		data.Events = append(data.Events, describeEvent(<-events))
	}
	data.Seconds = harness.Round(time.Since(began).Seconds(), 1)

	for i := range data.GPUs {
		g := &data.GPUs[i]
		for _, sig := range signals {
			st := g.Signals[sig.String()]
			s.check(fmt.Sprintf("GPU %d %s", g.Index, sig), st.Failed == 0,
				"read %d, unsupported %d, failed %d %s", st.Read, st.Unsupported, st.Failed, st.LastError)
		}
		if g.Signals[nvml.SignalTemperature.String()].Read == 0 {
			g.TempMinC = 0
		} else if g.SlowdownC > 0 {
			s.check(fmt.Sprintf("GPU %d below its slowdown temperature", g.Index), g.TempMaxC < g.SlowdownC, "max %d C, slowdown %d C", g.TempMaxC, g.SlowdownC)
		}
	}
	s.check("NVML events watched", data.EventsError == "", "%s", data.EventsError)
	s.check("no XID or ECC event on a quiet machine", len(data.Events) == 0, "%s", strings.Join(data.Events, "; "))
	if c.served != nil && c.served.plugin != nil {
		s.check("no GPU flipped to Unhealthy in ListAndWatch", flipped == "", "%s", flipped)
		for _, e := range c.served.plugin.LogEntries() {
			msg := e.String("msg")
			if strings.Contains(msg, "health signal") || strings.Contains(msg, "unhealthy") || strings.Contains(msg, "Unhealthy") {
				data.PluginSaid = append(data.PluginSaid, fmt.Sprintf("%s %s %s", msg, e.String("device"), e.String("signal")))
			}
		}
	}
}

// record adds one sample to a GPU's tally.
func record(g *gpuHealth, smp nvml.Sample) {
	for _, sig := range signals {
		st := g.Signals[sig.String()]
		switch {
		case smp.Unsupported&sig != 0:
			st.Unsupported++
		case smp.Failed&sig != 0:
			st.Failed++
			if smp.Err != nil {
				st.LastError = smp.Err.Error()
			}
		default:
			st.Read++
		}
	}
	if smp.Has(nvml.SignalTemperature) {
		g.TempMinC, g.TempMaxC = min(g.TempMinC, smp.TempC), max(g.TempMaxC, smp.TempC)
		g.SlowdownC, g.ShutdownC = smp.SlowdownC, smp.ShutdownC
	}
	if smp.Has(nvml.SignalClockReasons) {
		r := fmt.Sprintf("%#x", smp.Reasons)
		if !slices.Contains(g.ClockReasonsSeen, r) {
			g.ClockReasonsSeen = append(g.ClockReasonsSeen, r)
		}
	}
	if smp.Has(nvml.SignalRecoveryAction) {
		g.RecoveryAction = smp.RecoveryAction.String()
	}
	if smp.Has(nvml.SignalRemappedRows) {
		g.RowRemapPending = g.RowRemapPending || smp.RowRemapPending
		g.RowRemapFailure = g.RowRemapFailure || smp.RowRemapFailure
	}
}

func describeEvent(e nvml.Event) string {
	switch e.Kind {
	case nvml.EventXID:
		return fmt.Sprintf("GPU %d XID %d", e.GPU, e.XID)
	case nvml.EventDoubleBitECC:
		return fmt.Sprintf("GPU %d double-bit ECC", e.GPU)
	case nvml.EventRecoveryAction:
		return fmt.Sprintf("GPU %d recovery action changed", e.GPU)
	}
	return fmt.Sprintf("GPU %d event %d", e.GPU, e.Kind)
}

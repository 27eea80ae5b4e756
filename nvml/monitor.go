package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// EventKind says what an NVML event reported.
type EventKind int

const (
	EventXID EventKind = iota + 1
	EventDoubleBitECC
)

// Event is one NVML event for one GPU, by position in Inventory.GPUs.
type Event struct {
	GPU  int
	Kind EventKind
	// XID is the XID code for EventXID.
	XID uint64
}

// Clock-event reasons that mean the hardware itself is slowing the GPU
// down, as opposed to software caps or idling.
const (
	ReasonHWSlowdown        = uint64(gonvml.ClocksThrottleReasonHwSlowdown)
	ReasonHWThermalSlowdown = uint64(gonvml.ClocksThrottleReasonHwThermalSlowdown)
	ReasonHWPowerBrake      = uint64(gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown)
)

// Sample is one poll of a GPU's thermal and clock state.
type Sample struct {
	TempC int
	// SlowdownC and ShutdownC are the GPU's thresholds; 0 when unknown.
	SlowdownC int
	ShutdownC int
	// Reasons is the clock-event reasons bit mask.
	Reasons uint64
	// Err is set when the GPU could not be read; Lost when NVML says the
	// GPU has fallen off the bus.
	Err  error
	Lost bool
}

// Monitor reads the health signals of discovered GPUs. Thresholds are
// static per GPU, so they are read once and only re-read while unknown.
type Monitor struct {
	lib       Library
	handles   []gonvml.Device
	slowdown  []int
	shutdown  []int
	log       *slog.Logger
	eventWait time.Duration
}

// NewMonitor prepares monitoring for every GPU in inv.
func NewMonitor(lib Library, inv *Inventory, log *slog.Logger) *Monitor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{
		lib:       lib,
		handles:   inv.handles,
		slowdown:  make([]int, len(inv.handles)),
		shutdown:  make([]int, len(inv.handles)),
		log:       log,
		eventWait: 200 * time.Millisecond,
	}
	for i := range m.handles {
		m.readThresholds(i)
	}
	return m
}

func (m *Monitor) readThresholds(i int) {
	if v, ret := m.handles[i].GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN); ret == gonvml.SUCCESS {
		m.slowdown[i] = int(v)
	}
	if v, ret := m.handles[i].GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SHUTDOWN); ret == gonvml.SUCCESS {
		m.shutdown[i] = int(v)
	}
}

// GPUs is the number of GPUs monitored.
func (m *Monitor) GPUs() int { return len(m.handles) }

// Sample reads GPU i's temperature and clock-event reasons: two NVML
// calls, so a poll of a whole node stays cheap.
func (m *Monitor) Sample(i int) Sample {
	h := m.handles[i]
	if m.slowdown[i] == 0 {
		m.readThresholds(i)
	}
	s := Sample{SlowdownC: m.slowdown[i], ShutdownC: m.shutdown[i]}
	temp, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU)
	if ret != gonvml.SUCCESS {
		return failed(s, "reading temperature", ret)
	}
	s.TempC = int(temp)
	reasons, ret := h.GetCurrentClocksEventReasons()
	if ret != gonvml.SUCCESS {
		return failed(s, "reading clock-event reasons", ret)
	}
	s.Reasons = reasons
	return s
}

func failed(s Sample, what string, ret gonvml.Return) Sample {
	s.Err = fmt.Errorf("%s: %w", what, ret)
	s.Lost = ret == gonvml.ERROR_GPU_IS_LOST
	return s
}

// WatchEvents sends XID and double-bit ECC events to out until ctx ends.
// One event set covers every GPU; a GPU that cannot register is logged
// and left to polling. Waits are short so shutdown is prompt.
func (m *Monitor) WatchEvents(ctx context.Context, out chan<- Event) error {
	set, ret := m.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("creating NVML event set: %w", ret)
	}
	defer set.Free()
	byHandle := make(map[gonvml.Device]int, len(m.handles))
	registered := 0
	for i, h := range m.handles {
		byHandle[h] = i
		supported, ret := h.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS {
			m.log.Warn("reading supported NVML events; GPU left to polling", "index", i, "reason", ret.Error())
			continue
		}
		mask := supported & (gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError)
		if mask == 0 {
			m.log.Warn("GPU reports no XID or ECC events; left to polling", "index", i)
			continue
		}
		if ret := h.RegisterEvents(mask, set); ret != gonvml.SUCCESS {
			m.log.Warn("registering NVML events; GPU left to polling", "index", i, "reason", ret.Error())
			continue
		}
		registered++
	}
	if registered == 0 && len(m.handles) > 0 {
		return errors.New("no GPU could register for NVML events")
	}
	waitMs := uint32(m.eventWait / time.Millisecond)
	failures := 0
	for ctx.Err() == nil {
		data, ret := set.Wait(waitMs)
		switch ret {
		case gonvml.SUCCESS:
			failures = 0
		case gonvml.ERROR_TIMEOUT:
			continue
		default:
			// A broken wait would otherwise spin: back off, and let the
			// poller report NVML's state.
			failures++
			if failures == 1 {
				m.log.Warn("waiting for NVML events", "reason", ret.Error())
			}
			select {
			case <-ctx.Done():
			case <-time.After(min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)):
			}
			continue
		}
		i, ok := byHandle[data.Device]
		if !ok {
			m.log.Warn("NVML event for an unknown GPU", "eventType", data.EventType, "data", data.EventData)
			continue
		}
		ev := Event{GPU: i}
		switch {
		case data.EventType&gonvml.EventTypeXidCriticalError != 0:
			ev.Kind, ev.XID = EventXID, data.EventData
		case data.EventType&gonvml.EventTypeDoubleBitEccError != 0:
			ev.Kind = EventDoubleBitECC
		default:
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
		}
	}
	return nil
}

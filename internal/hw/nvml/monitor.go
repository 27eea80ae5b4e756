package nvml

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// EventKind says what an NVML event reported.
type EventKind int

const (
	EventXID EventKind = iota + 1
	EventDoubleBitECC
	// EventRecoveryAction says the driver changed the GPU's recovery
	// action; the health watcher reads the GPU again at once.
	EventRecoveryAction
)

// Event is one NVML event for one GPU, by position in Inventory.GPUs.
type Event struct {
	GPU  int
	Kind EventKind
	// XID is the XID code for EventXID.
	XID uint64
	// MIG names the MIG instance an XID is about; nil when the event names
	// none (the whole GPU).
	MIG *Instance
}

// Instance names a MIG GPU instance and, when ComputeInstance is not -1,
// one compute instance of it.
type Instance struct {
	GPUInstance, ComputeInstance int
}

// Clock-event reasons that mean the hardware itself is slowing the GPU
// down, as opposed to software caps or idling.
const (
	ReasonHWSlowdown        = uint64(gonvml.ClocksThrottleReasonHwSlowdown)
	ReasonHWThermalSlowdown = uint64(gonvml.ClocksThrottleReasonHwThermalSlowdown)
	ReasonHWPowerBrake      = uint64(gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown)
)

// Signal is one polled health reading, as a bit of a mask.
type Signal uint8

const (
	SignalTemperature    Signal = 1 << iota // temperature and its thresholds
	SignalClockReasons                      // clock-event (throttle) reasons
	SignalRecoveryAction                    // the driver's GPU recovery action (R550+)
	SignalRemappedRows                      // remapped-row pending and failure (R460+, HBM GPUs)

	AllSignals = SignalTemperature | SignalClockReasons | SignalRecoveryAction | SignalRemappedRows
)

func (s Signal) String() string {
	var out []string
	for _, n := range []struct {
		sig  Signal
		name string
	}{
		{SignalTemperature, "temperature"}, {SignalClockReasons, "clock-reasons"},
		{SignalRecoveryAction, "recovery-action"}, {SignalRemappedRows, "remapped-rows"},
	} {
		if s&n.sig != 0 {
			out = append(out, n.name)
		}
	}
	return strings.Join(out, "+")
}

// RecoveryAction is what the driver says a GPU needs before it can be
// used again (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
type RecoveryAction int

// The values are NVML's.
const (
	RecoveryNone          = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_NONE)
	RecoveryReset         = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_GPU_RESET)
	RecoveryReboot        = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT)
	RecoveryDrainP2P      = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P)
	RecoveryDrainAndReset = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
	RecoveryIMEXDomain    = RecoveryAction(gonvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN)
)

// String is the name used in health reasons: "reset", "reboot", "drain".
func (a RecoveryAction) String() string {
	switch a {
	case RecoveryNone:
		return "none"
	case RecoveryReset:
		return "reset"
	case RecoveryReboot:
		return "reboot"
	case RecoveryDrainP2P:
		return "drain"
	case RecoveryDrainAndReset:
		return "drain-and-reset"
	case RecoveryIMEXDomain:
		return "recover-imex-domain"
	}
	return strconv.Itoa(int(a))
}

// Sample is one poll of a GPU's health signals. The zero Sample holds
// every signal, all good.
type Sample struct {
	TempC int
	// SlowdownC and ShutdownC are the GPU's thresholds; 0 when unknown.
	SlowdownC int
	ShutdownC int
	// Reasons is the clock-event reasons bit mask.
	Reasons uint64
	// RecoveryAction is the driver's recovery action for the GPU.
	RecoveryAction RecoveryAction
	// RowRemapPending means a row remapping waits for a GPU reset;
	// RowRemapFailure that one could not be done.
	RowRemapPending bool
	RowRemapFailure bool
	// MIGEnabled is the GPU's MIG mode as discovery read it.
	MIGEnabled bool

	// Unsupported are the signals turned off for this GPU: the driver
	// lacks the function, or the GPU answered NOT_SUPPORTED once. Failed
	// are those whose read failed this time, and Err says why. The fields
	// of either kind of signal are not valid.
	Unsupported Signal
	Failed      Signal
	Err         error
	// Lost is set when NVML says the GPU has fallen off the bus.
	Lost bool
}

// Has reports whether the sample holds a valid reading of sig.
func (s Sample) Has(sig Signal) bool { return (s.Unsupported|s.Failed)&sig == 0 }

// Monitor reads the health signals of discovered GPUs. Thresholds are
// static per GPU, so they are read once and only re-read while unknown.
// A signal the GPU answers NOT_SUPPORTED to is turned off for that GPU and
// logged once. Sample must be called from one goroutine.
type Monitor struct {
	lib Library
	// mu guards handles: Rebind replaces one while WatchEvents reads them.
	mu      sync.Mutex
	handles []gonvml.Device
	rebound chan int // GPUs Rebind gave a new handle, for WatchEvents to register
	// stale marks the GPUs Rebind gave a new handle whose thresholds
	// Sample has not read again yet.
	stale     []atomic.Bool
	uuids     []string
	mig       []bool
	syms      Symbols
	slowdown  []int
	shutdown  []int
	off       []Signal
	log       *slog.Logger
	eventWait time.Duration
}

// NewMonitor prepares monitoring for every GPU in inv.
func NewMonitor(lib Library, inv *Inventory, log *slog.Logger) *Monitor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := len(inv.handles)
	m := &Monitor{
		lib:       lib,
		handles:   slices.Clone(inv.handles),
		rebound:   make(chan int, n),
		stale:     make([]atomic.Bool, n),
		uuids:     make([]string, n),
		mig:       make([]bool, n),
		syms:      inv.syms,
		slowdown:  make([]int, n),
		shutdown:  make([]int, n),
		off:       make([]Signal, n),
		log:       log,
		eventWait: 200 * time.Millisecond,
	}
	// Signals whose functions the driver lacks are off for every GPU;
	// Discover has said so in one line.
	off := unsupportedByDriver(m.syms)
	for i := range m.handles {
		m.uuids[i], m.mig[i], m.off[i] = inv.GPUs[i].UUID, inv.GPUs[i].MIGEnabled, off
		if off&SignalTemperature == 0 {
			m.readThresholds(i)
		}
	}
	return m
}

func (m *Monitor) readThresholds(i int) {
	m.slowdown[i], m.shutdown[i] = readThresholds(m.handle(i))
}

// readThresholds reads a GPU's slowdown and shutdown temperatures; 0 for
// one NVML does not give.
func readThresholds(h gonvml.Device) (slowdown, shutdown int) {
	if v, ret := h.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN); ret == gonvml.SUCCESS {
		slowdown = int(v)
	}
	if v, ret := h.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SHUTDOWN); ret == gonvml.SUCCESS {
		shutdown = int(v)
	}
	return slowdown, shutdown
}

// handle is GPU i's handle now.
func (m *Monitor) handle(i int) gonvml.Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handles[i]
}

// Rebind looks GPU i up again by its UUID and reads it through the new
// handle from now on: NVML's handles are not valid after the GPU was
// removed and rediscovered (Reset). WatchEvents registers the new handle
// for events at its next turn, since the removal dropped the old one's.
// Any goroutine may call it: Sample reads the GPU's thresholds again
// through the new handle at its next call.
func (m *Monitor) Rebind(i int) error {
	h, ret := m.lib.DeviceGetHandleByUUID(m.uuids[i])
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("looking GPU %s up again: %w", m.uuids[i], ret)
	}
	m.mu.Lock()
	m.handles[i] = h
	m.mu.Unlock()
	m.stale[i].Store(true)
	select {
	case m.rebound <- i:
	default: // already queued: WatchEvents reads the handle afresh
	}
	return nil
}

// GPUs is the number of GPUs monitored.
func (m *Monitor) GPUs() int { return len(m.handles) }

// Sample reads GPU i's signals, one NVML call each, so a poll of a whole
// node stays cheap. Each read stands alone: one failing leaves the others
// valid. After a GPU_IS_LOST answer the rest are not tried.
func (m *Monitor) Sample(i int) Sample {
	s := Sample{MIGEnabled: m.mig[i]}
	if m.off[i]&SignalTemperature == 0 {
		if m.stale[i].Swap(false) || m.slowdown[i] == 0 {
			m.readThresholds(i)
		}
		s.SlowdownC, s.ShutdownC = m.slowdown[i], m.shutdown[i]
	}
	unsupported := readSignals(m.handle(i), m.syms, m.off[i], &s)
	for _, sig := range []Signal{SignalTemperature, SignalClockReasons, SignalRecoveryAction, SignalRemappedRows} {
		if unsupported&sig != 0 {
			// vGPU guests and some SKUs: the signal says nothing here.
			m.off[i] |= sig
			m.log.Info("GPU does not support this health signal; its check is off for this GPU", "device", m.uuids[i], "signal", sig.String())
		}
	}
	s.Unsupported = m.off[i]
	return s
}

// readSignals reads every signal not in off from h into s, one NVML call
// each, and sets s.Failed, s.Lost and s.Err. It returns the signals h
// answered NOT_SUPPORTED to, leaving s.Unsupported to the caller. The
// thresholds in s are the caller's too.
func readSignals(h gonvml.Device, syms Symbols, off Signal, s *Sample) (unsupported Signal) {
	var errs []error
	for _, sig := range []Signal{SignalTemperature, SignalClockReasons, SignalRecoveryAction, SignalRemappedRows} {
		if off&sig != 0 {
			continue
		}
		if s.Lost {
			s.Failed |= sig
			continue
		}
		switch ret := readSignal(h, syms, sig, s); ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_NOT_SUPPORTED:
			unsupported |= sig
		default:
			s.Failed |= sig
			s.Lost = ret == gonvml.ERROR_GPU_IS_LOST
			errs = append(errs, fmt.Errorf("reading %s: %w", sig, ret))
		}
	}
	s.Err = errors.Join(errs...)
	return unsupported
}

// readSignal reads one signal of the GPU h into s.
func readSignal(h gonvml.Device, syms Symbols, sig Signal, s *Sample) gonvml.Return {
	switch sig {
	case SignalTemperature:
		if syms.Has(symTemperatureV) {
			t, ret := h.GetTemperatureV().V1()
			s.TempC = int(t.Temperature)
			return ret
		}
		t, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU)
		s.TempC = int(t)
		return ret
	case SignalClockReasons:
		var ret gonvml.Return
		if syms.Has(symClocksEventReasons) {
			s.Reasons, ret = h.GetCurrentClocksEventReasons()
		} else {
			s.Reasons, ret = h.GetCurrentClocksThrottleReasons()
		}
		return ret
	case SignalRecoveryAction:
		v := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
		if ret := h.GetFieldValues(v); ret != gonvml.SUCCESS {
			return ret
		}
		switch ret := gonvml.Return(v[0].NvmlReturn); ret {
		case gonvml.SUCCESS:
			s.RecoveryAction = RecoveryAction(fieldUint(v[0]))
			return ret
		case gonvml.ERROR_INVALID_ARGUMENT:
			// A driver older than the field (R550) does not know its id.
			return gonvml.ERROR_NOT_SUPPORTED
		default:
			return ret
		}
	case SignalRemappedRows:
		_, _, pending, failure, ret := h.GetRemappedRows()
		s.RowRemapPending, s.RowRemapFailure = pending, failure
		return ret
	}
	return gonvml.ERROR_INVALID_ARGUMENT
}

// register registers GPU i's handle in set for the events the health
// watcher reads; false, logged, when it cannot (the GPU is left to polling).
func (m *Monitor) register(set gonvml.EventSet, byHandle map[gonvml.Device]int, i int) bool {
	h := m.handle(i)
	byHandle[h] = i
	supported, ret := h.GetSupportedEventTypes()
	if ret != gonvml.SUCCESS {
		m.log.Warn("reading supported NVML events; GPU left to polling", "index", i, "reason", ret.Error())
		return false
	}
	mask := supported & (gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypeGpuRecoveryAction)
	if mask == 0 {
		m.log.Warn("GPU reports no XID or ECC events; left to polling", "index", i)
		return false
	}
	if ret := h.RegisterEvents(mask, set); ret != gonvml.SUCCESS {
		m.log.Warn("registering NVML events; GPU left to polling", "index", i, "reason", ret.Error())
		return false
	}
	return true
}

// registerRebound registers the GPUs Rebind gave a new handle since the
// last turn, and forgets their old handles.
func (m *Monitor) registerRebound(set gonvml.EventSet, byHandle map[gonvml.Device]int) {
	for {
		select {
		case i := <-m.rebound:
			for h, j := range byHandle {
				if j == i {
					delete(byHandle, h)
				}
			}
			if m.register(set, byHandle, i) {
				m.log.Info("watching NVML events again for a GPU looked up anew", "device", m.uuids[i])
			}
		default:
			return
		}
	}
}

// noInstance is what NVML puts in an event's instance ids when the
// event is not about one MIG instance (0xFFFFFFFF).
const noInstance = ^uint32(0)

// eventInstance names the MIG instance an XID on a MIG-mode GPU arrived
// for: nil for the whole GPU, ComputeInstance -1 for every compute
// instance of the GPU instance.
func eventInstance(gi, ci uint32) *Instance {
	if gi == noInstance {
		return nil
	}
	in := &Instance{GPUInstance: int(gi), ComputeInstance: -1}
	if ci != noInstance {
		in.ComputeInstance = int(ci)
	}
	return in
}

// fieldUint decodes an integer field value by its type.
func fieldUint(v gonvml.FieldValue) uint64 {
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT, gonvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(v.Value[:4]))
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(v.Value[:2]))
	default:
		return binary.NativeEndian.Uint64(v.Value[:])
	}
}

// WatchEvents sends XID, double-bit ECC and recovery-action events to out
// until ctx ends. An XID on a MIG instance arrives on its parent GPU, with
// Event.MIG naming the instance.
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
	for i := range m.handles {
		if m.register(set, byHandle, i) {
			registered++
		}
	}
	if registered == 0 && len(m.handles) > 0 {
		return errors.New("no GPU could register for NVML events")
	}
	// From here an XID reaches the health watcher; one before is lost,
	// as NVML keeps no event for a set made later.
	m.log.Info("watching NVML events (XIDs, double-bit ECC, recovery actions)", "gpus", registered)
	waitMs := uint32(m.eventWait / time.Millisecond)
	failures := 0
	for ctx.Err() == nil {
		m.registerRebound(set, byHandle)
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
			if m.mig[i] {
				ev.MIG = eventInstance(data.GpuInstanceId, data.ComputeInstanceId)
			}
		case data.EventType&gonvml.EventTypeDoubleBitEccError != 0:
			ev.Kind = EventDoubleBitECC
		case data.EventType&gonvml.EventTypeGpuRecoveryAction != 0:
			ev.Kind = EventRecoveryAction
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

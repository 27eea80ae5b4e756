package nvml

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// What a GPU's reset reaches: its processes, then NVML's drain states
// ("Drain states" in nvml.h: drain, remove, rediscover). All are in R470,
// but a library that lacks one would kill the process at the first call
// (go-nvml binds lazily), so a Resetter looks them up first.
const (
	symComputeProcs    = "nvmlDeviceGetComputeRunningProcesses" // and _v2 (R450), _v3 (R510): go-nvml calls the newest
	symComputeProcsV2  = "nvmlDeviceGetComputeRunningProcesses_v2"
	symComputeProcsV3  = "nvmlDeviceGetComputeRunningProcesses_v3"
	symGraphicsProcs   = "nvmlDeviceGetGraphicsRunningProcesses"
	symGraphicsProcsV2 = "nvmlDeviceGetGraphicsRunningProcesses_v2"
	symGraphicsProcsV3 = "nvmlDeviceGetGraphicsRunningProcesses_v3"
	symModifyDrain     = "nvmlDeviceModifyDrainState"
	symQueryDrain      = "nvmlDeviceQueryDrainState"
	symRemoveGpu       = "nvmlDeviceRemoveGpu"    // R384's, without the detach and link arguments
	symRemoveGpuV2     = "nvmlDeviceRemoveGpu_v2" // preferred where exported
	symDiscoverGpus    = "nvmlDeviceDiscoverGpus"
)

// resetSymbols are looked up with the optional ones, but are not logged at
// discovery: only a reset needs them.
func resetSymbols() []string {
	return []string{
		symComputeProcs, symComputeProcsV2, symComputeProcsV3, symGraphicsProcs, symGraphicsProcsV2, symGraphicsProcsV3,
		symModifyDrain, symQueryDrain, symRemoveGpu, symRemoveGpuV2, symDiscoverGpus,
	}
}

// hasProcesses reports whether go-nvml has a version of both process calls to bind.
func (s Symbols) hasProcesses() bool {
	return (s.Has(symComputeProcs) || s.Has(symComputeProcsV2) || s.Has(symComputeProcsV3)) &&
		(s.Has(symGraphicsProcs) || s.Has(symGraphicsProcsV2) || s.Has(symGraphicsProcsV3))
}

// missingForReset names the functions a reset needs that the library lacks.
func (s Symbols) missingForReset() []string {
	var out []string
	if !s.hasProcesses() {
		out = append(out, symComputeProcs+" or "+symGraphicsProcs)
	}
	for _, name := range []string{symModifyDrain, symQueryDrain, symDiscoverGpus} {
		if !s.Has(name) {
			out = append(out, name)
		}
	}
	if !s.Has(symRemoveGpu) && !s.Has(symRemoveGpuV2) {
		out = append(out, symRemoveGpuV2)
	}
	return out
}

var (
	// ErrProcessesUnknown means NVML cannot list the processes on the GPU
	// (it answers NOT_SUPPORTED or NO_PERMISSION: asking again will not
	// help). The GPU is not known to be idle.
	ErrProcessesUnknown = errors.New("NVML cannot list the processes on this GPU")
	// ErrBusy means processes run on the GPU, so it cannot be reset now.
	ErrBusy = errors.New("processes are running on the GPU")
	// ErrResetUnsupported means NVML cannot reset this GPU: the library
	// lacks a function, or the GPU answers NOT_SUPPORTED to drain states
	// (a vGPU guest).
	ErrResetUnsupported = errors.New("NVML cannot reset this GPU")
)

// Process is one process with a compute or graphics context on a GPU.
type Process struct {
	PID             uint32
	UsedMemoryBytes uint64
}

// Resetter lists what runs on a GPU, resets it the NVML way (drain,
// remove, rediscover) and reads what it says afterwards. It holds no
// state but the library and which functions it has; a caller decides when
// to call it. Resetting needs root.
type Resetter struct {
	lib  Library
	syms Symbols
}

// NewResetter looks up the functions a reset needs, once.
func NewResetter(lib Library) *Resetter {
	return &Resetter{lib: lib, syms: CheckSymbols(lib)}
}

// Processes lists the processes with a compute or graphics context on the
// GPU with uuid, each once (a process with both is listed once, with the
// larger memory figure), by PID. An error means the caller does not know
// whether the GPU is idle; ErrProcessesUnknown says NVML will not tell.
func (r *Resetter) Processes(uuid string) ([]Process, error) {
	if !r.syms.hasProcesses() {
		return nil, fmt.Errorf("GPU %s: %w: the NVML library lacks %s", uuid, ErrProcessesUnknown, symComputeProcs)
	}
	h, ret := r.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	return processes(h, uuid)
}

func processes(h gonvml.Device, uuid string) ([]Process, error) {
	byPID := map[uint32]uint64{}
	for _, list := range []struct {
		kind string
		get  func() ([]gonvml.ProcessInfo, gonvml.Return)
	}{{"compute", h.GetComputeRunningProcesses}, {"graphics", h.GetGraphicsRunningProcesses}} {
		infos, ret := list.get()
		switch ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_NO_PERMISSION:
			return nil, fmt.Errorf("GPU %s: listing %s processes: %w: %w", uuid, list.kind, ErrProcessesUnknown, ret)
		default:
			return nil, fmt.Errorf("GPU %s: listing %s processes: %w", uuid, list.kind, ret)
		}
		for _, p := range infos {
			byPID[p.Pid] = max(byPID[p.Pid], p.UsedGpuMemory)
		}
	}
	out := make([]Process, 0, len(byPID))
	for pid, mem := range byPID {
		out = append(out, Process{PID: pid, UsedMemoryBytes: mem})
	}
	slices.SortFunc(out, func(a, b Process) int { return int(a.PID) - int(b.PID) })
	return out, nil
}

// ResetStep is the step of a reset an error comes from.
type ResetStep string

const (
	StepCheck    ResetStep = "check"    // before anything changed: the GPU, its processes, the library
	StepDrain    ResetStep = "drain"    // nvmlDeviceModifyDrainState on
	StepRemove   ResetStep = "remove"   // nvmlDeviceRemoveGpu
	StepDiscover ResetStep = "discover" // nvmlDeviceDiscoverGpus
	StepReturn   ResetStep = "return"   // the GPU back with its UUID, drain state off
)

// GPUState is how a failed reset left the GPU.
type GPUState string

const (
	// LeftInService: as before the reset, drain state off.
	LeftInService GPUState = "in service"
	// LeftDraining: drain state on; turning it off failed.
	LeftDraining GPUState = "draining"
	// LeftRemoved: out of NVML's and the driver's view until a
	// rediscovery succeeds (or the node reboots).
	LeftRemoved GPUState = "removed"
	// LeftUnknown: rediscovery answered but NVML does not show the GPU
	// as it should; look at it (nvidia-smi) before trusting it.
	LeftUnknown GPUState = "unknown"
)

// ResetError says which step of a reset failed and how the GPU was left.
// It wraps the cause: ErrBusy, ErrProcessesUnknown, ErrResetUnsupported,
// or NVML's Return (gonvml.ERROR_NO_PERMISSION without root).
type ResetError struct {
	UUID, PCIBusID string
	Step           ResetStep
	Left           GPUState
	Err            error
}

func (e *ResetError) Error() string {
	return fmt.Sprintf("resetting GPU %s (%s): %s: %v; the GPU is left %s", e.UUID, e.PCIBusID, e.Step, e.Err, e.Left)
}

func (e *ResetError) Unwrap() error { return e.Err }

// Reset resets gpu (by its PCIBusID, checked against its UUID) the way
// NVML offers: drain state on, remove the GPU from NVML's and the
// driver's view, rediscover it (the driver initialises it again and
// scrubs its memory), then check it is back with the same UUID and its
// drain state off. It needs root, persistence mode off, and no process on
// the GPU: while one runs (or NVML cannot list them) it refuses and
// changes nothing. Every error is a *ResetError naming the step that
// failed and how the GPU was left; a step that fails after the drain
// state went on turns it off again where the GPU is still there.
//
// ctx is checked before each step that changes something until the GPU
// is removed; from there Reset always tries to bring it back.
//
// After Reset, every handle held to the GPU is stale (nvml.h: handles are
// not guaranteed valid after a rediscovery) and its event registrations
// are gone, and NVML indices may have changed meanwhile: look the GPU up
// again by UUID (Monitor.Rebind for a monitored GPU, which also registers
// it for events again), never by index. Its MIG instances are gone (MIG
// mode stays) and its compute mode is the default: compare with what
// Verify read before the reset, and recreate what is wanted.
func (r *Resetter) Reset(ctx context.Context, gpu GPU) error {
	fail := func(step ResetStep, left GPUState, err error) error {
		return &ResetError{UUID: gpu.UUID, PCIBusID: gpu.PCIBusID, Step: step, Left: left, Err: err}
	}
	if missing := r.syms.missingForReset(); len(missing) > 0 {
		return fail(StepCheck, LeftInService, fmt.Errorf("%w: the NVML library lacks %s", ErrResetUnsupported, strings.Join(missing, ", ")))
	}
	if err := ctx.Err(); err != nil {
		return fail(StepCheck, LeftInService, err)
	}
	h, pci, err := r.lookUp(gpu)
	if err != nil {
		return fail(StepCheck, LeftInService, err)
	}
	procs, err := processes(h, gpu.UUID)
	if err != nil {
		return fail(StepCheck, LeftInService, err)
	}
	if len(procs) > 0 {
		return fail(StepCheck, LeftInService, fmt.Errorf("%w: PIDs %s", ErrBusy, pids(procs)))
	}

	if ret := r.lib.DeviceModifyDrainState(&pci, gonvml.FEATURE_ENABLED); ret != gonvml.SUCCESS {
		err := fmt.Errorf("setting drain state on: %w", ret)
		switch ret {
		case gonvml.ERROR_NOT_SUPPORTED:
			err = fmt.Errorf("%w: %w", ErrResetUnsupported, err)
		case gonvml.ERROR_IN_USE:
			err = fmt.Errorf("%w (is persistence mode on?)", err)
		}
		return fail(StepDrain, LeftInService, err)
	}
	// undrain turns the drain state off again after a step failed.
	undrain := func(step ResetStep, err error) error {
		if ret := r.lib.DeviceModifyDrainState(&pci, gonvml.FEATURE_DISABLED); ret != gonvml.SUCCESS {
			return fail(step, LeftDraining, fmt.Errorf("%w; setting drain state off again: %w", err, ret))
		}
		return fail(step, LeftInService, err)
	}
	if err := ctx.Err(); err != nil {
		return undrain(StepDrain, err)
	}

	var ret gonvml.Return
	if r.syms.Has(symRemoveGpuV2) {
		// The PCI device stays in the OS and its link up: the driver lets
		// go of the GPU and takes it again at rediscovery.
		ret = r.lib.DeviceRemoveGpu_v2(&pci, gonvml.DETACH_GPU_KEEP, gonvml.PCIE_LINK_KEEP)
	} else {
		ret = r.lib.DeviceRemoveGpu(&pci)
	}
	if ret != gonvml.SUCCESS {
		err := fmt.Errorf("removing the GPU: %w", ret)
		if ret == gonvml.ERROR_IN_USE {
			// A process attached since the check, or something holds the GPU.
			err = fmt.Errorf("%w: %w", ErrBusy, err)
		}
		return undrain(StepRemove, err)
	}

	if _, ret := r.lib.DeviceDiscoverGpus(); ret != gonvml.SUCCESS {
		return fail(StepDiscover, LeftRemoved, fmt.Errorf("rediscovering GPUs: %w", ret))
	}
	_, back, err := r.lookUp(gpu)
	if err != nil {
		left := LeftUnknown
		if errors.Is(err, gonvml.ERROR_NOT_FOUND) {
			left = LeftRemoved
		}
		return fail(StepReturn, left, fmt.Errorf("after rediscovery: %w", err))
	}
	state, ret := r.lib.DeviceQueryDrainState(&back)
	if ret != gonvml.SUCCESS {
		return fail(StepReturn, LeftUnknown, fmt.Errorf("reading the drain state after rediscovery: %w", ret))
	}
	if state == gonvml.FEATURE_ENABLED {
		pci = back
		return undrain(StepReturn, errors.New("the GPU came back draining"))
	}
	return nil
}

// lookUp finds gpu by UUID and checks it is at gpu's PCI address; it
// returns its handle and PCI info, as the drain-state calls take it.
func (r *Resetter) lookUp(gpu GPU) (gonvml.Device, gonvml.PciInfo, error) {
	h, ret := r.lib.DeviceGetHandleByUUID(gpu.UUID)
	if ret != gonvml.SUCCESS {
		return nil, gonvml.PciInfo{}, fmt.Errorf("looking GPU %s up: %w", gpu.UUID, ret)
	}
	pci, ret := h.GetPciInfo()
	if ret != gonvml.SUCCESS {
		return nil, gonvml.PciInfo{}, fmt.Errorf("reading the PCI address of GPU %s: %w", gpu.UUID, ret)
	}
	addr, err := sysfs.PCIAddress(cString(pci.BusId[:]))
	if err != nil {
		return nil, gonvml.PciInfo{}, fmt.Errorf("reading the PCI address of GPU %s: %w", gpu.UUID, err)
	}
	if want, err := sysfs.PCIAddress(gpu.PCIBusID); err != nil || addr != want {
		return nil, gonvml.PciInfo{}, fmt.Errorf("GPU %s is at %s, not %q", gpu.UUID, addr, gpu.PCIBusID)
	}
	return h, pci, nil
}

func pids(procs []Process) string {
	s := make([]string, len(procs))
	for i, p := range procs {
		s[i] = fmt.Sprint(p.PID)
	}
	return strings.Join(s, ",")
}

// ComputeMode is a GPU's compute mode; the values are NVML's.
type ComputeMode int

const (
	ComputeDefault          = ComputeMode(gonvml.COMPUTEMODE_DEFAULT)
	ComputeProhibited       = ComputeMode(gonvml.COMPUTEMODE_PROHIBITED)
	ComputeExclusiveProcess = ComputeMode(gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
)

func (c ComputeMode) String() string {
	switch c {
	case ComputeDefault:
		return "default"
	case ComputeProhibited:
		return "prohibited"
	case ComputeExclusiveProcess:
		return "exclusive-process"
	}
	return fmt.Sprintf("compute-mode-%d", int(c))
}

// Condition is what NVML says of a GPU now, for telling whether a reset
// left it clean, and for saving before one what a reset puts back to its
// default. Plain values; Faults says which of them are not clean.
type Condition struct {
	// Sample is the health signals, read as the Monitor reads them, with
	// MIGEnabled read now.
	Sample
	// MIGCapable is false for a GPU that cannot do MIG (or a driver
	// before MIG); MIGEnabled is then false too.
	MIGCapable bool
	// ComputeMode is the GPU's; a reset puts it back to ComputeDefault.
	ComputeMode ComputeMode
	// Draining is the GPU's drain state, on: a reset turns it off again,
	// so one left on is a reset that stopped midway (its caller killed
	// before the removal). False where NVML has no drain states.
	Draining bool
}

// Faults lists what keeps the condition from being clean, in the health
// reasons' words: "recovery-action=reset", "row-remap-pending",
// "row-remap-failure", "thermal=91C>=slowdown 90C", "hw-slowdown",
// "hw-thermal-slowdown", "hw-power-brake", "drain-state=on", "gpu-lost",
// "unread: <signals>".
// A signal the GPU does not support is no fault. Empty means clean; the
// compute and MIG modes are the caller's to compare.
func (c Condition) Faults() []string {
	var out []string
	if c.Lost {
		return []string{"gpu-lost"}
	}
	if c.Failed != 0 {
		out = append(out, "unread: "+c.Failed.String())
	}
	if c.Draining {
		out = append(out, "drain-state=on")
	}
	if c.Has(SignalRecoveryAction) && c.RecoveryAction != RecoveryNone {
		out = append(out, "recovery-action="+c.RecoveryAction.String())
	}
	if c.Has(SignalRemappedRows) && c.RowRemapPending {
		out = append(out, "row-remap-pending")
	}
	if c.Has(SignalRemappedRows) && c.RowRemapFailure {
		out = append(out, "row-remap-failure")
	}
	if c.Has(SignalTemperature) && c.SlowdownC > 0 && c.TempC >= c.SlowdownC {
		out = append(out, fmt.Sprintf("thermal=%dC>=slowdown %dC", c.TempC, c.SlowdownC))
	}
	if c.Has(SignalClockReasons) {
		for _, r := range []struct {
			bit  uint64
			name string
		}{{ReasonHWSlowdown, "hw-slowdown"}, {ReasonHWThermalSlowdown, "hw-thermal-slowdown"}, {ReasonHWPowerBrake, "hw-power-brake"}} {
			if c.Reasons&r.bit != 0 {
				out = append(out, r.name)
			}
		}
	}
	return out
}

// Condition reads the GPU with uuid: its health signals (one read each, as
// the Monitor reads them), its MIG mode, its compute mode and its drain
// state. Read once
// before a reset to save the modes, and after it to see whether the GPU is
// clean (Condition.Faults) and as it was. An error means the GPU could
// not be looked up or its modes not read; a signal that fails to read is
// in Sample.Failed.
func (r *Resetter) Condition(uuid string) (Condition, error) {
	h, ret := r.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return Condition{}, fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	var c Condition
	off := unsupportedByDriver(r.syms)
	if off&SignalTemperature == 0 {
		c.SlowdownC, c.ShutdownC = readThresholds(h)
	}
	c.Unsupported = off | readSignals(h, r.syms, off, &c.Sample)
	if c.Lost {
		return c, nil
	}
	mode, ret := h.GetComputeMode()
	if ret != gonvml.SUCCESS {
		return c, fmt.Errorf("GPU %s: reading its compute mode: %w", uuid, ret)
	}
	c.ComputeMode = ComputeMode(mode)
	if r.syms.Has(symMigMode) {
		cur, _, ret := h.GetMigMode()
		switch ret {
		case gonvml.SUCCESS:
			c.MIGCapable, c.MIGEnabled = true, cur == gonvml.DEVICE_MIG_ENABLE
		case gonvml.ERROR_NOT_SUPPORTED:
		default:
			return c, fmt.Errorf("GPU %s: reading its MIG mode: %w", uuid, ret)
		}
	}
	if r.syms.Has(symQueryDrain) {
		pci, ret := h.GetPciInfo()
		if ret != gonvml.SUCCESS {
			return c, fmt.Errorf("GPU %s: reading its PCI address: %w", uuid, ret)
		}
		state, ret := r.lib.DeviceQueryDrainState(&pci)
		switch ret {
		case gonvml.SUCCESS:
			c.Draining = state == gonvml.FEATURE_ENABLED
		case gonvml.ERROR_NOT_SUPPORTED: // a vGPU guest
		default:
			return c, fmt.Errorf("GPU %s: reading its drain state: %w", uuid, ret)
		}
	}
	return c, nil
}

// unsupportedByDriver are the signals whose functions the library lacks.
func unsupportedByDriver(syms Symbols) Signal {
	var off Signal
	if !syms.Has(symTemperatureV) && !syms.Has(symTemperature) {
		off |= SignalTemperature
	}
	if !syms.Has(symClocksEventReasons) && !syms.Has(symClocksThrottleReasons) {
		off |= SignalClockReasons
	}
	if !syms.Has(symFieldValues) {
		off |= SignalRecoveryAction
	}
	if !syms.Has(symRemappedRows) {
		off |= SignalRemappedRows
	}
	return off
}

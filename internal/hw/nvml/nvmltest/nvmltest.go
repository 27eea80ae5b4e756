// Package nvmltest builds go-nvml mock servers that nvml.Discover can walk
// end to end, for tests here and in packages that consume an Inventory.
//
// go-nvml's dgxa100 mock leaves most hooks nil (calling one panics) and gives
// every GPU an empty PCI bus id; NewDGXA100 fills in what discovery needs.
package nvmltest

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

const (
	// LinksPerGPU is how many NVLinks each A100 has, all to NVSwitches.
	LinksPerGPU = 12
	// Switches is the number of NVSwitches on the board; each GPU has
	// LinksPerGPU/Switches links to each.
	Switches = 6
)

// GPUAddress returns the canonical PCI address of mock GPU i (0..7), the
// form sysfs uses: "0000:07:00.0" for GPU 0.
func GPUAddress(i int) string {
	buses := [8]int{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd}
	return fmt.Sprintf("0000:%02x:00.0", buses[i])
}

// SwitchAddress returns the canonical PCI address of mock NVSwitch s (0..5).
func SwitchAddress(s int) string {
	return fmt.Sprintf("0000:%02x:00.0", 0xc4+s)
}

// PciInfo returns PCI info whose BusId holds addr as NVML writes it: an
// 8-digit domain, upper case, NUL-padded.
func PciInfo(addr string) gonvml.PciInfo {
	var domain, bus, dev, fn uint32
	if _, err := fmt.Sscanf(addr, "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err != nil {
		panic(fmt.Sprintf("nvmltest.PciInfo(%q): %v", addr, err))
	}
	p := gonvml.PciInfo{Domain: domain, Bus: bus, Device: dev, PciDeviceId: 0x20b010de}
	id := fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, dev, fn)
	for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(id[i])
	}
	return p
}

// Device returns mock GPU i of s, to override its hooks.
func Device(s *dgxa100.Server, i int) *dgxa100.Device {
	return s.Devices[i].(*dgxa100.Device)
}

// NewDGXA100 returns a mock DGX A100: eight GPUs at distinct PCI addresses
// (GPUAddress), GPUs 0-3 on NUMA node 0 and 4-7 on node 1 as NVML reports
// it, pairs (0,1), (2,3)... behind a common PCIe switch tree, other GPUs on
// the same node across host bridges, and LinksPerGPU NVLinks from every GPU
// spread over Switches NVSwitches, so every pair talks over NVLink.
//
// The library exports every optional NVML function except
// nvmlDeviceGetTemperatureV, nvmlDeviceGetGpuInstanceProfileInfoV and
// nvmlDeviceGetGpuFabricInfoV: go-nvml's TemperatureHandler,
// GpuInstanceProfileInfoHandler and GpuFabricInfoHandler call C directly and
// cannot be mocked, so temperature goes through GetTemperature, profile info
// through GetGpuInstanceProfileInfo and fabric info through
// GetGpuFabricInfo (NOT_SUPPORTED, as outside an NVLink domain, until
// WithFabric).
// WithoutSymbols takes more away, as an older driver would. MIG is off;
// WithMIG turns it on with MIG devices.
func NewDGXA100() *dgxa100.Server {
	s := dgxa100.New()
	s.ErrorStringFunc = func(r gonvml.Return) string { return r.Error() }
	WithoutSymbols(s)
	for i := range s.Devices {
		d := Device(s, i)
		d.PciBusID = GPUAddress(i)
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			return PciInfo(GPUAddress(i)), gonvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, gonvml.Return) {
			return i / 4, gonvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
			o, ok := other.(*dgxa100.Device)
			if !ok {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			switch j := o.Index; {
			case i == j:
				return gonvml.TOPOLOGY_INTERNAL, gonvml.SUCCESS
			case i/2 == j/2:
				return gonvml.TOPOLOGY_MULTIPLE, gonvml.SUCCESS
			case i/4 == j/4:
				return gonvml.TOPOLOGY_NODE, gonvml.SUCCESS
			default:
				return gonvml.TOPOLOGY_SYSTEM, gonvml.SUCCESS
			}
		}
		d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link < 0 || link >= LinksPerGPU {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			if link < 0 || link >= LinksPerGPU {
				return gonvml.PciInfo{}, gonvml.ERROR_INVALID_ARGUMENT
			}
			return PciInfo(SwitchAddress(link / (LinksPerGPU / Switches))), gonvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
		}
		// A cool, unthrottled GPU with the A100's thresholds.
		d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			return 40, gonvml.SUCCESS
		}
		d.GetTemperatureThresholdFunc = func(t gonvml.TemperatureThresholds) (uint32, gonvml.Return) {
			switch t {
			case gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
				return SlowdownC, gonvml.SUCCESS
			case gonvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
				return ShutdownC, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
			return 0, gonvml.SUCCESS
		}
		d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) {
			return d.GetCurrentClocksEventReasonsFunc()
		}
		// No recovery action, no remapped rows pending or failed.
		d.GetFieldValuesFunc = RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction { return gonvml.GPU_RECOVERY_ACTION_NONE })
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) {
			return 0, 0, false, false, gonvml.SUCCESS
		}
		mode := gonvml.COMPUTEMODE_DEFAULT
		d.SetComputeModeFunc = func(m gonvml.ComputeMode) gonvml.Return { mode = m; return gonvml.SUCCESS }
		d.GetComputeModeFunc = func() (gonvml.ComputeMode, gonvml.Return) { return mode, gonvml.SUCCESS }
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
			return gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypeSingleBitEccError | gonvml.EventTypeGpuRecoveryAction, gonvml.SUCCESS
		}
		d.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return {
			return gonvml.SUCCESS
		}
		d.GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) {
			return gonvml.GpuFabricInfo{}, gonvml.ERROR_NOT_SUPPORTED
		}
		// Bare metal.
		d.GetVirtualizationModeFunc = func() (gonvml.GpuVirtualizationMode, gonvml.Return) {
			return gonvml.GPU_VIRTUALIZATION_MODE_NONE, gonvml.SUCCESS
		}
		// Nothing runs on it (SetProcesses).
		SetProcesses(s, i, nil, nil)
		// MIG off; a GPU put in MIG mode has no instances until WithMIG.
		WithMIG(s, i)
		d.MigMode = gonvml.DEVICE_MIG_DISABLE
	}
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) { return gonvml.EventData{}, gonvml.ERROR_TIMEOUT },
			FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
		}, gonvml.SUCCESS
	}
	return s
}

// WithoutSymbols makes the library of s lack the named NVML functions, as
// an older driver would, besides the two NewDGXA100 names. Call it before
// Discover, which checks symbols once.
func WithoutSymbols(s *dgxa100.Server, names ...string) {
	missing := map[string]bool{"nvmlDeviceGetTemperatureV": true, "nvmlDeviceGetGpuInstanceProfileInfoV": true, "nvmlDeviceGetGpuFabricInfoV": true}
	for _, n := range names {
		missing[n] = true
	}
	s.LookupSymbolFunc = func(name string) error {
		if missing[name] {
			return fmt.Errorf("%s: undefined symbol", name)
		}
		return nil
	}
}

// R470Symbols are the optional functions a R470 driver lacks.
func R470Symbols() []string {
	return []string{"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetTemperatureV",
		"nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"}
}

// WithFabric makes GPU i answer fabric info as NVML's first fabric call
// does: info, or ret when it is not SUCCESS.
func WithFabric(s *dgxa100.Server, i int, info gonvml.GpuFabricInfo, ret gonvml.Return) {
	Device(s, i).GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) { return info, ret }
}

// RecoveryActionValues returns a GetFieldValues hook that reports the
// recovery action that action returns (called at each read, so a test can change it)
// and NOT_SUPPORTED for every other field.
func RecoveryActionValues(action func() gonvml.DeviceGpuRecoveryAction) func([]gonvml.FieldValue) gonvml.Return {
	return func(values []gonvml.FieldValue) gonvml.Return {
		for k := range values {
			values[k].NvmlReturn = uint32(gonvml.ERROR_NOT_SUPPORTED)
			if values[k].FieldId == gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				values[k].NvmlReturn = uint32(gonvml.SUCCESS)
				values[k].ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_INT)
				binary.NativeEndian.PutUint32(values[k].Value[:4], uint32(action()))
			}
		}
		return gonvml.SUCCESS
	}
}

// Thresholds every mock GPU reports.
const (
	SlowdownC = 90
	ShutdownC = 95
)

// WithEvents makes the event sets of s deliver what the test sends on the
// returned channel; a wait with nothing sent times out as NVML's does.
func WithEvents(s *dgxa100.Server) chan<- gonvml.EventData {
	ch := make(chan gonvml.EventData, 16)
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
				select {
				case ev := <-ch:
					return ev, gonvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
		}, gonvml.SUCCESS
	}
	return ch
}

// MIG describes one mock MIG device for WithMIG.
type MIG struct {
	// UUID is the device's; empty gives "MIG-<parent UUID>-<gi>-<ci>".
	UUID                         string
	GPUInstance, ComputeInstance int
	// GISlices and CISlices are the slice counts of the GPU and compute
	// instance; CISlices 0 means the whole GPU instance.
	GISlices, CISlices int
	// MemoryMiB is the device's memory as NVML's attributes report it.
	MemoryMiB       uint64
	Multiprocessors int
	// GIProfile is the GPU instance's NVML profile index
	// (gonvml.GPU_INSTANCE_PROFILE_*); its GPU instance reports the
	// profile's ID, GIProfileIDs[GIProfile].
	GIProfile int
}

// GIProfileIDs are the GPU instance profile IDs of every mock GPU by NVML
// profile index (gonvml.GPU_INSTANCE_PROFILE_*), as GetGpuInstanceProfileInfo
// answers: an A100's or H100's where it has the profile (nvidia-smi mig
// -lgip), stand-ins past every index for the others. As on a real GPU, IDs
// are not indices, and some equal another profile's index.
var GIProfileIDs = map[int]uint32{
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE:      19,
	gonvml.GPU_INSTANCE_PROFILE_2_SLICE:      14,
	gonvml.GPU_INSTANCE_PROFILE_3_SLICE:      9,
	gonvml.GPU_INSTANCE_PROFILE_4_SLICE:      5,
	gonvml.GPU_INSTANCE_PROFILE_7_SLICE:      0,
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15,
	// Stand-ins.
	gonvml.GPU_INSTANCE_PROFILE_8_SLICE:        40,
	gonvml.GPU_INSTANCE_PROFILE_6_SLICE:        41,
	gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   42,
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    43,
	gonvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    44,
	gonvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    45,
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  46,
	gonvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  47,
	gonvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: 48,
	gonvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: 49,
	gonvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    50,
}

// MemoryH100 and MemoryA100 are the total memory NVML reports for an
// H100 80GB (81559 MiB) and an A100 40GB (40 GiB, as go-nvml's mock has it).
const (
	MemoryH100 = 81559 << 20
	MemoryA100 = 40 << 30
)

// WithMIG puts mock GPU i of s in MIG mode with migs at MIG device
// indices 0, 1, ...; a nil entry is an empty slot (NOT_FOUND), as are the
// slots past the list up to seven. It returns the MIG device handles, nil
// for empty slots, so a test can override their hooks. Without WithMIG a
// mock GPU put in MIG mode has seven empty slots.
func WithMIG(s *dgxa100.Server, i int, migs ...*MIG) []*mock.Device {
	d := Device(s, i)
	d.MigMode = gonvml.DEVICE_MIG_ENABLE
	handles := make([]*mock.Device, len(migs))
	profiles := map[int]int{}
	for k, m := range migs {
		if m == nil {
			continue
		}
		profiles[m.GPUInstance] = m.GIProfile
		handles[k] = MIGHandle(d, m)
	}
	slots := max(7, len(migs))
	d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return slots, gonvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(idx int) (gonvml.Device, gonvml.Return) {
		switch {
		case idx < 0 || idx >= slots:
			return nil, gonvml.ERROR_INVALID_ARGUMENT
		case idx >= len(handles) || handles[idx] == nil:
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return handles[idx], gonvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(gi int) (gonvml.GpuInstance, gonvml.Return) {
		index, ok := profiles[gi]
		if !ok {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return &mock.GpuInstance{
			GetInfoFunc: func() (gonvml.GpuInstanceInfo, gonvml.Return) {
				return gonvml.GpuInstanceInfo{Device: d, Id: uint32(gi), ProfileId: GIProfileIDs[index]}, gonvml.SUCCESS
			},
		}, gonvml.SUCCESS
	}
	// go-nvml's mock would give each profile its index as its ID.
	d.GetGpuInstanceProfileInfoFunc = func(index int) (gonvml.GpuInstanceProfileInfo, gonvml.Return) {
		id, ok := GIProfileIDs[index]
		if !ok {
			return gonvml.GpuInstanceProfileInfo{}, gonvml.ERROR_INVALID_ARGUMENT
		}
		return gonvml.GpuInstanceProfileInfo{Id: id}, gonvml.SUCCESS
	}
	return handles
}

// MIGHandle returns a mock MIG device handle of parent described by m.
func MIGHandle(parent *dgxa100.Device, m *MIG) *mock.Device {
	uuid := m.UUID
	if uuid == "" {
		uuid = fmt.Sprintf("MIG-%s-%d-%d", parent.UUID, m.GPUInstance, m.ComputeInstance)
	}
	ci := m.CISlices
	if ci == 0 {
		ci = m.GISlices
	}
	return &mock.Device{
		GetUUIDFunc:              func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, gonvml.Return) { return m.GPUInstance, gonvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, gonvml.Return) { return m.ComputeInstance, gonvml.SUCCESS },
		GetAttributesFunc: func() (gonvml.DeviceAttributes, gonvml.Return) {
			return gonvml.DeviceAttributes{
				MultiprocessorCount:       uint32(m.Multiprocessors),
				GpuInstanceSliceCount:     uint32(m.GISlices),
				ComputeInstanceSliceCount: uint32(ci),
				MemorySizeMB:              m.MemoryMiB,
			}, gonvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			// NVML's total is the attributes' figure; some is in use.
			return gonvml.Memory{Total: m.MemoryMiB << 20, Used: 13 << 20, Free: (m.MemoryMiB - 13) << 20}, gonvml.SUCCESS
		},
		IsMigDeviceHandleFunc:                  func() (bool, gonvml.Return) { return true, gonvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (gonvml.Device, gonvml.Return) { return parent, gonvml.SUCCESS },
	}
}

// SetProcesses makes mock GPU i list these compute and graphics processes.
func SetProcesses(s *dgxa100.Server, i int, compute, graphics []gonvml.ProcessInfo) {
	d := Device(s, i)
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return compute, gonvml.SUCCESS }
	d.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return graphics, gonvml.SUCCESS }
}

// Drain is NVML's drain states on a mock server (WithDrain), as the C
// mock models them: a GPU must be draining and idle to be removed (else
// IN_USE); a removed GPU is not found by UUID (its old handle still
// answers here, unlike NVML's); rediscovery brings every removed GPU back,
// drain off.
// Fail makes the next call of a kind answer an error instead.
type Drain struct {
	mu       sync.Mutex
	draining map[string]bool // by canonical PCI address
	removed  map[string]bool
	fail     map[string]gonvml.Return
	calls    []string
}

// Calls the Drain records and Fail takes.
const (
	CallModifyDrain = "ModifyDrainState"
	CallQueryDrain  = "QueryDrainState"
	CallRemove      = "RemoveGpu"
	CallDiscover    = "DiscoverGpus"
)

// Fail makes the next call named call answer ret, changing nothing.
func (d *Drain) Fail(call string, ret gonvml.Return) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail[call] = ret
}

// Calls are the calls made so far, each "<call> <address>[ <arg>]".
func (d *Drain) Calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

// Draining and Removed say how GPU i of the server stands.
func (d *Drain) Draining(i int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.draining[GPUAddress(i)]
}

func (d *Drain) Removed(i int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.removed[GPUAddress(i)]
}

// call records a call and answers an injected failure, if any; d.mu held.
func (d *Drain) call(name, addr, arg string) gonvml.Return {
	d.calls = append(d.calls, strings.TrimSpace(name+" "+addr+" "+arg))
	if ret, ok := d.fail[name]; ok {
		delete(d.fail, name)
		return ret
	}
	return gonvml.SUCCESS
}

// WithDrain gives s NVML's drain-state calls, over the GPUs' processes
// (SetProcesses), and returns the state to inspect and inject into.
func WithDrain(s *dgxa100.Server) *Drain {
	d := &Drain{draining: map[string]bool{}, removed: map[string]bool{}, fail: map[string]gonvml.Return{}}
	byAddr := map[string]int{}
	for i := range s.Devices {
		byAddr[GPUAddress(i)] = i
	}
	address := func(p *gonvml.PciInfo) (string, bool) {
		if p == nil {
			return "", false
		}
		addr := fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
		_, ok := byAddr[addr]
		return addr, ok
	}
	busy := func(i int) bool {
		dev := Device(s, i)
		c, _ := dev.GetComputeRunningProcessesFunc()
		g, _ := dev.GetGraphicsRunningProcessesFunc()
		return len(c)+len(g) > 0
	}
	s.DeviceModifyDrainStateFunc = func(p *gonvml.PciInfo, state gonvml.EnableState) gonvml.Return {
		d.mu.Lock()
		defer d.mu.Unlock()
		addr, ok := address(p)
		if !ok || d.removed[addr] {
			return gonvml.ERROR_INVALID_ARGUMENT
		}
		if ret := d.call(CallModifyDrain, addr, fmt.Sprint(state == gonvml.FEATURE_ENABLED)); ret != gonvml.SUCCESS {
			return ret
		}
		d.draining[addr] = state == gonvml.FEATURE_ENABLED
		return gonvml.SUCCESS
	}
	s.DeviceQueryDrainStateFunc = func(p *gonvml.PciInfo) (gonvml.EnableState, gonvml.Return) {
		d.mu.Lock()
		defer d.mu.Unlock()
		addr, ok := address(p)
		if !ok || d.removed[addr] {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		if ret := d.call(CallQueryDrain, addr, ""); ret != gonvml.SUCCESS {
			return 0, ret
		}
		if d.draining[addr] {
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
	}
	remove := func(p *gonvml.PciInfo) gonvml.Return {
		d.mu.Lock()
		defer d.mu.Unlock()
		addr, ok := address(p)
		if !ok || d.removed[addr] {
			return gonvml.ERROR_INVALID_ARGUMENT
		}
		if ret := d.call(CallRemove, addr, ""); ret != gonvml.SUCCESS {
			return ret
		}
		if !d.draining[addr] || busy(byAddr[addr]) {
			return gonvml.ERROR_IN_USE
		}
		d.removed[addr] = true
		return gonvml.SUCCESS
	}
	s.DeviceRemoveGpuFunc = remove
	s.DeviceRemoveGpu_v2Func = func(p *gonvml.PciInfo, _ gonvml.DetachGpuState, _ gonvml.PcieLinkState) gonvml.Return {
		return remove(p)
	}
	s.DeviceDiscoverGpusFunc = func() (gonvml.PciInfo, gonvml.Return) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if ret := d.call(CallDiscover, "", ""); ret != gonvml.SUCCESS {
			return gonvml.PciInfo{}, ret
		}
		for addr := range d.removed {
			delete(d.removed, addr)
			delete(d.draining, addr)
		}
		return gonvml.PciInfo{}, gonvml.SUCCESS
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(uuid string) (gonvml.Device, gonvml.Return) {
		h, ret := byUUID(uuid)
		if dev, ok := h.(*dgxa100.Device); ok && ret == gonvml.SUCCESS && d.Removed(dev.Index) {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return h, ret
	}
	return d
}

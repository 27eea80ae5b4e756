package allocbench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// NewLibrary returns a go-nvml mock that answers the topology queries the
// way the C mock library (e2e/mocknvml) answers them for the same profile:
// identity, NUMA node, the PCIe common ancestor from the profile's pcie
// rules, each NVLink's state and remote end, and NVLink P2P status. Both
// this plugin's discovery (nvml.Discover) and go-gpuallocator's
// (gpuallocator.NewDevices) can walk it, so both read one machine.
//
// A device is found from another by its UUID, not by type: go-gpuallocator
// hands NVML wrapped devices.
func NewLibrary(p *mocknvml.Profile) *mock.Interface {
	byUUID := map[string]int{}
	devices := make([]*mock.Device, len(p.GPUs))
	for i, g := range p.GPUs {
		byUUID[g.UUID] = i
		devices[i] = newDevice(p, i, byUUID)
	}
	return &mock.Interface{
		InitFunc:        func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:    func() gonvml.Return { return gonvml.SUCCESS },
		ErrorStringFunc: func(r gonvml.Return) string { return r.Error() },
		// No symbol table: discovery takes it for the R470 baseline,
		// which is all the topology read here needs.
		ExtensionsFunc:                 func() gonvml.ExtendedInterface { return nil },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return p.DriverVersion, gonvml.SUCCESS },
		SystemGetNVMLVersionFunc:       func() (string, gonvml.Return) { return p.NVMLVersion, gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return p.CUDADriverVersion, gonvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return len(devices), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(devices) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return devices[i], gonvml.SUCCESS
		},
	}
}

var topologyLevels = map[string]gonvml.GpuTopologyLevel{
	"internal":   gonvml.TOPOLOGY_INTERNAL,
	"single":     gonvml.TOPOLOGY_SINGLE,
	"multiple":   gonvml.TOPOLOGY_MULTIPLE,
	"hostbridge": gonvml.TOPOLOGY_HOSTBRIDGE,
	"node":       gonvml.TOPOLOGY_NODE,
	"system":     gonvml.TOPOLOGY_SYSTEM,
}

func newDevice(p *mocknvml.Profile, i int, byUUID map[string]int) *mock.Device {
	g := p.GPUs[i]
	switches := map[string]string{}
	for _, s := range p.NVSwitches {
		switches[s.Name] = s.BusID
	}
	// remote is the PCI address at the far end of each link.
	remote := make([]string, len(g.NVLinks))
	for l, end := range g.NVLinks {
		if n, ok := strings.CutPrefix(end, "gpu"); ok {
			k, _ := strconv.Atoi(n)
			remote[l] = p.GPUs[k].BusID
		} else {
			remote[l] = switches[end]
		}
	}
	peer := func(other gonvml.Device) (int, gonvml.Return) {
		uuid, ret := other.GetUUID()
		if ret != gonvml.SUCCESS {
			return 0, ret
		}
		k, ok := byUUID[uuid]
		if !ok {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		return k, gonvml.SUCCESS
	}
	link := func(l int) gonvml.Return {
		switch {
		case len(remote) == 0:
			return gonvml.ERROR_NOT_SUPPORTED
		case l < 0 || l >= len(remote):
			return gonvml.ERROR_INVALID_ARGUMENT
		}
		return gonvml.SUCCESS
	}
	return &mock.Device{
		GetUUIDFunc:        func() (string, gonvml.Return) { return g.UUID, gonvml.SUCCESS },
		GetIndexFunc:       func() (int, gonvml.Return) { return i, gonvml.SUCCESS },
		GetMinorNumberFunc: func() (int, gonvml.Return) { return g.Minor, gonvml.SUCCESS },
		GetNameFunc:        func() (string, gonvml.Return) { return g.Name, gonvml.SUCCESS },
		// What only DRA's attributes use: this machine does not say.
		GetBrandFunc:        func() (gonvml.BrandType, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED },
		GetArchitectureFunc: func() (gonvml.DeviceArchitecture, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED },
		GetCudaComputeCapabilityFunc: func() (int, int, gonvml.Return) {
			return 0, 0, gonvml.ERROR_NOT_SUPPORTED
		},
		GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) { return nvmltest.PciInfo(g.BusID), gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: g.MemoryBytes(), Free: g.MemoryBytes()}, gonvml.SUCCESS
		},
		GetNumaNodeIdFunc: func() (int, gonvml.Return) {
			if g.NUMANode < 0 {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return g.NUMANode, gonvml.SUCCESS
		},
		GetTopologyCommonAncestorFunc: func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
			j, ret := peer(other)
			if ret != gonvml.SUCCESS {
				return 0, ret
			}
			return commonAncestor(p, i, j), gonvml.SUCCESS
		},
		GetNvLinkStateFunc: func(l int) (gonvml.EnableState, gonvml.Return) {
			if ret := link(l); ret != gonvml.SUCCESS {
				return 0, ret
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(l int) (gonvml.PciInfo, gonvml.Return) {
			if ret := link(l); ret != gonvml.SUCCESS {
				return gonvml.PciInfo{}, ret
			}
			return nvmltest.PciInfo(remote[l]), gonvml.SUCCESS
		},
		GetP2PStatusFunc: func(other gonvml.Device, _ gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			j, ret := peer(other)
			if ret != gonvml.SUCCESS {
				return 0, ret
			}
			for _, end := range p.GPUs[i].NVLinks {
				if end == fmt.Sprintf("gpu%d", j) || (!strings.HasPrefix(end, "gpu") && slices.Contains(p.GPUs[j].NVLinks, end)) {
					return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
				}
			}
			return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
		},
	}
}

// commonAncestor is the nearest level among the profile's pcie rules that
// match the pair, system when none does, internal for a GPU with itself.
func commonAncestor(p *mocknvml.Profile, i, j int) gonvml.GpuTopologyLevel {
	if i == j {
		return gonvml.TOPOLOGY_INTERNAL
	}
	best := gonvml.TOPOLOGY_SYSTEM
	for _, r := range p.PCIe {
		match := r.SameNUMA && p.GPUs[i].NUMANode >= 0 && p.GPUs[i].NUMANode == p.GPUs[j].NUMANode
		if !r.SameNUMA {
			match = slices.Contains(r.GPUs, i) && slices.Contains(r.GPUs, j)
		}
		if l := topologyLevels[r.Level]; match && l < best {
			best = l
		}
	}
	return best
}

package nvml

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// Inventory is what Discover found: the GPUs as plain values, how they are
// linked, and the driver that runs them.
type Inventory struct {
	GPUs     []GPU    `json:"gpus"`
	Topology Topology `json:"topology"`
	// DriverVersion, NVMLVersion and CUDADriverVersion are empty or zero
	// when NVML does not say; CUDADriverVersion is NVML's integer (12040 is 12.4).
	DriverVersion     string `json:"driverVersion,omitempty"`
	NVMLVersion       string `json:"nvmlVersion,omitempty"`
	CUDADriverVersion int    `json:"cudaDriverVersion,omitempty"`

	// handles[i] is the NVML handle of GPUs[i], for health watching.
	handles []gonvml.Device
	// syms is which optional NVML functions the library exports.
	syms Symbols
}

// Handle returns the NVML handle of GPUs[i], or nil when i is out of range.
func (inv *Inventory) Handle(i int) gonvml.Device {
	if inv == nil || i < 0 || i >= len(inv.handles) {
		return nil
	}
	return inv.handles[i]
}

// Symbols is which optional NVML functions the library discovered with
// exports.
func (inv *Inventory) Symbols() Symbols { return inv.syms }

// Discover enumerates every GPU NVML reports, with its PCI address and NUMA
// node, and reads the topology between them once. The NUMA node comes from
// sysfs under sysfsRoot (normally "/sys"), falling back to NVML, else -1.
//
// A GPU whose identity cannot be read (handle, UUID, minor number, PCI
// address) is logged and left out, so one lost GPU does not hide the others.
// Failing to count the GPUs is an error. A node without GPUs gives an empty
// Inventory, not an error.
//
// A GPU in MIG mode has its MIG devices listed in GPU.MIG (their CapMinors
// are left for package nvcaps). A MIG device that cannot be read is logged
// and left out; no MIG failure takes the GPU itself out of the inventory.
func Discover(lib Library, sysfsRoot string, log *slog.Logger) (*Inventory, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	count, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w", ret)
	}

	inv := &Inventory{syms: CheckSymbols(lib)}
	inv.syms.log(log)
	inv.DriverVersion = systemString(lib.SystemGetDriverVersion, "driver version", log)
	inv.NVMLVersion = systemString(lib.SystemGetNVMLVersion, "NVML version", log)
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == gonvml.SUCCESS {
		inv.CUDADriverVersion = v
	} else {
		log.Warn("reading CUDA driver version", "reason", ret.Error())
	}

	// gpuAddrs holds the PCI address of every GPU that has one, skipped or
	// not, so an NVLink into a skipped GPU is not taken for an NVSwitch.
	gpuAddrs := make(map[string]bool)
	migs := &migLister{syms: inv.syms, log: log}
	for i := range count {
		gpu, h, err := readGPU(lib, i, gpuAddrs)
		if err != nil {
			log.Error("skipping GPU", "index", i, "reason", err.Error())
			continue
		}
		gpu.NUMANode = numaNode(h, inv.syms, sysfsRoot, gpu.PCIBusID, log)
		gpu.MIGEnabled, gpu.MIGCapable = migMode(h, inv.syms, gpu.UUID, log)
		if gpu.MIGEnabled {
			gpu.MIG = migs.list(h, &gpu)
		}
		describe(&gpu, h, inv.syms)
		gpu.Fabric = fabricInfo(h, inv.syms, gpu.UUID, log)
		inv.GPUs = append(inv.GPUs, gpu)
		inv.handles = append(inv.handles, h)
	}
	inv.Topology = readTopology(inv.GPUs, inv.handles, gpuAddrs, log)
	return inv, nil
}

func systemString(get func() (string, gonvml.Return), what string, log *slog.Logger) string {
	s, ret := get()
	if ret != gonvml.SUCCESS {
		log.Warn("reading "+what, "reason", ret.Error())
		return ""
	}
	return s
}

// readGPU reads the GPU at NVML index i. Identity queries are mandatory;
// name and memory are not, since a GPU can be scheduled without them.
func readGPU(lib Library, i int, gpuAddrs map[string]bool) (GPU, gonvml.Device, error) {
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != gonvml.SUCCESS {
		return GPU{}, nil, fmt.Errorf("getting handle: %w", ret)
	}
	pci, ret := h.GetPciInfo()
	if ret != gonvml.SUCCESS {
		return GPU{}, nil, fmt.Errorf("reading PCI info: %w", ret)
	}
	addr, err := sysfs.PCIAddress(cString(pci.BusId[:]))
	if err != nil {
		return GPU{}, nil, fmt.Errorf("reading PCI info: %w", err)
	}
	gpuAddrs[addr] = true
	uuid, ret := h.GetUUID()
	if ret != gonvml.SUCCESS {
		return GPU{}, nil, fmt.Errorf("reading UUID of %s: %w", addr, ret)
	}
	minor, ret := h.GetMinorNumber()
	if ret != gonvml.SUCCESS {
		return GPU{}, nil, fmt.Errorf("reading minor number of %s: %w", uuid, ret)
	}
	gpu := GPU{Index: i, UUID: uuid, Minor: minor, PCIBusID: addr, NUMANode: -1}
	if name, ret := h.GetName(); ret == gonvml.SUCCESS {
		gpu.Name = name
	}
	if mem, ret := h.GetMemoryInfo(); ret == gonvml.SUCCESS {
		gpu.MemoryBytes = mem.Total
	}
	return gpu, h, nil
}

// describe fills in what DRA selectors match on. None of it is needed to
// serve the GPU, so a query that fails leaves its field empty.
func describe(g *GPU, h gonvml.Device, syms Symbols) {
	if b, ret := h.GetBrand(); ret == gonvml.SUCCESS {
		g.Brand = brandName(b)
	}
	if syms.Has(symArchitecture) {
		if a, ret := h.GetArchitecture(); ret == gonvml.SUCCESS {
			g.Architecture = archName(a)
		}
	}
	if major, minor, ret := h.GetCudaComputeCapability(); ret == gonvml.SUCCESS {
		g.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if syms.Has(symVirtualizationMode) {
		if m, ret := h.GetVirtualizationMode(); ret == gonvml.SUCCESS {
			g.Virtualization = virtualizationName(m)
		}
	}
}

// virtualizationName spells NVML's virtualization mode; a value newer than
// the table stays empty (unknown).
func virtualizationName(m gonvml.GpuVirtualizationMode) string {
	return map[gonvml.GpuVirtualizationMode]string{
		gonvml.GPU_VIRTUALIZATION_MODE_NONE: VirtualizationNone, gonvml.GPU_VIRTUALIZATION_MODE_PASSTHROUGH: VirtualizationPassthrough,
		gonvml.GPU_VIRTUALIZATION_MODE_VGPU: VirtualizationVGPU, gonvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU: VirtualizationHostVGPU,
		gonvml.GPU_VIRTUALIZATION_MODE_HOST_VSGA: VirtualizationHostVSGA,
	}[m]
}

// brandName and archName spell NVML's enums in lower case; a value newer
// than the table stays empty rather than wrong. Discovery runs once, so
// building the table per call costs nothing worth a package variable.
func brandName(b gonvml.BrandType) string {
	return map[gonvml.BrandType]string{
		gonvml.BRAND_QUADRO: "quadro", gonvml.BRAND_TESLA: "tesla", gonvml.BRAND_NVS: "nvs",
		gonvml.BRAND_GRID: "grid", gonvml.BRAND_GEFORCE: "geforce", gonvml.BRAND_TITAN: "titan",
		gonvml.BRAND_NVIDIA_VAPPS: "nvidia-vapps", gonvml.BRAND_NVIDIA_VPC: "nvidia-vpc",
		gonvml.BRAND_NVIDIA_VCS: "nvidia-vcs", gonvml.BRAND_NVIDIA_VWS: "nvidia-vws",
		gonvml.BRAND_NVIDIA_CLOUD_GAMING: "nvidia-cloud-gaming", gonvml.BRAND_QUADRO_RTX: "quadro-rtx",
		gonvml.BRAND_NVIDIA_RTX: "nvidia-rtx", gonvml.BRAND_NVIDIA: "nvidia",
		gonvml.BRAND_GEFORCE_RTX: "geforce-rtx", gonvml.BRAND_TITAN_RTX: "titan-rtx",
	}[b]
}

func archName(a gonvml.DeviceArchitecture) string {
	return map[gonvml.DeviceArchitecture]string{
		gonvml.DEVICE_ARCH_KEPLER: "kepler", gonvml.DEVICE_ARCH_MAXWELL: "maxwell",
		gonvml.DEVICE_ARCH_PASCAL: "pascal", gonvml.DEVICE_ARCH_VOLTA: "volta",
		gonvml.DEVICE_ARCH_TURING: "turing", gonvml.DEVICE_ARCH_AMPERE: "ampere",
		gonvml.DEVICE_ARCH_ADA: "ada", gonvml.DEVICE_ARCH_HOPPER: "hopper",
		gonvml.DEVICE_ARCH_BLACKWELL: "blackwell", gonvml.DEVICE_ARCH_RUBIN: "rubin",
	}[a]
}

// numaNode prefers the kernel's numa_node: it is the CPU-side locality the
// kubelet aligns with, whereas NVML may report the node of the GPU's own
// memory on coherent systems. A kernel -1 is kept as the answer.
func numaNode(h gonvml.Device, syms Symbols, sysfsRoot, addr string, log *slog.Logger) int {
	n, err := sysfs.ReadNUMANode(sysfsRoot, addr)
	if err == nil {
		return n
	}
	msg := "sysfs numa_node unreadable"
	if errors.Is(err, fs.ErrNotExist) {
		msg = "sysfs numa_node missing (is the host /sys mounted?)"
	}
	if !syms.Has(symNumaNodeID) {
		log.Warn(msg+"; NUMA node unknown (the driver predates "+symNumaNodeID+")", "device", addr, "reason", err.Error())
		return -1
	}
	n, ret := h.GetNumaNodeId()
	if ret != gonvml.SUCCESS || n < 0 {
		log.Warn(msg+"; NUMA node unknown", "device", addr, "reason", err.Error())
		return -1
	}
	log.Warn(msg+"; using NVML's NUMA node", "device", addr, "reason", err.Error(), "numaNode", n)
	return n
}

// migMode reads whether the GPU is in MIG mode now (a pending mode takes
// effect only at the next reset) and whether it can be. NOT_SUPPORTED
// means a GPU that cannot do MIG; any other failure is logged and taken
// as MIG off, so an NVML error never takes a GPU away.
func migMode(h gonvml.Device, syms Symbols, uuid string, log *slog.Logger) (enabled, capable bool) {
	if !syms.Has(symMigMode) {
		return false, false
	}
	cur, _, ret := h.GetMigMode()
	switch {
	case ret == gonvml.ERROR_NOT_SUPPORTED:
		return false, false
	case ret != gonvml.SUCCESS:
		log.Warn("reading MIG mode; taking MIG as off", "device", uuid, "reason", ret.Error())
		return false, false
	}
	return cur == gonvml.DEVICE_MIG_ENABLE, true
}

// cString converts a NUL-terminated C char array, as NVML structs hold them.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// Select keeps the GPUs keep says yes to and returns the others. The
// handles and the topology are cut to match, so positions stay aligned.
func (inv *Inventory) Select(keep func(GPU) bool) (left []GPU) {
	var pos []int
	for i, g := range inv.GPUs {
		if keep(g) {
			pos = append(pos, i)
		} else {
			left = append(left, g)
		}
	}
	if len(left) == 0 {
		return nil
	}
	gpus := make([]GPU, 0, len(pos))
	var handles []gonvml.Device
	links := make([][]Link, 0, len(pos))
	for _, i := range pos {
		gpus = append(gpus, inv.GPUs[i])
		if i < len(inv.handles) {
			handles = append(handles, inv.handles[i])
		}
		if i < len(inv.Topology.Links) {
			row := make([]Link, 0, len(pos))
			for _, j := range pos {
				row = append(row, inv.Topology.Between(i, j))
			}
			links = append(links, row)
		}
	}
	inv.GPUs, inv.handles = gpus, handles
	if len(inv.Topology.Links) > 0 {
		inv.Topology.Links = links
	}
	return left
}

package dra

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs"
)

// Device types, the "type" attribute every device carries: DeviceClasses
// select on it.
const (
	TypeGPU = "gpu"
	TypeNIC = "nic"
)

// Standard attributes (resource.kubernetes.io/…), which other drivers
// publish too, so one constraint can align devices of several drivers.
const (
	attrPCIBusID = deviceattribute.StandardDeviceAttributePCIBusID
	attrPCIeRoot = deviceattribute.StandardDeviceAttributePCIeRoot
	attrNUMANode = deviceattribute.StandardDeviceAttributeNUMANode
)

// GPUs is what the model knows of the node's GPUs.
type GPUs struct {
	GPUs     []nvml.GPU
	Topology nvml.Topology
	// DriverVersion ("550.54.15") and CUDADriverVersion (12040 is 12.4)
	// are empty or zero when NVML does not say.
	DriverVersion     string
	CUDADriverVersion int
}

// NICPool is one NIC pool as the model knows it: its resource name and
// present NICs.
type NICPool struct {
	Name string
	NICs []sysfs.NIC
}

// entry is one published device: its DRA form and what Prepare and the
// health report need.
type entry struct {
	dev resourceapi.Device
	// id is the model's ID: the GPU UUID or the NIC's PCI address.
	id     string
	typ    string
	pool   string // NIC pool name; empty for GPUs
	cdiIDs []string
}

// GPUDeviceName is a GPU's device name in the ResourceSlice. Indices are
// stable while the node runs and short, and a name must be a DNS label;
// the UUID is an attribute.
func GPUDeviceName(g nvml.GPU) string { return "gpu-" + strconv.Itoa(g.Index) }

// NICDeviceName is a NIC's device name: its PCI address as a DNS label
// ("0000:3b:00.1" is "nic-0000-3b-00-1"), unique on the node whatever
// pool it is in.
func NICDeviceName(address string) string {
	return "nic-" + strings.NewReplacer(":", "-", ".", "-").Replace(strings.ToLower(address))
}

// gpuEntries turns the GPUs into devices. cdiID names a GPU's CDI device.
func gpuEntries(in GPUs, sysfsRoot string, cdiID func(uuid string) string, log *slog.Logger) []entry {
	cliques := nvlinkCliques(in)
	out := make([]entry, 0, len(in.GPUs))
	for i, g := range in.GPUs {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":  {StringValue: ptr.To(TypeGPU)},
			"uuid":  {StringValue: ptr.To(g.UUID)},
			"index": {IntValue: ptr.To(int64(g.Index))},
			"minor": {IntValue: ptr.To(int64(g.Minor))},
		}
		str := func(name resourceapi.QualifiedName, v string) {
			if v != "" {
				attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
			}
		}
		ver := func(name resourceapi.QualifiedName, v string) {
			if v != "" {
				attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
			}
		}
		str("productName", g.Name)
		str("brand", g.Brand)
		str("architecture", g.Architecture)
		ver("cudaComputeCapability", semver(g.CUDAComputeCapability))
		ver("driverVersion", semver(in.DriverVersion))
		if in.CUDADriverVersion > 0 {
			ver("cudaDriverVersion", fmt.Sprintf("%d.%d.0", in.CUDADriverVersion/1000, in.CUDADriverVersion%1000/10))
		}
		str("nvlinkClique", cliques[i])
		pciAttributes(attrs, g.PCIBusID, g.NUMANode, sysfsRoot, log)
		d := resourceapi.Device{Name: GPUDeviceName(g), Attributes: attrs}
		if g.MemoryBytes > 0 {
			d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)},
			}
		}
		out = append(out, entry{dev: d, id: g.UUID, typ: TypeGPU, cdiIDs: []string{cdiID(g.UUID)}})
	}
	return out
}

// nicEntries turns a pool's NICs into devices. cdiID names a NIC's CDI
// device, or "" when the NIC has none (a netdev-only NIC has no device
// node to give).
func nicEntries(p NICPool, sysfsRoot string, cdiID func(pool, address string) string, log *slog.Logger) []entry {
	out := make([]entry, 0, len(p.NICs))
	for _, n := range p.NICs {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":     {StringValue: ptr.To(TypeNIC)},
			"pool":     {StringValue: ptr.To(p.Name)},
			"vendorID": {StringValue: ptr.To(n.Vendor)},
			"deviceID": {StringValue: ptr.To(n.Device)},
			"rdma":     {BoolValue: ptr.To(len(n.RDMADevices) > 0)},
			"sriovVF":  {BoolValue: ptr.To(n.PF != "")},
		}
		str := func(name resourceapi.QualifiedName, v string) {
			if v != "" {
				attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
			}
		}
		str("driver", n.Driver)
		str("linkType", n.LinkType)
		// Attributes are scalars: a NIC has one netdev and one RDMA
		// device in all but exotic set-ups; the rest are listed comma-
		// separated for people, not for selectors.
		str("netdev", strings.Join(n.Netdevs, ","))
		str("rdmaDevice", strings.Join(n.IBDevices, ","))
		str("pfPCIBusID", n.PF)
		pciAttributes(attrs, n.Address, n.NUMANode, sysfsRoot, log)
		e := entry{dev: resourceapi.Device{Name: NICDeviceName(n.Address), Attributes: attrs}, id: n.Address, typ: TypeNIC, pool: p.Name}
		if id := cdiID(p.Name, n.Address); id != "" {
			e.cdiIDs = []string{id}
		}
		out = append(out, e)
	}
	return out
}

// pciAttributes adds the standard PCI and NUMA attributes, each left out
// when unknown: a constraint must never match on a guess.
func pciAttributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, addr string, numa int, sysfsRoot string, log *slog.Logger) {
	if a, err := deviceattribute.GetPCIBusIDAttribute(addr); err == nil {
		attrs[a.Name] = a.Value
	}
	if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(addr, deviceattribute.WithFSFromRoot(sysfsRoot)); err == nil {
		attrs[a.Name] = a.Value
	} else {
		log.Warn("PCIe root unknown; the device is published without "+string(attrPCIeRoot), "device", addr, "err", err)
	}
	if numa >= 0 {
		attrs[attrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(numa))}
	}
}

// semver makes a driver's dotted version ("535.104.05", "9.0") a semantic
// version ("535.104.5", "9.0.0"), which version attributes must be; ""
// when it is not numbers.
func semver(v string) string {
	if v == "" {
		return ""
	}
	parts := strings.Split(v, ".")
	if len(parts) > 3 {
		return ""
	}
	nums := make([]string, 3)
	for i := range nums {
		nums[i] = "0"
		if i < len(parts) {
			n, err := strconv.ParseUint(parts[i], 10, 32)
			if err != nil {
				return ""
			}
			nums[i] = strconv.FormatUint(n, 10)
		}
	}
	return strings.Join(nums, ".")
}

// nvlinkCliques names each GPU's NVLink island: the GPUs reachable from
// it over NVLink. All GPUs of one island share a name (the UUID of its
// lowest-index member), so a claim's matchAttribute on nvlinkClique gets
// GPUs that talk over NVLink; a GPU without NVLink gets no name.
func nvlinkCliques(in GPUs) []string {
	n := len(in.GPUs)
	root := make([]int, n)
	for i := range root {
		root[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		for root[i] != i {
			root[i] = root[root[i]]
			i = root[i]
		}
		return i
	}
	linked := make([]bool, n)
	for i := range n {
		for j := i + 1; j < n; j++ {
			if in.Topology.Between(i, j).NVLinks > 0 {
				linked[i], linked[j] = true, true
				a, b := find(i), find(j)
				root[max(a, b)] = min(a, b)
			}
		}
	}
	out := make([]string, n)
	for i := range n {
		if linked[i] {
			out[i] = in.GPUs[find(i)].UUID
		}
	}
	return out
}

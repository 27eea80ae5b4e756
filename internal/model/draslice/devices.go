package draslice

import (
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// Device types, the "type" attribute every device carries: DeviceClasses
// select on it.
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
	TypeNIC = "nic"
	// TypeChannel is a node's IMEX channel of ComputeDomains.
	TypeChannel = "channel"
)

// Standard attributes, which other drivers publish too, so one constraint
// can align devices of several drivers.
const (
	AttrPCIBusID = "resource.kubernetes.io/pciBusID"
	AttrPCIeRoot = "resource.kubernetes.io/pcieRoot"
	AttrNUMANode = "resource.kubernetes.io/numaNode"
)

// Attribute is one device attribute; exactly one field is set.
type Attribute struct {
	Int     *int64  `json:"int,omitempty"`
	Bool    *bool   `json:"bool,omitempty"`
	String  *string `json:"string,omitempty"`
	Version *string `json:"version,omitempty"`
}

func str(s string) Attribute   { return Attribute{String: &s} }
func ver(s string) Attribute   { return Attribute{Version: &s} }
func integer(n int) Attribute  { v := int64(n); return Attribute{Int: &v} }
func boolean(b bool) Attribute { return Attribute{Bool: &b} }

// Capacity is a device capacity: Value is a Kubernetes quantity ("80Gi").
// RequestPolicy, on a device that allows several allocations, is how a
// claim consumes it.
type Capacity struct {
	Value         string         `json:"value"`
	RequestPolicy *RequestPolicy `json:"requestPolicy,omitempty"`
}

// RequestPolicy is a capacity's request policy, quantities as Value: a
// request that names no amount consumes Default, a smaller one Min.
type RequestPolicy struct {
	Default string `json:"default"`
	Min     string `json:"min"`
}

// Device is one ResourceSlice device entry, with what the driver needs
// besides: the model's ID, type, NIC pool and CDI device IDs.
type Device struct {
	Name       string               `json:"name"`
	Attributes map[string]Attribute `json:"attributes,omitempty"`
	Capacity   map[string]Capacity  `json:"capacity,omitempty"`
	Taints     []Taint              `json:"taints,omitempty"`
	// AllowMultipleAllocations: several claims may hold the device, each
	// consuming part of its capacity (sharing.memoryShares).
	AllowMultipleAllocations bool `json:"allowMultipleAllocations,omitempty"`
	// ConsumesCounters: a MIG placement takes its slices of its GPU's
	// counter set (sharing.migPartitions).
	ConsumesCounters []CounterConsumption `json:"consumesCounters,omitempty"`

	// ID is the model's ID: the GPU or MIG UUID, or the NIC's PCI address.
	ID     string   `json:"-"`
	Type   string   `json:"-"`
	Pool   string   `json:"-"`
	CDIIDs []string `json:"-"`
	// Placement is set on a MIG placement of a partitioned GPU, whose
	// instance Prepare creates; ID is then the GPU's UUID, and CDIIDs
	// are the GPU's (the instance's own come with it).
	Placement *nvml.MIGPlacement `json:"-"`
}

// GPUs is what the model knows of the node's GPUs.
type GPUs struct {
	GPUs     []nvml.GPU
	Topology nvml.Topology
	// DriverVersion ("550.54.15") and CUDADriverVersion (12040 is 12.4)
	// are empty or zero when NVML does not say.
	DriverVersion     string
	CUDADriverVersion int
	// MemoryShares, when set, picks the whole GPUs several claims may
	// hold, each consuming part of the memory capacity, at least
	// ShareMinimum bytes; a claim that names no amount consumes it all.
	MemoryShares func(nvml.GPU) bool
	ShareMinimum uint64
	// Partitions are the GPUs in MIG mode published as the placements
	// they allow (sharing.migPartitions), by UUID.
	Partitions map[string]Partition
}

// Partition is what a GPU partitioned on demand allows.
type Partition struct {
	Layout nvml.MIGLayout
	// Foreign are GPU instances no prepared claim made (made by hand):
	// they are not served, and placements over their slices are not
	// published.
	Foreign []nvml.GPUInstance
}

// MemoryShares are the GPUs whose memory is shared (sharing.memoryShares).
type MemoryShares struct {
	// Selects says whether a GPU's memory is shared; nil: no GPU's is.
	Selects func(nvml.GPU) bool
	// Minimum is the smallest share a claim may be allocated, in bytes.
	Minimum uint64
}

// GPUsOf is what the slices are made of: the inventory, and the GPUs
// shares selects.
func GPUsOf(inv *nvml.Inventory, shares MemoryShares) GPUs {
	out := GPUs{GPUs: inv.GPUs, Topology: inv.Topology, DriverVersion: inv.DriverVersion, CUDADriverVersion: inv.CUDADriverVersion}
	if shares.Selects != nil {
		out.MemoryShares = shares.Selects
		out.ShareMinimum = shares.Minimum
	}
	return out
}

// NICPool is one NIC pool: its resource name and NICs.
type NICPool struct {
	Name string
	NICs []sysfs.NIC
}

// GPUDeviceName is a GPU's device name. Indices are stable while the node
// runs and short, and a name must be a DNS label; the UUID is an attribute.
func GPUDeviceName(g nvml.GPU) string { return "gpu-" + strconv.Itoa(g.Index) }

// NICDeviceName is a NIC's device name: its PCI address as a DNS label
// ("0000:3b:00.1" is "nic-0000-3b-00-1"), unique on the node whatever
// pool it is in.
func NICDeviceName(address string) string {
	return "nic-" + strings.NewReplacer(":", "-", ".", "-").Replace(strings.ToLower(address))
}

// MIGDeviceName is a MIG device's device name: its parent's index and its
// GPU and compute instance IDs, which stay the same while the instance
// exists, unlike the MIG device index.
func MIGDeviceName(parent nvml.GPU, m nvml.MIGDevice) string {
	return fmt.Sprintf("gpu-%d-mig-%d-%d", parent.Index, m.GPUInstance, m.ComputeInstance)
}

// GPUDevices turns the GPUs into devices; cdiID names a GPU's or MIG
// device's CDI device by UUID. A MIG-enabled GPU is published as its MIG
// devices, not whole: CUDA sees no device on a GPU in MIG mode. With no
// MIG device created it publishes nothing.
func GPUDevices(in GPUs, sysfsRoot string, cdiID func(uuid string) string, log *slog.Logger) []Device {
	cliques := nvlinkCliques(in)
	out := make([]Device, 0, len(in.GPUs))
	for i, g := range in.GPUs {
		if part, ok := in.Partitions[g.UUID]; ok && g.MIGEnabled {
			out = append(out, placementDevices(g, part, gpuAttributes(in, g, sysfsRoot, log), cdiID)...)
			continue
		}
		if g.MIGEnabled && len(g.MIG) == 0 {
			continue
		}
		common := gpuAttributes(in, g, sysfsRoot, log)
		if g.MIGEnabled {
			out = append(out, migDevices(g, common, cdiID, log)...)
			continue
		}
		attrs := map[string]Attribute{
			"type":  str(TypeGPU),
			"uuid":  str(g.UUID),
			"index": integer(g.Index),
			"minor": integer(g.Minor),
		}
		maps.Copy(attrs, common)
		// NVLink joins whole GPUs: a MIG device gets no peer-to-peer
		// over it, so only whole GPUs carry the clique.
		if cliques[i] != "" {
			attrs["nvlinkClique"] = str(cliques[i])
		}
		// The multi-node NVLink domain (GB200, GB300 NVL72), which spans
		// nodes, unlike nvlinkClique's island on this node: a claim's
		// matchAttribute on cliqueID keeps GPUs of several nodes in one
		// domain and clique, the gpu.clique label's value.
		if g.Fabric.Registered() {
			attrs["cliqueID"] = str(g.Fabric.ClusterUUID + "." + strconv.FormatUint(uint64(g.Fabric.CliqueID), 10))
			attrs["fabricClusterUUID"] = str(g.Fabric.ClusterUUID)
		}
		d := Device{Name: GPUDeviceName(g), Attributes: attrs, ID: g.UUID, Type: TypeGPU, CDIIDs: []string{cdiID(g.UUID)}}
		if g.MemoryBytes > 0 {
			c := Capacity{Value: Bytes(g.MemoryBytes)}
			if in.MemoryShares != nil && in.MemoryShares(g) {
				d.AllowMultipleAllocations = true
				c.RequestPolicy = &RequestPolicy{Default: c.Value, Min: Bytes(min(max(in.ShareMinimum, 1), g.MemoryBytes))}
			}
			d.Capacity = map[string]Capacity{"memory": c}
		}
		out = append(out, d)
	}
	return out
}

// gpuAttributes are the attributes a GPU shares with its MIG devices:
// model, versions, PCI and NUMA placement.
func gpuAttributes(in GPUs, g nvml.GPU, sysfsRoot string, log *slog.Logger) map[string]Attribute {
	attrs := map[string]Attribute{}
	set := func(name string, a func(string) Attribute, v string) {
		if v != "" {
			attrs[name] = a(v)
		}
	}
	set("productName", str, g.Name)
	set("brand", str, g.Brand)
	set("architecture", str, g.Architecture)
	set("cudaComputeCapability", ver, Semver(g.CUDAComputeCapability))
	set("driverVersion", ver, Semver(in.DriverVersion))
	if in.CUDADriverVersion > 0 {
		set("cudaDriverVersion", ver, fmt.Sprintf("%d.%d.0", in.CUDADriverVersion/1000, in.CUDADriverVersion%1000/10))
	}
	pciAttributes(attrs, g.PCIBusID, g.NUMANode, sysfsRoot, log)
	return attrs
}

// migDevices are the devices of a MIG-enabled GPU's MIG devices, each with
// the parent's common attributes. One whose capability minors are unknown
// has no CDI device (cdi.GPUSpec leaves it out) and is not published.
func migDevices(parent nvml.GPU, common map[string]Attribute, cdiID func(uuid string) string, log *slog.Logger) []Device {
	out := make([]Device, 0, len(parent.MIG))
	for _, m := range parent.MIG {
		if len(m.CapMinors) != 2 {
			if log != nil {
				log.Warn("MIG device not published: its GPU and compute instance access capabilities are unknown",
					"device", m.UUID, "parent", parent.UUID, "capMinors", m.CapMinors)
			}
			continue
		}
		attrs := InstanceAttributes(m.UUID, m.GPUInstance, m.ComputeInstance)
		attrs["type"] = str(TypeMIG)
		attrs["parentUUID"] = str(parent.UUID)
		attrs["parentIndex"] = integer(parent.Index)
		if m.Profile != "" {
			attrs["profile"] = str(m.Profile)
		}
		maps.Copy(attrs, common)
		out = append(out, Device{Name: MIGDeviceName(parent, m), Attributes: attrs, ID: m.UUID, Type: TypeMIG, CDIIDs: []string{cdiID(m.UUID)},
			Capacity: migCapacity(m.MemoryBytes, m.Multiprocessors)})
	}
	return out
}

// InstanceAttributes name one MIG instance: its UUID and instance IDs.
// A MIG device publishes them; a placement, whose instance a claim's
// Prepare creates, has them only in that claim's device metadata.
func InstanceAttributes(uuid string, gpuInstance, computeInstance int) map[string]Attribute {
	return map[string]Attribute{
		"uuid":            str(uuid),
		"gpuInstance":     integer(gpuInstance),
		"computeInstance": integer(computeInstance),
	}
}

// migCapacity is a MIG device's or placement's capacity: its memory and
// multiprocessors, each left out when unknown (nil: both).
func migCapacity(memory uint64, sms int) map[string]Capacity {
	if memory == 0 && sms == 0 {
		return nil
	}
	c := map[string]Capacity{}
	if memory > 0 {
		c["memory"] = Capacity{Value: Bytes(memory)}
	}
	if sms > 0 {
		c["multiprocessors"] = Capacity{Value: strconv.Itoa(sms)}
	}
	return c
}

// NICDevices turns a pool's NICs into devices. cdiID names a NIC's CDI
// device, or "" when it has none (a netdev-only NIC has no device node).
func NICDevices(p NICPool, sysfsRoot string, cdiID func(pool, address string) string, log *slog.Logger) []Device {
	out := make([]Device, 0, len(p.NICs))
	for _, n := range p.NICs {
		attrs := map[string]Attribute{
			"type":     str(TypeNIC),
			"pool":     str(p.Name),
			"vendorID": str(n.Vendor),
			"deviceID": str(n.Device),
			"rdma":     boolean(len(n.RDMADevices) > 0),
			"sriovVF":  boolean(n.PF != ""),
		}
		set := func(name, v string) {
			// The API refuses a string attribute over 64 bytes, and with it
			// the node's whole slice: a value too long is left out.
			if v != "" && len(v) <= AttributeStringMax {
				attrs[name] = str(v)
			}
		}
		set("driver", n.Driver)
		set("linkType", n.LinkType)
		// Attributes are scalars: a NIC has one netdev and one RDMA device
		// in all but exotic set-ups; more are listed comma-separated.
		set("netdev", strings.Join(n.Netdevs, ","))
		set("rdmaDevice", strings.Join(n.IBDevices, ","))
		set("pfPCIBusID", n.PF)
		pciAttributes(attrs, n.Address, n.NUMANode, sysfsRoot, log)
		d := Device{Name: NICDeviceName(n.Address), Attributes: attrs, ID: n.Address, Type: TypeNIC, Pool: p.Name}
		if id := cdiID(p.Name, n.Address); id != "" {
			d.CDIIDs = []string{id}
		}
		out = append(out, d)
	}
	return out
}

// AttributeStringMax is the longest string attribute value the
// resource.k8s.io API takes.
const AttributeStringMax = 64

// pciAttributes adds the standard PCI and NUMA attributes, each left out
// when unknown: a constraint must never match on a guess.
func pciAttributes(attrs map[string]Attribute, addr string, numa int, sysfsRoot string, log *slog.Logger) {
	if a, err := sysfs.PCIAddress(addr); err == nil {
		attrs[AttrPCIBusID] = str(a)
	}
	if root, err := sysfs.PCIeRoot(sysfsRoot, addr); err == nil {
		attrs[AttrPCIeRoot] = str(root)
	} else if log != nil {
		log.Warn("PCIe root unknown; the device is published without "+AttrPCIeRoot, "device", addr, "err", err)
	}
	if numa >= 0 {
		attrs[AttrNUMANode] = integer(numa)
	}
}

// Bytes writes n bytes as a Kubernetes quantity: "80Gi" when it is a
// whole number of GiB or MiB, else the number.
func Bytes(n uint64) string {
	switch {
	case n > 0 && n%(1<<30) == 0:
		return strconv.FormatUint(n>>30, 10) + "Gi"
	case n > 0 && n%(1<<20) == 0:
		return strconv.FormatUint(n>>20, 10) + "Mi"
	}
	return strconv.FormatUint(n, 10)
}

// Semver makes a driver's dotted version ("535.104.05", "9.0") a semantic
// version ("535.104.5", "9.0.0"), which version attributes must be; ""
// when it is not numbers.
func Semver(v string) string {
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
	find := func(i int) int {
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

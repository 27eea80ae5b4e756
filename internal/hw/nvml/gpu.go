package nvml

// GPU is one discovered NVIDIA GPU, as plain values read once at start-up.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Minor       int    `json:"minor"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// PCIBusID is the canonical lower-case sysfs form, "0000:07:00.0".
	PCIBusID string `json:"pciBusID"`
	// NUMANode is -1 when the platform does not say (the kubelet never matches -1).
	NUMANode int `json:"numaNode"`
	// MIGEnabled is true when the GPU is in MIG mode now. Such a GPU is not
	// handed out whole: CUDA in the container would see no device. Its
	// MIG devices are, when the MIG strategy (or DRA) serves them.
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIGCapable is true when the GPU can do MIG, on or off.
	MIGCapable bool `json:"migCapable,omitempty"`
	// MIG lists the MIG devices of a MIG-enabled GPU, by MIG device index;
	// empty when MIG is off or no instance is created.
	MIG []MIGDevice `json:"mig,omitempty"`
	// Brand, Architecture ("hopper") and CUDAComputeCapability ("9.0")
	// describe the GPU for DRA selectors; empty when NVML does not say.
	Brand        string `json:"brand,omitempty"`
	Architecture string `json:"architecture,omitempty"`
	// Virtualization is what NVML says the GPU is to virtualization
	// (VirtualizationNone, ...; VirtualizationVGPU in a vGPU guest), empty
	// when it cannot say.
	Virtualization        string `json:"virtualization,omitempty"`
	CUDAComputeCapability string `json:"cudaComputeCapability,omitempty"`
	// Fabric is the GPU's multi-node NVLink registration; nil where NVML
	// has none (no NVLink domain, or a driver before R525).
	Fabric *Fabric `json:"fabric,omitempty"`
}

// MIGDevice is one MIG device: a compute instance inside a GPU instance
// of a MIG-enabled GPU, which CUDA sees as one device.
type MIGDevice struct {
	// UUID is NVML's, "MIG-…"; CUDA and the container runtime name the
	// device by it.
	UUID string `json:"uuid"`
	// Index is NVML's MIG device index within the parent GPU.
	Index int `json:"index"`
	// GPUInstance and ComputeInstance are the instance IDs; XID events on
	// MIG carry them.
	GPUInstance     int `json:"gpuInstance"`
	ComputeInstance int `json:"computeInstance"`
	// Profile is the name NVIDIA gives the layout: "1g.10gb", "3g.40gb",
	// "1c.3g.40gb" (a compute instance smaller than its GPU instance),
	// "1g.10gb+me" (with media extensions).
	Profile         string `json:"profile"`
	MemoryBytes     uint64 `json:"memoryBytes"`
	Multiprocessors int    `json:"multiprocessors"`
	// Slices and Engines are the instance's share of the GPU, as NVML's
	// device attributes give them.
	Slices  Slices  `json:"slices"`
	Engines Engines `json:"engines"`
	// CapMinors are the minors of the /dev/nvidia-caps/nvidia-cap<N>
	// nodes a container needs for this device: the GPU instance's access
	// capability, then the compute instance's. Discovery leaves them
	// empty; nvcaps.AddMIG fills them from the driver's procfs.
	CapMinors []int `json:"capMinors,omitempty"`
}

// Slices is how many of the GPU's slices a MIG device's GPU instance and
// compute instance take.
type Slices struct {
	GPUInstance     int `json:"gpuInstance"`
	ComputeInstance int `json:"computeInstance"`
}

// Engines are the engines a MIG device shares with none other.
type Engines struct {
	Copy    int `json:"copy"`
	Decoder int `json:"decoder"`
	Encoder int `json:"encoder"`
	JPEG    int `json:"jpeg"`
	OFA     int `json:"ofa"`
}

// LinkLevel is the PCIe relation of two GPUs, nearest first. The values
// mirror NVML's topology levels so they order the same way.
type LinkLevel int

const (
	LinkSameBoard    LinkLevel = 0  // same board (multi-GPU board)
	LinkSingleSwitch LinkLevel = 10 // one PCIe switch
	LinkMultiSwitch  LinkLevel = 20 // several PCIe switches, no host bridge
	LinkHostBridge   LinkLevel = 30 // one host bridge
	LinkSameNUMA     LinkLevel = 40 // same NUMA node, across host bridges
	LinkCrossCPU     LinkLevel = 50 // across CPU sockets (SMP interconnect)
	LinkUnknown      LinkLevel = 99 // NVML could not say
)

// Link describes how two GPUs are connected.
type Link struct {
	// NVLinks is the number of NVLink lanes joining the pair. Through
	// NVSwitch every GPU on the same switches counts as linked to every
	// other with the links it has to the switch fabric.
	NVLinks int `json:"nvlinks"`
	// PCIe is the nearest common PCIe ancestor.
	PCIe LinkLevel `json:"pcie"`
}

// Topology holds the pairwise links of the GPUs, by GPU index in the
// slice Discover returned (not the NVML index, though they usually agree).
// Links is square and symmetric; a GPU's link to itself is the zero Link
// (no NVLinks, LinkSameBoard).
type Topology struct {
	Links [][]Link `json:"links"`
}

// Between returns the link between GPUs i and j (positions in the slice).
func (t Topology) Between(i, j int) Link {
	if i < 0 || j < 0 || i >= len(t.Links) || j >= len(t.Links[i]) {
		return Link{PCIe: LinkUnknown}
	}
	return t.Links[i][j]
}

// NVML's virtualization modes, as GPU.Virtualization spells them.
const (
	VirtualizationNone        = "none"
	VirtualizationPassthrough = "passthrough"
	VirtualizationVGPU        = "vgpu"
	VirtualizationHostVGPU    = "hostVGPU"
	VirtualizationHostVSGA    = "hostVSGA"
)

package nvml

import (
	"log/slog"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// nvlinkEnds is where one GPU's active NVLinks lead.
type nvlinkEnds struct {
	active   int            // links in FEATURE_ENABLED state
	direct   map[int]int    // position of a discovered GPU -> links to it
	switches map[string]int // NVSwitch PCI address -> links to it
}

func (e nvlinkEnds) switchLinks() int {
	n := 0
	for _, c := range e.switches {
		n += c
	}
	return n
}

func (e nvlinkEnds) sharesSwitch(o nvlinkEnds) bool {
	for addr := range e.switches {
		if o.switches[addr] > 0 {
			return true
		}
	}
	return false
}

// readTopology fills the pairwise links of gpus (handles in the same order).
// The diagonal is the zero Link: no NVLinks, PCIe LinkSameBoard.
func readTopology(gpus []GPU, handles []gonvml.Device, gpuAddrs map[string]bool, log *slog.Logger) Topology {
	pos := make(map[string]int, len(gpus))
	for i, g := range gpus {
		pos[g.PCIBusID] = i
	}
	ends := make([]nvlinkEnds, len(gpus))
	for i := range gpus {
		ends[i] = readNVLinks(handles[i], gpus[i].PCIBusID, pos, gpuAddrs, log)
	}

	links := make([][]Link, len(gpus))
	for i := range links {
		links[i] = make([]Link, len(gpus))
	}
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			l := Link{
				PCIe:    pcieLevel(handles[i], handles[j]),
				NVLinks: nvlinksBetween(ends, handles, i, j),
			}
			links[i][j], links[j][i] = l, l
		}
	}
	return Topology{Links: links}
}

// readNVLinks walks every possible link of one GPU. NVML answers
// INVALID_ARGUMENT past the GPU's last link and NOT_SUPPORTED for a link (or
// a GPU) without NVLink; any other failure ends the walk for this GPU.
func readNVLinks(h gonvml.Device, self string, pos map[string]int, gpuAddrs map[string]bool, log *slog.Logger) nvlinkEnds {
	e := nvlinkEnds{direct: map[int]int{}, switches: map[string]int{}}
	for link := range gonvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(link)
		if ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != gonvml.SUCCESS {
			log.Warn("reading NVLink state", "device", self, "link", link, "reason", ret.Error())
			break
		}
		if state != gonvml.FEATURE_ENABLED {
			continue
		}
		e.active++
		remote, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != gonvml.SUCCESS {
			// The pair may still be found linked through GetP2PStatus.
			log.Debug("reading NVLink remote", "device", self, "link", link, "reason", ret.Error())
			continue
		}
		addr, err := sysfs.PCIAddress(cString(remote.BusId[:]))
		if err != nil {
			log.Debug("reading NVLink remote", "device", self, "link", link, "reason", err.Error())
			continue
		}
		switch p, ok := pos[addr]; {
		case addr == self:
			// Loopback links carry no traffic to a peer.
		case ok:
			e.direct[p]++
		case gpuAddrs[addr]:
			// A GPU that Discover skipped: not a switch, and not a peer.
		default:
			e.switches[addr]++
		}
	}
	return e
}

// nvlinksBetween counts the NVLinks joining GPUs i and j: direct links, plus,
// when both reach a common NVSwitch, the smaller of their switch links (every
// GPU on a switch fabric reaches every other at its full switch bandwidth).
func nvlinksBetween(ends []nvlinkEnds, handles []gonvml.Device, i, j int) int {
	a, b := ends[i], ends[j]
	// Each side counts the links it sees; one side may have missed some
	// whose remote end it could not read.
	n := max(a.direct[j], b.direct[i])
	if a.sharesSwitch(b) {
		n += min(a.switchLinks(), b.switchLinks())
	}
	if n > 0 {
		return n
	}
	// Without readable remote ends, NVML may still know the pair talks
	// over NVLink.
	status, ret := handles[i].GetP2PStatus(handles[j], gonvml.P2P_CAPS_INDEX_NVLINK)
	if ret == gonvml.SUCCESS && status == gonvml.P2P_STATUS_OK {
		return max(1, min(a.active, b.active))
	}
	return 0
}

func pcieLevel(a, b gonvml.Device) LinkLevel {
	level, ret := a.GetTopologyCommonAncestor(b)
	if ret != gonvml.SUCCESS {
		return LinkUnknown
	}
	switch level {
	case gonvml.TOPOLOGY_INTERNAL:
		return LinkSameBoard
	case gonvml.TOPOLOGY_SINGLE:
		return LinkSingleSwitch
	case gonvml.TOPOLOGY_MULTIPLE:
		return LinkMultiSwitch
	case gonvml.TOPOLOGY_HOSTBRIDGE:
		return LinkHostBridge
	case gonvml.TOPOLOGY_NODE:
		return LinkSameNUMA
	case gonvml.TOPOLOGY_SYSTEM:
		return LinkCrossCPU
	default:
		return LinkUnknown
	}
}

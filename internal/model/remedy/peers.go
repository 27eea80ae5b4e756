package remedy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// GPU is one GPU as the Machine needs to know it.
type GPU struct {
	// UUID names the GPU in every event and command.
	UUID string
	// Architecture ("ampere") and ComputeCapability ("8.0") as
	// nvml.GPU has them; either may be empty.
	Architecture      string
	ComputeCapability string
	// NVLinkPeers are the UUIDs of the GPUs joined to this one by NVLink,
	// directly or through an NVSwitch.
	NVLinkPeers []string
	// NVSwitch is true when its NVLinks go through NVSwitches.
	NVSwitch bool
}

// FabricManager is whether NVIDIA's Fabric Manager runs on the node.
type FabricManager int

// Unknown is taken as not running.
const (
	FabricManagerUnknown FabricManager = iota
	FabricManagerRunning
	FabricManagerNotRunning
)

// Node is the node's GPUs and what the NVLink reset rule needs of it.
type Node struct {
	GPUs          []GPU
	FabricManager FabricManager
}

// GPUsOf are the inventory's GPUs as the reset rule sees them, in its
// order: each with its NVLink peers. The topology does not say whether the
// links go through NVSwitches: more than one peer is taken as NVSwitch,
// the strict way for ResetAlone.
func GPUsOf(inv *nvml.Inventory) []GPU {
	out := make([]GPU, len(inv.GPUs))
	for i, g := range inv.GPUs {
		out[i] = GPU{UUID: g.UUID, Architecture: g.Architecture, ComputeCapability: g.CUDAComputeCapability}
		for j, p := range inv.GPUs {
			if j != i && inv.Topology.Between(i, j).NVLinks > 0 {
				out[i].NVLinkPeers = append(out[i].NVLinkPeers, p.UUID)
			}
		}
		out[i].NVSwitch = len(out[i].NVLinkPeers) > 1
	}
	return out
}

// generation is a GPU's compute capability major: 7 Volta and Turing, 8
// Ampere and Ada, 9 Hopper, 10 and up Blackwell and later. 0 when unknown.
func generation(g GPU) int {
	if major, _, ok := strings.Cut(g.ComputeCapability, "."); ok {
		if n, err := strconv.Atoi(major); err == nil && n > 0 {
			return n
		}
	}
	switch g.Architecture {
	case "kepler", "maxwell", "pascal", "volta", "turing":
		return 7 // older than Ampere is all the rule needs
	case "ampere", "ada":
		return 8
	case "hopper":
		return 9
	case "blackwell", "rubin":
		return 10
	}
	return 0
}

func describe(g GPU) string {
	switch {
	case g.Architecture != "" && g.ComputeCapability != "":
		return fmt.Sprintf("%s (%s)", g.Architecture, g.ComputeCapability)
	case g.Architecture != "":
		return g.Architecture
	case g.ComputeCapability != "":
		return "compute capability " + g.ComputeCapability
	}
	return "an unknown architecture"
}

// ResetAlone says whether g can be reset without its NVLink peers, and why,
// by nvidia-smi's rule for --gpu-reset: from Ampere on, a GPU with NVLinks
// can be reset alone, except on an Ampere NVSwitch system without Fabric
// Manager (Hopper and later need no Fabric Manager for it); before Ampere,
// every GPU with an NVLink to one being reset must be reset in the same
// call. What is not known is taken the strict way.
func ResetAlone(g GPU, fm FabricManager) (bool, string) {
	if len(g.NVLinkPeers) == 0 {
		return true, "no NVLink peers"
	}
	gen := generation(g)
	switch {
	case gen == 0:
		return false, "its architecture is unknown, so it is taken as older than Ampere, whose NVLink peers are reset only together (conservative)"
	case gen < 8:
		return false, describe(g) + " is older than Ampere: its NVLink peers are reset only together with it"
	case !g.NVSwitch:
		return true, describe(g) + " with direct NVLinks is reset alone"
	case gen >= 9:
		return true, describe(g) + " on NVSwitch is reset alone (from Hopper on, without Fabric Manager)"
	case fm == FabricManagerRunning:
		return true, describe(g) + " on NVSwitch with Fabric Manager running is reset alone"
	case fm == FabricManagerNotRunning:
		return false, describe(g) + " on NVSwitch without Fabric Manager: its NVLink peers are reset only together with it"
	}
	return false, describe(g) + " on NVSwitch, Fabric Manager's state unknown: taken as not running, so its NVLink peers are reset only together with it (conservative)"
}

// resetGroup is every GPU a reset of uuid must include, uuid first, and why
// when it is more than uuid: the rule applies to each GPU being reset, so
// the group is closed over it.
func (m *Machine) resetGroup(uuid string) ([]string, string) {
	group := []string{uuid}
	var why []string
	for i := 0; i < len(group); i++ {
		g, ok := m.node[group[i]]
		if !ok {
			continue
		}
		alone, reason := ResetAlone(g, m.fm)
		if alone {
			continue
		}
		added := false
		for _, p := range g.NVLinkPeers {
			if _, known := m.node[p]; known && !slices.Contains(group, p) {
				group = append(group, p)
				added = true
			}
		}
		if added {
			why = append(why, g.UUID+": "+reason)
		}
	}
	if len(group) == 1 {
		return group, ""
	}
	return group, strings.Join(why, "; ")
}

package draslice

import (
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// ChannelDeviceName is the name of a node's IMEX channel device: one per
// node, as a node takes part in one ComputeDomain at a time (NVIDIA's
// driver does the same), so the scheduler itself keeps a second domain
// off a node whose channel a claim holds.
const ChannelDeviceName = "imex-channel"

// ChannelDevice is the node's IMEX channel device for ComputeDomain
// claims, with the clique of its GPUs (cliqueID, fabricClusterUUID, the
// GPUs' own attributes) so a claim's selector can keep a job in one
// clique. ok is false when no GPU completed its fabric registration: the
// node is in no multi-node NVLink domain and publishes none. The GPUs of
// one node share a clique; the first registered GPU's is taken.
func ChannelDevice(gpus []nvml.GPU) (Device, bool) {
	for _, g := range gpus {
		if !g.Fabric.Registered() {
			continue
		}
		clique := g.Fabric.ClusterUUID + "." + strconv.FormatUint(uint64(g.Fabric.CliqueID), 10)
		return Device{
			Name: ChannelDeviceName,
			Attributes: map[string]Attribute{
				"type":              str(TypeChannel),
				"cliqueID":          str(clique),
				"fabricClusterUUID": str(g.Fabric.ClusterUUID),
			},
			ID:   ChannelDeviceName,
			Type: TypeChannel,
		}, true
	}
	return Device{}, false
}

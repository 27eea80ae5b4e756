package daemon

import (
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// migClaims is a front-end whose claims create MIG instances on the GPUs
// sharing.migPartitions selects.
type migClaims interface {
	UsePartitions(p *nvml.Partitioner)
}

// migPartitions hands fe an NVML partitioner when sharing.migPartitions is
// on, and says which GPUs (by position) are partitioned. A library that
// cannot create instances is said once; the GPUs are then served as
// without the setting.
func migPartitions(cfg config.Config, lib nvml.Library, fe FrontEnd, gpus []nvml.GPU, log *slog.Logger) []bool {
	c, ok := fe.(migClaims)
	if !ok || !cfg.Sharing.MIGPartitions.Enabled {
		return nil
	}
	p, err := nvml.NewPartitioner(lib, log)
	if err != nil {
		log.Error("sharing.migPartitions is set, and no GPU is partitioned", "err", err)
		return nil
	}
	c.UsePartitions(p)
	partitioned := MIGPartitioned(cfg)
	out := make([]bool, len(gpus))
	for i, g := range gpus {
		out[i] = g.MIGEnabled && partitioned(g)
	}
	return out
}

// withPartitioned gives each partitioned GPU one health part standing for
// every instance claims create on it, reported under the GPU's UUID (the
// ID its placements carry): MIG mode is how it is served, not a fault, and
// an XID on any of its instances reaches every claim on it.
func withPartitioned(parts [][]health.Part, partitioned []bool, gpus []nvml.GPU) [][]health.Part {
	for i, on := range partitioned {
		if on && i < len(parts) {
			parts[i] = append(parts[i], health.Part{ID: gpus[i].UUID, GPUInstance: health.AnyInstance})
		}
	}
	return parts
}

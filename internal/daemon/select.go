package daemon

import (
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvcaps"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// selectGPUs takes the GPUs that excludeGPUs and includeGPUs leave out of inv
// (they get no resource, CDI device, label or health check) and returns
// them, for list to show, with the entries that name no GPU, each warned
// about: includeGPUs: [H100] would otherwise serve nothing in silence. It
// reads each MIG device's capability minors from procfs, leaving out one
// without them.
func selectGPUs(cfg config.Config, inv *nvml.Inventory, log *slog.Logger) ([]nvml.GPU, []config.UnmatchedGPU) {
	names := make([]config.GPUName, len(inv.GPUs))
	for i, g := range inv.GPUs {
		names[i] = config.GPUName{Index: g.Index, UUID: g.UUID, PCIBusID: g.PCIBusID, Model: g.Name}
	}
	unmatched := cfg.UnmatchedGPUs(names)
	for _, u := range unmatched {
		log.Warn(u.String(), "setting", u.Key, "entry", u.Entry)
	}
	left := inv.Select(func(g nvml.GPU) bool { return cfg.GPUSelected(g.Index, g.UUID, g.PCIBusID, g.Name) })
	for _, g := range left {
		log.Info("GPU excluded (excludeGPUs, includeGPUs)", "index", g.Index, "uuid", g.UUID, "name", g.Name, "device", g.PCIBusID)
	}
	inv.GPUs = nvcaps.AddMIG(cfg.ProcRoot, inv.GPUs, log)
	return left, unmatched
}

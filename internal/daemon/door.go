package daemon

import (
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
)

// runtimeDoor reads once, at start, whether the container runtime lets any
// pod see every GPU through NVIDIA_VISIBLE_DEVICES, and says so in the log,
// the metric and the GPU condition's message (mets and rep may be nil).
func runtimeDoor(cfg config.Config, mets *metrics.Metrics, rep *reporting, log *slog.Logger) {
	if cfg.RuntimeConfigRoot == "" {
		return
	}
	d := runtimes.Inspect(cfg.RuntimeConfigRoot)
	switch d.State {
	case runtimes.Open:
		log.Warn("any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES in its image or env: the container runtime runs NVIDIA's runtime for every container and accepts the variable from unprivileged ones",
			"runtime", d.Runtime, "config", d.ConfigPath, "key", d.Key, "mode", d.Mode, "fix", d.Fix)
	case runtimes.Unknown:
		log.Warn("cannot tell whether pods can see every GPU through NVIDIA_VISIBLE_DEVICES: a container runtime config is unreadable",
			"runtime", d.Runtime, "config", d.ConfigPath, "err", d.Err)
	default:
		log.Info("container runtime checked: NVIDIA_VISIBLE_DEVICES opens no GPU to pods that do not ask for one",
			"reason", d.Reason, "runtime", d.Runtime, "config", d.ConfigPath)
	}
	if mets != nil {
		mets.SetRuntimeDoor(d.IsOpen(), d.Runtime, d.Reason)
	}
	if rep != nil && cfg.NodeCondition {
		rep.rep.SetRemark(report.GPU, d.Sentence())
	}
}

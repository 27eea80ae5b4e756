package daemon

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
)

// CDIOptions are the settings of the CDI specs on disk, copied from cfg;
// the serve process and cdi generate both use them.
func CDIOptions(cfg config.Config) ondisk.Options {
	o := ondisk.Options{
		SpecDir:        cfg.CDISpecDir,
		CDI:            cfg.UsesCDI(),
		DRA:            cfg.KubeletAPI == config.KubeletAPIDRA,
		DriverRoot:     cfg.DriverRoot,
		HostDriverRoot: cfg.HostDriverRoot,
		DevRoot:        cfg.DevRoot,
		HookPath:       cfg.CDIHookPath,
	}
	if cfg.KubeletAPI != config.KubeletAPIDRA {
		o.IMEXChannels = cfg.IMEX.ChannelIDs
	}
	for _, r := range cfg.NICResources {
		o.NICResources = append(o.NICResources, r.Name)
	}
	return o
}

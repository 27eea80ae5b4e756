package daemon

import (
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/cordon"
)

// cordonOn says whether cfg cordons the Node while a GPU needs a reboot:
// remediation.cordon, with a remediation that runs.
func cordonOn(cfg config.Config) bool {
	return cfg.Remediation.Cordon && remediationOff(cfg) == ""
}

// nodeCordon is the Keeper of the Node's cordon for the remediation; nil
// unless cordonOn (api is then not nil, newAPIAccess). Its Events go
// through rep when there is one.
func nodeCordon(cfg config.Config, api *apiAccess, rep *reporting, log *slog.Logger) (*cordon.Keeper, error) {
	if !cordonOn(cfg) {
		return nil, nil
	}
	o := cordon.Options{Node: api.node, Log: log}
	if rep != nil {
		o.Events = rep.rep
	}
	return cordon.New(api.client, o)
}

// cordoner is k as the remediation takes it: no Cordoner when k is nil.
func cordoner(k *cordon.Keeper) remediate.Cordoner {
	if k == nil {
		return nil
	}
	return k
}

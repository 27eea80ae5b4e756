package daemon

import (
	"fmt"
	"log/slog"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/imexchan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/nicscan"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// The translations from the settings to the option values each part of
// the model and the front-ends takes: plain field copies, made once here,
// so that no part below reads the whole configuration.

// HealthPolicy is the health part of the configuration.
func HealthPolicy(c config.Config) policy.Policy {
	return policy.Policy{
		IgnoredXIDs:    c.XIDIgnore,
		FatalXIDs:      c.XIDFatal,
		XIDs:           xidActions(c.XIDOverrides()),
		XIDRecovery:    c.XIDRecoveryPeriod.Duration,
		PollInterval:   c.HealthPollInterval.Duration,
		ThermalMarginC: c.ThermalMarginC,
		RecoveryPolls:  c.HealthRecoveryPolls,

		SlowdownSamples:  c.HealthSlowdownSamples,
		NVMLFailurePolls: c.HealthNVMLFailurePolls,
		Disabled:         c.HealthChecksDisabled,
	}
}

// xidActions is the xids setting as health's actions.
func xidActions(classes map[uint64]string) map[uint64]policy.XIDAction {
	if len(classes) == 0 {
		return nil
	}
	out := make(map[uint64]policy.XIDAction, len(classes))
	for x, c := range classes {
		out[x] = policy.Action(xid.Class(c))
	}
	return out
}

// TimeSlicing is the time-slicing section's replicas.
func TimeSlicing(c config.Config) sharing.TimeSlicing {
	t := c.Sharing.TimeSlicing
	return sharing.TimeSlicing{
		Rules:                      rules(t.RenameByDefault, t.Resources),
		Placement:                  t.Placement,
		FailRequestsGreaterThanOne: t.FailRequestsGreaterThanOne,
	}
}

// MPS is the MPS section's replicas and shares. Its
// failRequestsGreaterThanOne is NVIDIA's, and means the default: one share
// per container.
func MPS(c config.Config) sharing.MPS {
	m := c.Sharing.MPS
	return sharing.MPS{Rules: rules(m.RenameByDefault, m.Resources), MaxSharesPerContainer: m.MaxSharesPerContainer}
}

func rules(renameByDefault bool, rs []config.SharedResource) sharing.Rules {
	out := sharing.Rules{RenameByDefault: renameByDefault}
	for _, r := range rs {
		out.Resources = append(out.Resources, sharing.Resource{Name: r.Name, Rename: r.Rename, Replicas: r.Replicas, Devices: r.Devices})
	}
	return out
}

// LayoutOptions are the settings the device-plugin layout takes.
func LayoutOptions(c config.Config) layout.Options {
	return layout.Options{
		MIGStrategy: c.MIGStrategy,
		IDStrategy:  c.DeviceIDStrategy,
		Strategies:  c.DeviceListStrategy,
		DevRoot:     c.DevRoot,
		MPSRoot:     c.MPSRoot,
		TimeSlicing: TimeSlicing(c),
		MPS:         MPS(c),
	}
}

// IMEXChannels are the IMEX channels device-plugin mode readies and
// injects (imex.channelIDs, imex.required).
func IMEXChannels(c config.Config) imexchan.Options {
	return imexchan.Options{IDs: c.IMEX.ChannelIDs, Required: c.IMEX.Required, ProcRoot: c.ProcRoot, DevRoot: c.DevRoot}
}

// LabelFacts are the settings the node labels take.
func LabelFacts(c config.Config) nodelabels.Facts {
	return nodelabels.Facts{MIGStrategy: c.MIGStrategy, TimeSlicing: TimeSlicing(c), MPS: MPS(c), SysfsRoot: c.SysfsRoot}
}

// LabelDelivery is where the node labels go; node is the Node's name,
// needed by nodeLabels: node only.
func LabelDelivery(c config.Config, node string) nodelabels.Delivery {
	return nodelabels.Delivery{Mode: c.NodeLabels, NFDFeaturesDir: c.NFDFeaturesDir, Node: node, Namespace: c.PodNamespace, Pod: c.PodName}
}

// MemoryShares are the GPUs sharing.memoryShares shares through DRA, and
// the smallest share.
func MemoryShares(c config.Config) draslice.MemoryShares {
	m := c.Sharing.MemoryShares
	if !m.Enabled {
		return draslice.MemoryShares{}
	}
	return draslice.MemoryShares{Selects: func(g nvml.GPU) bool { return m.Selects(g.Index, g.UUID, g.PCIBusID, g.Name) }, Minimum: m.MinimumBytes()}
}

// MIGPartitioned says whether sharing.migPartitions selects a GPU (in MIG
// mode, for claims to create instances on).
func MIGPartitioned(c config.Config) func(nvml.GPU) bool {
	m := c.Sharing.MIGPartitions
	return func(g nvml.GPU) bool { return m.Selects(g.Index, g.UUID, g.PCIBusID, g.Name) }
}

// NICPools are the pools of nicResources, before their first scan.
func NICPools(c config.Config, log *slog.Logger) (*nic.Pools, error) {
	pools, err := nic.NewPools(c.NICResources, nic.Options{DevRoot: c.DevRoot, Strategies: c.DeviceListStrategy, Log: log})
	if err != nil {
		return nil, fmt.Errorf("NIC pools: %w", err)
	}
	return pools, nil
}

// NICScan are the settings of the NIC rescans; the caller adds where the
// scans go.
func NICScan(c config.Config) nicscan.Options {
	return nicscan.Options{SysfsRoot: c.SysfsRoot, ProcRoot: c.ProcRoot, Interval: c.NICRescanInterval.Duration}
}

// RemediationPolicy is what the remediation section allows.
func RemediationPolicy(c config.Config) remedy.Policy {
	r := c.Remediation
	return remedy.Policy{
		Reset: r.Reset, Evict: r.Evict, GracePeriod: r.GracePeriod.Duration, MaxResets: r.MaxResets,
		Window: r.Window.Duration, ResetPeers: r.ResetPeers, Cordon: r.Cordon,
	}
}

// RemediationOptions are the remediation's settings; the daemon adds the
// GPUs and what carries the commands out.
func RemediationOptions(c config.Config) remediate.Options {
	return remediate.Options{Policy: RemediationPolicy(c), UsagePoll: c.Remediation.UsagePoll.Duration}
}

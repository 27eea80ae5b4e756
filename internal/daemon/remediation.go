package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/state"
)

// remediationStateFile is the file in cfg.StateDir that keeps the GPUs'
// remediation, beside healthStateFile.
const remediationStateFile = "remediation.json"

// remediation builds the GPUs' remediation, in the notifier chain before
// next; nil unless remediation.enabled, or without a stateDir (a reset must
// be on disk before it starts).
// parts are the device IDs health reports each GPU as, by position; cord
// cordons the Node (nil: never). The returned MPS holder gets the MPS
// manager once there is one.
func remediation(cfg config.Config, lib nvml.Library, inv *nvml.Inventory, units []servedUnit, parts [][]health.Part, fe FrontEnd, rep *reporting, cord remediate.Cordoner, mets *metrics.Metrics, next health.Notifier, log *slog.Logger) (*remediate.Service, *mpsHold, *remediate.NVMLGPUs, error) {
	switch remediationOff(cfg) {
	case "":
	case offNoStateDir:
		log.Warn("GPU remediation is off: it keeps its state in stateDir, which is empty; set stateDir (--state-dir), or remediation.enabled to false")
		return nil, nil, nil, nil
	default:
		return nil, nil, nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("finding this executable, which runs the CUDA probe confined: %w", err)
	}
	o := RemediationOptions(cfg)
	o.Log, o.Driver, o.Pool = log, config.DRADriverName, poolName(cfg)
	_, deviceplugin := fe.(laidOut)
	peers := remedy.GPUsOf(inv)
	for i, g := range inv.GPUs {
		rg := remediate.GPU{GPU: peers[i]}
		if i < len(parts) {
			for _, p := range parts[i] {
				rg.Units = append(rg.Units, p.ID)
			}
		}
		for _, su := range units {
			if su.unit.Pos == i && len(su.ids) > 0 {
				rg.Names = append(rg.Names, podresources.Names{Resource: su.resource, IDs: su.ids})
			}
		}
		if !deviceplugin {
			rg.DRADevice = draslice.GPUDeviceName(g)
		}
		o.GPUs = append(o.GPUs, rg)
	}
	if cfg.PodResourcesSocket != "" {
		o.Holders = podresources.Client{Socket: cfg.PodResourcesSocket}.Holders
	}
	if e, ok := fe.(evicter); ok && !deviceplugin {
		o.Evicter = e
	}
	if rep != nil {
		o.Reporter = remediationReporter{rep.rep}
	}
	o.Cordoner = cord
	if mets != nil {
		o.Metrics = mets.Remediation()
	}
	store := remediationStore(cfg)
	o.Store = store
	hold := &mpsHold{}
	o.MPS = hold
	gpus := &remediate.NVMLGPUs{
		Resetter:       nvml.NewResetter(lib),
		GPUs:           inv.GPUs,
		SetComputeMode: func(uuid string, exclusive bool) error { return nvml.SetComputeMode(lib, uuid, exclusive) },
	}
	o.Resetter = gpus
	o.Prober = remediate.CUDAProbe{
		Options: cudaprobe.Options{Self: self, DriverRoot: cfg.DriverRoot, DevRoot: cfg.DevRoot, SysRoot: cfg.SysfsRoot},
		GPUs:    inv.GPUs,
	}
	svc, err := remediate.New(o, next)
	if err != nil {
		return nil, nil, nil, err
	}
	log.Info("remediating faulted GPUs", "reset", o.Policy.Reset, "evict", o.Evicter != nil && o.Policy.Evict, "cordon", o.Cordoner != nil && o.Policy.Cordon, "path", store.Path)
	return svc, hold, gpus, nil
}

// Why the remediation is off, as the release command is told.
const (
	offDisabled   = "remediation.enabled is false"
	offNoStateDir = "stateDir is empty, and the remediation keeps its state there"
)

// remediationOff says why cfg runs no remediation; "" when it runs one.
func remediationOff(cfg config.Config) string {
	switch {
	case !cfg.Remediation.Enabled:
		return offDisabled
	case cfg.StateDir == "":
		return offNoStateDir
	}
	return ""
}

// remediationStore is remediation.json in stateDir, tagged with the boot:
// the service saves there, and list reads it.
func remediationStore(cfg config.Config) state.Store {
	return state.Store{
		Path:       filepath.Join(cfg.StateDir, remediationStateFile),
		BootIDPath: filepath.Join(cfg.ProcRoot, "sys", "kernel", "random", "boot_id"),
	}
}

// evicter is a front-end that evicts a GPU's pods through its device
// taints (DRA).
type evicter interface {
	Evict(uuid string, on bool)
}

// remediationReporter passes the remediation's Events and reboot to the
// reporter.
type remediationReporter struct{ rep *report.Reporter }

func (r remediationReporter) Event(gpu, reason, msg string) {
	r.rep.Event(resname.GPU, gpu, "", reason, msg, reason != remediate.EventGivenBack)
}

func (r remediationReporter) NodeReboot(reason string, on bool) {
	if !on {
		reason = ""
	}
	r.rep.SetReboot(report.GPU, reason)
}

// mpsHold holds a GPU's MPS daemon for the remediation, once the manager
// is known; without one no GPU has a daemon.
type mpsHold struct{ m *mpsd.Manager }

func (h *mpsHold) Running(uuid string) bool {
	if h.m == nil {
		return false
	}
	s, ok := h.m.State(uuid)
	return ok && s.Up
}

func (h *mpsHold) Stop(_ context.Context, uuid string) error {
	if h.m == nil {
		return nil
	}
	h.m.HoldFor(uuid, mpsd.HolderRemediation, true, "withheld by its remediation")
	return nil
}

func (h *mpsHold) Start(uuid string) {
	if h.m != nil {
		h.m.HoldFor(uuid, mpsd.HolderRemediation, false, "")
	}
}

// ValidateConfig is cfg.ValidateFrom with the remediation's policy
// checked by package remedy, each mistake one line naming its key.
func ValidateConfig(cfg config.Config, from func(key string) string) error {
	return cfg.ValidateWith(from, func(c config.Config, field func(string) string) []error {
		var out []error
		for _, err := range RemediationPolicy(c).Validate() {
			var fe *remedy.FieldError
			if errors.As(err, &fe) {
				out = append(out, errors.New("config: "+field("remediation."+fe.Field)+": "+fe.Msg))
				continue
			}
			out = append(out, errors.New("config: remediation: "+err.Error()))
		}
		return out
	})
}

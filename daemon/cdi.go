package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// specStore owns the plugin's CDI spec files: one per resource kind,
// rewritten when that kind's devices change. The GPU and NIC goroutines
// both publish, so writes are serialised here.
type specStore struct {
	mu     sync.Mutex
	writer cdi.Writer
	paths  map[string]string // kind -> file
	log    *slog.Logger
}

// newSpecStore removes specs an earlier run left behind; nil when no
// strategy needs CDI.
func newSpecStore(cfg config.Config, log *slog.Logger) (*specStore, error) {
	if !cfg.UsesCDI() {
		return nil, nil
	}
	s := &specStore{writer: cdi.Writer{Dir: cfg.CDISpecDir, Owner: cdi.DefaultOwner}, paths: map[string]string{}, log: log}
	if err := s.writer.RemoveAll(); err != nil {
		return nil, fmt.Errorf("removing stale CDI specs in %s: %w", cfg.CDISpecDir, err)
	}
	return s, nil
}

// publish writes kind's spec, or removes its file when spec is nil. A spec
// that fails validation is logged and not written; the old file stays.
func (s *specStore) publish(kind string, spec *specs.Spec) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec == nil {
		if p, ok := s.paths[kind]; ok {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("removing CDI spec", "resource", kind, "path", p, "err", err)
			}
			delete(s.paths, kind)
		}
		return
	}
	p, err := s.writer.Write(spec)
	if err != nil {
		s.log.Error("writing CDI spec", "resource", kind, "err", err)
		return
	}
	s.paths[kind] = p
	s.log.Info("wrote CDI spec", "resource", kind, "path", p, "devices", len(spec.Devices))
}

// close removes every spec on clean shutdown, so no runtime injects
// devices the plugin no longer vouches for.
func (s *specStore) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writer.RemoveAll(); err != nil {
		s.log.Warn("removing CDI specs", "err", err)
	}
}

// GPUSpec builds the nvidia.com/gpu spec for the configured driver root.
// A driver root without NVML's library still yields device nodes.
func GPUSpec(cfg config.Config, gpus []nvml.GPU, log *slog.Logger) (*specs.Spec, error) {
	driver, err := cdi.FindDriver(cfg.DriverRoot)
	if err != nil {
		if !errors.Is(err, cdi.ErrNoDriver) {
			return nil, fmt.Errorf("finding driver files under %s: %w", cfg.DriverRoot, err)
		}
		log.Warn("no driver libraries found for the CDI spec; it will carry device nodes only", "driverRoot", cfg.DriverRoot, "err", err)
	}
	if cfg.HostDriverRoot != "" {
		driver = driver.Rebase(cfg.HostDriverRoot)
	}
	return cdi.GPUSpec(gpus, driver, cfg.DevRoot)
}

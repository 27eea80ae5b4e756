package metrics

import (
	"fmt"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// CDIHook is gpu_device_plugin_cdi_hook_installed.
type CDIHook struct{ g *exposition.Gauge }

// RegisterCDIHook registers gpu_device_plugin_cdi_hook_installed with reg,
// at 0 until Set.
func RegisterCDIHook(reg *exposition.Registry) (*CDIHook, error) {
	g := exposition.NewGauge(exposition.Desc{Name: "gpu_device_plugin_cdi_hook_installed",
		Help: "1 when the GPU CDI spec runs " + cdi.HookName + " (libcuda.so link, ld cache), 0 when cdiHookPath names no installed hook or is empty."})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("registering the CDI hook's metric: %w", err)
	}
	return &CDIHook{g}, nil
}

// Set says whether the GPU CDI spec runs the hook.
func (h *CDIHook) Set(installed bool) { h.g.Set(one(installed)) }

package nvidia

import (
	"fmt"
	"maps"

	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// ConfigYAML is r as our config file.
func (r Result) ConfigYAML() ([]byte, error) {
	if len(r.Config) == 0 {
		return []byte("{}\n"), nil
	}
	out, err := yaml.Marshal(r.Config)
	if err != nil {
		return nil, fmt.Errorf("writing the converted config: %w", err)
	}
	return out, nil
}

// Values is r as values for our Helm chart (deploy/helm/gpu-device-plugin):
// the chart sets the paths and deviceListStrategy from values of their
// own, and passes the rest through as config. notes lists what the chart
// decides itself and so is left out.
func (r Result) Values() (values map[string]any, notes []string) {
	cfg := maps.Clone(r.Config)
	values = map[string]any{}
	// The chart mounts the host's driver root at a fixed path and wants
	// the host's path.
	if host, ok := cfg["hostDriverRoot"]; ok {
		values["driverRoot"] = host
	} else if root, ok := cfg["driverRoot"]; ok {
		values["driverRoot"] = root
	}
	delete(cfg, "hostDriverRoot")
	delete(cfg, "driverRoot")
	for _, k := range []string{"deviceListStrategy", "devicePluginDir"} {
		if v, ok := cfg[k]; ok {
			values[k] = v
			delete(cfg, k)
		}
	}
	// The chart passes --node-labels from its own value, and gives the pod
	// the access and namespace the mode needs.
	if v, ok := cfg["nodeLabels"]; ok {
		values["nodeLabels"] = map[string]any{"mode": v}
		delete(cfg, "nodeLabels")
	}
	if v, ok := cfg["devRoot"]; ok {
		if v != "/dev" {
			notes = append(notes, fmt.Sprintf("devRoot: %v left out: the chart mounts the host's /dev; device nodes elsewhere need extraVolumes and --dev-root in extraArgs", v))
		}
		delete(cfg, "devRoot")
	}
	if len(cfg) > 0 {
		values["config"] = cfg
	}
	return values, notes
}

// Check loads a converted config as the plugin would, so that migrate
// never prints a file the plugin refuses. podNamespace, which nodeLabels
// nodefeature needs, is the pod's own (the chart sets it from the downward
// API), not NVIDIA's setting: it is taken as given.
func Check(cfg map[string]any) error {
	if cfg["nodeLabels"] == config.NodeLabelsNodeFeature && cfg["podNamespace"] == nil {
		cfg = maps.Clone(cfg)
		cfg["podNamespace"] = "gpu-device-plugin"
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("writing the converted config: %w", err)
	}
	c, err := config.Parse("converted config", data)
	if err != nil {
		return err
	}
	return c.Validate()
}

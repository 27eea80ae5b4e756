package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// Setting names one config key and its flag and environment twins.
type Setting struct {
	Key      string
	Flag     string
	Env      string
	Usage    string
	Default  string
	Category string // the group help and the settings reference list it under
}

// Categories lists the setting categories in order.
func Categories() []string {
	return []string{CategoryKubelet, CategoryDriver, CategoryHealth, CategoryCDI, CategoryNICs, CategoryDRA, CategoryReporting, CategoryLogging}
}

// EnvPrefix starts every environment variable the plugin reads.
const EnvPrefix = "GPU_DEVICE_PLUGIN_"

// Settings lists every key with its flag and environment variable.
func Settings() []Setting {
	d := Default()
	s := []Setting{
		{Key: "devicePluginDir", Category: CategoryKubelet, Flag: "device-plugin-dir", Default: d.DevicePluginDir, Usage: "the kubelet's device-plugin directory (sockets)"},
		{Key: "driverRoot", Category: CategoryDriver, Flag: "driver-root", Default: d.DriverRoot, Usage: "root of the NVIDIA driver installation, where libnvidia-ml.so.1 is searched"},
		{Key: "nvmlLibrary", Category: CategoryDriver, Flag: "nvml-library", Default: d.NVMLLibrary, Usage: "path of libnvidia-ml.so.1 (overrides the search under --driver-root)"},
		{Key: "sysfsRoot", Category: CategoryDriver, Flag: "sysfs-root", Default: d.SysfsRoot, Usage: "where sysfs is mounted"},
		{Key: "devRoot", Category: CategoryDriver, Flag: "dev-root", Default: d.DevRoot, Usage: "the host's /dev, as this process and the container runtime both see it"},
		{Key: "deviceIDStrategy", Category: CategoryKubelet, Flag: "device-id-strategy", Default: d.DeviceIDStrategy, Usage: "how NVIDIA_VISIBLE_DEVICES names GPUs: uuid or index"},
		{Key: "migStrategy", Category: CategoryKubelet, Flag: "mig-strategy", Default: d.MIGStrategy, Usage: "how the device-plugin API serves MIG devices: " + MIGStrategyNone + " (no MIG device is served), " + MIGStrategySingle + " (MIG devices of one profile, as nvidia.com/gpu) or " + MIGStrategyMixed + " (nvidia.com/mig-<profile> per profile, nvidia.com/gpu for GPUs without MIG); DRA mode publishes MIG devices whatever it says"},
		{Key: "nvmlRetryInterval", Category: CategoryDriver, Flag: "nvml-retry-interval", Default: d.NVMLRetryInterval.String(), Usage: "how often to retry loading NVML when the driver is missing"},
		{Key: "logLevel", Category: CategoryLogging, Flag: "log-level", Default: d.LogLevel, Usage: "debug, info, warn or error"},
		{Key: "logFormat", Category: CategoryLogging, Flag: "log-format", Default: d.LogFormat, Usage: "text or json"},
		{Key: "healthPollInterval", Category: CategoryHealth, Flag: "health-poll-interval", Default: d.HealthPollInterval.String(), Usage: "how often GPU temperature and clock-event reasons are read"},
		{Key: "xidIgnore", Category: CategoryHealth, Flag: "xid-ignore", Default: formatList(d.XIDIgnore), Usage: "comma-separated XIDs caused by applications, which leave the GPU healthy"},
		{Key: "xidFatal", Category: CategoryHealth, Flag: "xid-fatal", Default: formatList(d.XIDFatal), Usage: "comma-separated XIDs that keep a GPU unhealthy until the driver says it was reset (its recovery action, R550 and later; on older drivers until the GPU is reset and health.json in --state-dir removed); wins over --xid-ignore"},
		{Key: "xidRecoveryPeriod", Category: CategoryHealth, Flag: "xid-recovery-period", Default: d.XIDRecoveryPeriod.String(), Usage: "how long a GPU stays unhealthy after any other XID; 0s keeps it unhealthy"},
		{Key: "thermalMarginC", Category: CategoryHealth, Flag: "thermal-margin", Default: strconv.Itoa(d.ThermalMarginC), Usage: "degrees C below the slowdown threshold a GPU must cool to before it is healthy again"},
		{Key: "healthRecoveryPolls", Category: CategoryHealth, Flag: "health-recovery-polls", Default: strconv.Itoa(d.HealthRecoveryPolls), Usage: "consecutive good polls that clear a thermal, power-brake or lost-GPU condition"},
		{Key: "metricsAddress", Category: CategoryReporting, Flag: "metrics-address", Default: d.MetricsAddress, Usage: "host:port to serve Prometheus metrics on; empty turns them off"},
		{Key: "deviceListStrategy", Category: CategoryKubelet, Flag: "device-list-strategy", Default: strings.Join(d.DeviceListStrategy, ","), Usage: "comma-separated: envvar, cdi-cri, cdi-annotations"},
		{Key: "cdiSpecDir", Category: CategoryCDI, Flag: "cdi-spec-dir", Default: d.CDISpecDir, Usage: "where CDI specs are written when a cdi-* strategy is on"},
		{Key: "hostDriverRoot", Category: CategoryCDI, Flag: "host-driver-root", Default: d.HostDriverRoot, Usage: "the driver root as the container runtime sees it, when it differs from --driver-root (CDI specs use it); empty: the same"},
		{Key: "cdiHookPath", Category: CategoryCDI, Flag: "cdi-hook-path", Default: d.CDIHookPath, Usage: "where the container runtime finds gpu-device-plugin-cdi-hook on the host (the GPU CDI spec's createContainer hook: libcuda.so link, ld cache); empty leaves the hook out"},
		{Key: "healthSlowdownSamples", Category: CategoryHealth, Flag: "health-slowdown-samples", Default: strconv.Itoa(d.HealthSlowdownSamples), Usage: "consecutive polls showing hardware slowdown or power brake before a GPU is unhealthy (they flicker under load on some SKUs)"},
		{Key: "healthNVMLFailurePolls", Category: CategoryHealth, Flag: "health-nvml-failure-polls", Default: strconv.Itoa(d.HealthNVMLFailurePolls), Usage: "consecutive polls in which no GPU can be read before every GPU is unhealthy"},
		{Key: "healthChecksDisabled", Category: CategoryHealth, Flag: "health-checks-disabled", Default: strings.Join(d.HealthChecksDisabled, ","), Usage: "comma-separated checks to turn off: " + strings.Join(policy.Checks(), ", ")},
		{Key: "stateDir", Category: CategoryHealth, Flag: "state-dir", Default: d.StateDir, Usage: "where conditions that must survive a plugin restart (fatal XID, reset required) are kept for this boot; empty keeps none"},
		{Key: "procRoot", Category: CategoryDriver, Flag: "proc-root", Default: d.ProcRoot, Usage: "the host's /proc, to find the NIC with the default route"},
		{Key: "deviceInfoDir", Category: CategoryNICs, Flag: "device-info-dir", Default: d.DeviceInfoDir, Usage: "where NIC pools write the device-information files CNI plugins read (Network Plumbing WG spec)"},
		{Key: "nicRescanInterval", Category: CategoryNICs, Flag: "nic-rescan-interval", Default: d.NICRescanInterval.String(), Usage: "how often NICs are rescanned for hot-plug and health"},
		{Key: "podResourcesSocket", Category: CategoryReporting, Flag: "pod-resources-socket", Default: d.PodResourcesSocket, Usage: "the kubelet's PodResources API socket, read to show which container holds each device (list, gpu_device_plugin_device_allocated, Events on pods); empty reads none"},
		{Key: "kubeletAPI", Category: CategoryKubelet, Flag: "kubelet-api", Default: d.KubeletAPI, Usage: "how devices reach the kubelet: " + KubeletAPIDevicePlugin + " (v1beta1 extended resources) or " + KubeletAPIDRA + " (Dynamic Resource Allocation: ResourceSlices, needs API access)"},
		{Key: "kubeconfig", Category: CategoryReporting, Flag: "kubeconfig", Default: d.Kubeconfig, Usage: "DRA mode, events and nodeCondition: kubeconfig file for API access; empty uses the pod's service account"},
		{Key: "nodeName", Category: CategoryReporting, Flag: "node-name", Default: d.NodeName, Usage: "DRA mode, events and nodeCondition: this node's name (the chart sets it from the downward API); empty uses the host name"},
		{Key: "podUID", Category: CategoryDRA, Flag: "pod-uid", Default: d.PodUID, Usage: "DRA mode: this pod's UID (the chart sets it); lets two plugin pods hand over during a rolling update"},
		{Key: "draPluginDir", Category: CategoryDRA, Flag: "dra-plugin-dir", Default: d.DRAPluginDir, Usage: "DRA mode: the kubelet's directory for this driver's socket and checkpoint"},
		{Key: "pluginRegistryDir", Category: CategoryDRA, Flag: "plugin-registry-dir", Default: d.PluginRegistryDir, Usage: "DRA mode: the kubelet's plugin registration directory"},
		{Key: "events", Category: CategoryReporting, Flag: "events", Default: strconv.FormatBool(d.Events), Usage: "true: a Kubernetes Event on the Node and on every pod holding a device at each device health change (needs API access)"},
		{Key: "nodeCondition", Category: CategoryReporting, Flag: "node-condition", Default: strconv.FormatBool(d.NodeCondition), Usage: "true: keep the Node conditions GPUHealthy (and NICHealthy with NIC pools) False while a device is unhealthy (needs API access)"},
	}
	for i := range s {
		s[i].Env = EnvName(s[i].Flag)
	}
	return s
}

// EnvName is the environment variable for a flag.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func formatList(xs []uint64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}

func parseList(key, value string) ([]uint64, error) {
	out := []uint64{}
	for _, f := range strings.Split(value, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("config: %s: %q is not a list of XID numbers (example: \"13,31,43\")", key, value)
		}
		out = append(out, x)
	}
	return out, nil
}

func keys() []string {
	var out []string
	for _, s := range Settings() {
		out = append(out, s.Key)
	}
	for _, f := range fileOnly {
		out = append(out, f.key)
	}
	return out
}

// Set assigns one key from its string form, as flags and environment
// variables give it.
func (c *Config) Set(key, value string) error {
	switch key {
	case "devicePluginDir":
		c.DevicePluginDir = value
	case "driverRoot":
		c.DriverRoot = value
	case "nvmlLibrary":
		c.NVMLLibrary = value
	case "sysfsRoot":
		c.SysfsRoot = value
	case "devRoot":
		c.DevRoot = value
	case "deviceIDStrategy":
		c.DeviceIDStrategy = value
	case "migStrategy":
		c.MIGStrategy = value
	case "nvmlRetryInterval":
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("config: nvmlRetryInterval: %q is not a duration (example: \"30s\")", value)
		}
		c.NVMLRetryInterval = Duration{d}
	case "logLevel":
		c.LogLevel = value
	case "logFormat":
		c.LogFormat = value
	case "healthPollInterval", "xidRecoveryPeriod":
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not a duration (example: \"5s\")", key, value)
		}
		if key == "healthPollInterval" {
			c.HealthPollInterval = Duration{d}
		} else {
			c.XIDRecoveryPeriod = Duration{d}
		}
	case "xidIgnore", "xidFatal":
		xs, err := parseList(key, value)
		if err != nil {
			return err
		}
		if key == "xidIgnore" {
			c.XIDIgnore = xs
		} else {
			c.XIDFatal = xs
		}
	case "thermalMarginC", "healthRecoveryPolls", "healthSlowdownSamples", "healthNVMLFailurePolls":
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not a whole number", key, value)
		}
		*map[string]*int{
			"thermalMarginC":         &c.ThermalMarginC,
			"healthRecoveryPolls":    &c.HealthRecoveryPolls,
			"healthSlowdownSamples":  &c.HealthSlowdownSamples,
			"healthNVMLFailurePolls": &c.HealthNVMLFailurePolls,
		}[key] = n
	case "healthChecksDisabled":
		c.HealthChecksDisabled = nil
		for _, f := range strings.Split(value, ",") {
			if f = strings.TrimSpace(f); f != "" {
				c.HealthChecksDisabled = append(c.HealthChecksDisabled, f)
			}
		}
	case "stateDir":
		c.StateDir = value
	case "metricsAddress":
		c.MetricsAddress = value
	case "deviceListStrategy":
		c.DeviceListStrategy = nil
		for _, f := range strings.Split(value, ",") {
			if f = strings.TrimSpace(f); f != "" {
				c.DeviceListStrategy = append(c.DeviceListStrategy, f)
			}
		}
	case "cdiSpecDir":
		c.CDISpecDir = value
	case "hostDriverRoot":
		c.HostDriverRoot = value
	case "cdiHookPath":
		c.CDIHookPath = value
	case "procRoot":
		c.ProcRoot = value
	case "deviceInfoDir":
		c.DeviceInfoDir = value
	case "podResourcesSocket":
		c.PodResourcesSocket = value
	case "kubeletAPI":
		c.KubeletAPI = value
	case "kubeconfig":
		c.Kubeconfig = value
	case "nodeName":
		c.NodeName = value
	case "podUID":
		c.PodUID = value
	case "draPluginDir":
		c.DRAPluginDir = value
	case "pluginRegistryDir":
		c.PluginRegistryDir = value
	case "events", "nodeCondition":
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not true or false", key, value)
		}
		if key == "events" {
			c.Events = b
		} else {
			c.NodeCondition = b
		}
	case "nicRescanInterval":
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not a duration (example: \"10s\")", key, value)
		}
		c.NICRescanInterval = Duration{d}
	default:
		return fmt.Errorf("config: unknown key %q", key)
	}
	return nil
}

// Setting categories, in the order help and docs show them.
const (
	CategoryKubelet   = "Kubelet"
	CategoryDriver    = "NVML and driver"
	CategoryHealth    = "Health"
	CategoryCDI       = "CDI"
	CategoryNICs      = "NICs"
	CategoryDRA       = "DRA"
	CategoryReporting = "Reporting"
	CategoryLogging   = "Logging"
)

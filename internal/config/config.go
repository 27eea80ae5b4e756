package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// Config is every setting of the plugin. The YAML keys are the JSON tags.
type Config struct {
	DevicePluginDir   string   `json:"devicePluginDir"`
	DriverRoot        string   `json:"driverRoot"`
	NVMLLibrary       string   `json:"nvmlLibrary"`
	SysfsRoot         string   `json:"sysfsRoot"`
	DevRoot           string   `json:"devRoot"`
	DeviceIDStrategy  string   `json:"deviceIDStrategy"`
	MIGStrategy       string   `json:"migStrategy"` // MIGStrategy*: how the device-plugin API serves MIG devices
	NVMLRetryInterval Duration `json:"nvmlRetryInterval"`
	LogLevel          string   `json:"logLevel"`
	LogFormat         string   `json:"logFormat"`

	HealthPollInterval  Duration `json:"healthPollInterval"`
	XIDIgnore           []uint64 `json:"xidIgnore"`
	XIDFatal            []uint64 `json:"xidFatal"`
	XIDRecoveryPeriod   Duration `json:"xidRecoveryPeriod"`
	ThermalMarginC      int      `json:"thermalMarginC"`
	HealthRecoveryPolls int      `json:"healthRecoveryPolls"`
	// HealthSlowdownSamples and HealthNVMLFailurePolls: see policy.Policy.
	HealthSlowdownSamples  int      `json:"healthSlowdownSamples"`
	HealthNVMLFailurePolls int      `json:"healthNVMLFailurePolls"`
	HealthChecksDisabled   []string `json:"healthChecksDisabled"`
	// StateDir keeps what must survive a plugin restart on one boot
	// (conditions only the driver or a reboot clears); empty keeps nothing.
	StateDir       string `json:"stateDir"`
	MetricsAddress string `json:"metricsAddress"`

	DeviceListStrategy []string `json:"deviceListStrategy"`
	CDISpecDir         string   `json:"cdiSpecDir"`
	HostDriverRoot     string   `json:"hostDriverRoot"`
	CDIHookPath        string   `json:"cdiHookPath"`
	ProcRoot           string   `json:"procRoot"`
	// DeviceInfoDir is where NIC pools write the CNI device-information
	// files (Network Plumbing WG Device Information spec).
	DeviceInfoDir     string   `json:"deviceInfoDir"`
	NICRescanInterval Duration `json:"nicRescanInterval"`
	// PodResourcesSocket is the kubelet's PodResources API, read to say
	// who holds each device (list, the allocation metric).
	PodResourcesSocket string `json:"podResourcesSocket"`

	// KubeletAPI picks the front-end: the device-plugin API (v1beta1) or
	// Dynamic Resource Allocation. A node serves its devices through one.
	KubeletAPI string `json:"kubeletAPI"`
	// Kubeconfig and NodeName are API access (empty kubeconfig:
	// in-cluster) and the node's name, for DRA mode (the node whose
	// ResourceSlices we own), Events and NodeCondition. PodUID,
	// DRAPluginDir and PluginRegistryDir are DRA mode's: the pod for
	// rolling-update hand-over, and the kubelet's directories.
	Kubeconfig        string `json:"kubeconfig"`
	NodeName          string `json:"nodeName"`
	PodUID            string `json:"podUID"`
	DRAPluginDir      string `json:"draPluginDir"`
	PluginRegistryDir string `json:"pluginRegistryDir"`
	// Events and NodeCondition report device health to the API server:
	// an Event on the Node and the pods holding a device at each health
	// change, and the Node conditions GPUHealthy and NICHealthy (package
	// report). Off by default: they need API access.
	Events        bool `json:"events"`
	NodeCondition bool `json:"nodeCondition"`

	// NICResources are the NIC pools, file-only (no flag): see nics.go.
	NICResources []NICResource `json:"nicResources,omitempty"`
	// Sharing is device sharing (time-slicing), file-only: see sharing.go.
	Sharing Sharing `json:"sharing,omitempty"`
}

// HealthPolicy is the health part of the configuration.
func (c Config) HealthPolicy() policy.Policy {
	return policy.Policy{
		IgnoredXIDs:    c.XIDIgnore,
		FatalXIDs:      c.XIDFatal,
		XIDRecovery:    c.XIDRecoveryPeriod.Duration,
		PollInterval:   c.HealthPollInterval.Duration,
		ThermalMarginC: c.ThermalMarginC,
		RecoveryPolls:  c.HealthRecoveryPolls,

		SlowdownSamples:  c.HealthSlowdownSamples,
		NVMLFailurePolls: c.HealthNVMLFailurePolls,
		Disabled:         c.HealthChecksDisabled,
	}
}

// Duration is a time.Duration written as "30s" in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON reads a Go duration string. A bare number is refused:
// YAML reads "5" as five, and five of what is exactly the mistake to catch.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n json.Number
		if json.Unmarshal(b, &n) == nil {
			return fmt.Errorf("%s has no unit; write a duration such as \"%ss\"", b, n)
		}
		return fmt.Errorf("want a duration string such as \"30s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration, or too long (at most about 290 years); example: \"30s\"", s)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Setting names one config key and its flag and environment twins.
type Setting struct {
	Key      string
	Flag     string
	Env      string
	Usage    string
	Default  string
	Category string // the group help and the settings reference list it under
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

// Default is the configuration with nothing set.
func Default() Config {
	p := policy.Default()
	return Config{
		DevicePluginDir:   "/var/lib/kubelet/device-plugins",
		DriverRoot:        "/",
		SysfsRoot:         "/sys",
		DevRoot:           "/dev",
		DeviceIDStrategy:  "uuid",
		MIGStrategy:       MIGStrategyNone,
		NVMLRetryInterval: Duration{30 * time.Second},
		LogLevel:          "info",
		LogFormat:         "text",

		HealthPollInterval:  Duration{p.PollInterval},
		XIDIgnore:           p.IgnoredXIDs,
		XIDFatal:            p.FatalXIDs,
		XIDRecoveryPeriod:   Duration{p.XIDRecovery},
		ThermalMarginC:      p.ThermalMarginC,
		HealthRecoveryPolls: p.RecoveryPolls,

		HealthSlowdownSamples:  policy.DefaultSlowdownSamples,
		HealthNVMLFailurePolls: policy.DefaultNVMLFailurePolls,
		StateDir:               DefaultStateDir,

		DeviceListStrategy: []string{"envvar"},
		CDISpecDir:         "/var/run/cdi",
		CDIHookPath:        DefaultCDIHookPath,
		ProcRoot:           "/proc",
		DeviceInfoDir:      DefaultDeviceInfoDir,
		NICRescanInterval:  Duration{10 * time.Second},
		PodResourcesSocket: DefaultPodResourcesSocket,

		KubeletAPI:        KubeletAPIDevicePlugin,
		DRAPluginDir:      "/var/lib/kubelet/plugins/" + DRADriverName,
		PluginRegistryDir: "/var/lib/kubelet/plugins_registry",

		Sharing: Sharing{TimeSlicing: TimeSlicing{Placement: PlacementDistributed}},
	}
}

// The kubelet APIs the plugin serves through (kubeletAPI).
const (
	KubeletAPIDevicePlugin = "device-plugin"
	KubeletAPIDRA          = "dra"
)

// DRADriverName is the DRA driver name: the ResourceSlices' driver, the
// domain of device attributes and taint keys, and the DeviceClasses'
// selector. It is the CDI vendor of our specs too.
const DRADriverName = "gpu-device-plugin.github.io"

// DefaultDeviceInfoDir is the directory the Device Information spec fixes
// for device plugins.
const DefaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// DefaultPodResourcesSocket is where the kubelet serves its PodResources
// API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// DefaultStateDir is the state directory of the node package's unit
// (StateDirectory=gpu-device-plugin) and the chart's hostPath.
const DefaultStateDir = "/var/lib/gpu-device-plugin"

// DefaultCDIHookPath is where the node package installs the CDI hook.
const DefaultCDIHookPath = "/usr/libexec/gpu-device-plugin/gpu-device-plugin-cdi-hook"

// deviceListStrategies are the values deviceListStrategy takes.
func deviceListStrategies() []string { return []string{"envvar", "cdi-cri", "cdi-annotations"} }

// UsesAPI says whether the plugin talks to the API server: DRA mode,
// events, nodeCondition.
func (c Config) UsesAPI() bool {
	return c.KubeletAPI == KubeletAPIDRA || c.Events || c.NodeCondition
}

// Node is this node's name: nodeName, else the host name in lower case
// (Node names are; host names need not be). DRA's pool, Events and the
// node condition all name the node this way.
func (c Config) Node() (string, error) {
	if c.NodeName != "" {
		return c.NodeName, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no nodeName (--node-name) set and no host name: %w", err)
	}
	return strings.ToLower(h), nil
}

// UsesCDI says whether CDI specs must be on disk: DRA answers in CDI
// device IDs only; otherwise a cdi-* strategy needs them.
func (c Config) UsesCDI() bool {
	return c.KubeletAPI == KubeletAPIDRA || slices.Contains(c.DeviceListStrategy, "cdi-cri") || slices.Contains(c.DeviceListStrategy, "cdi-annotations")
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

// Load reads a YAML file over the defaults. Unknown keys are errors, so a
// typo cannot silently leave a setting at its default; so are keys that
// differ from a known one only in case, which the JSON decoder underneath
// would otherwise accept, letting one of two spellings win. Each key is
// decoded on its own so that every error names its key.
func Load(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: reading %s: %w", path, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return c, nil
	}
	if err := duplicateKey(data); err != nil {
		return c, fmt.Errorf("config: %s: %w", path, err)
	}
	var probe map[string]json.RawMessage
	if yaml.Unmarshal(data, &probe) == nil && nvidiaFormat(slices.Collect(maps.Keys(probe))) {
		return c, fmt.Errorf("config: %s: this is NVIDIA k8s-device-plugin's config format (version: v1, flags: ...); gpu-device-plugin takes its own keys: %s gives each one's counterpart", path, MigrationGuide)
	}
	if err := checkNICResources(path, data); err != nil {
		return c, err
	}
	if err := checkSharing(path, data); err != nil {
		return c, err
	}
	// Strict, for duplicate keys and syntax; the values are decoded below.
	var top map[string]json.RawMessage
	if err := yaml.UnmarshalStrict(data, &top); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) || strings.Contains(err.Error(), "cannot unmarshal") {
			return c, fmt.Errorf("config: %s: want a map of keys such as \"deviceIDStrategy: uuid\"", path)
		}
		return c, fmt.Errorf("config: %s: %s", path, fieldError(err))
	}
	known := keys()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(top)) {
		if !slices.Contains(known, key) {
			errs = append(errs, fmt.Errorf("config: %s: %s", path, unknownKey(key, known)))
			continue
		}
		// JSON is YAML: decoding through the YAML package keeps its
		// conversions (metricsAddress: 9400 is the string "9400").
		one, err := json.Marshal(map[string]json.RawMessage{key: top[key]})
		if err == nil {
			err = yaml.UnmarshalStrict(one, &c)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %s: %s", path, key, valueError(err)))
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	// sharing is file-only, so its values are checked here too, naming the
	// file; what depends on migStrategy waits for Validate (flags).
	for _, err := range validateSharing(c, false) {
		errs = append(errs, fmt.Errorf("config: %s: %w", path, err))
	}
	return c, errors.Join(errs...)
}

// valueError rewords a decoding error of one key's value.
func valueError(err error) string {
	msg := fieldError(err)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		te.Field = ""
		return strings.TrimPrefix(typeError("", te).Error(), ": ")
	}
	if i := strings.Index(msg, "json: cannot unmarshal "); i >= 0 {
		// "json: cannot unmarshal number into Go struct field Config.x of type string"
		rest := msg[i+len("json: cannot unmarshal "):]
		if got, want, ok := strings.Cut(rest, " into Go "); ok {
			if j := strings.LastIndex(want, " of type "); j >= 0 {
				want = want[j+len(" of type "):]
			}
			return fmt.Sprintf("got %s, want %s", article(got), want)
		}
	}
	return msg
}

// fieldError rewords the YAML decoder's messages so they lead with the key.
func fieldError(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: while decoding JSON: ")
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: ")
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return fmt.Sprintf("unknown key %s; known keys: %s", rest, strings.Join(keys(), ", "))
	}
	return msg
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

// Validate checks every field and reports all problems at once.
func (c Config) Validate() error {
	var errs []error
	flags := map[string]string{}
	for _, s := range Settings() {
		flags[s.Key] = s.Flag
	}
	field := func(key string) string { return fmt.Sprintf("%s (--%s)", key, flags[key]) }
	oneOf := func(key, v string, allowed ...string) {
		for _, a := range allowed {
			if v == a {
				return
			}
		}
		errs = append(errs, fmt.Errorf("config: %s: %q is not allowed; use one of %s", field(key), v, strings.Join(allowed, ", ")))
	}
	absolute := func(key, v string) {
		if !strings.HasPrefix(v, "/") {
			errs = append(errs, fmt.Errorf("config: %s: %q must be an absolute path", field(key), v))
		}
	}
	absolute("devicePluginDir", c.DevicePluginDir)
	absolute("driverRoot", c.DriverRoot)
	absolute("sysfsRoot", c.SysfsRoot)
	absolute("devRoot", c.DevRoot)
	oneOf("deviceIDStrategy", c.DeviceIDStrategy, "uuid", "index")
	oneOf("migStrategy", c.MIGStrategy, migStrategies()...)
	oneOf("logLevel", c.LogLevel, "debug", "info", "warn", "error")
	oneOf("logFormat", c.LogFormat, "text", "json")
	if c.NVMLRetryInterval.Duration < time.Second {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 1s", field("nvmlRetryInterval"), c.NVMLRetryInterval))
	}
	if c.HealthPollInterval.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 100ms", field("healthPollInterval"), c.HealthPollInterval))
	}
	if c.XIDRecoveryPeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("config: %s: %s must not be negative; 0s keeps GPUs unhealthy after an XID", field("xidRecoveryPeriod"), c.XIDRecoveryPeriod))
	}
	if c.ThermalMarginC < 0 || c.ThermalMarginC > 50 {
		errs = append(errs, fmt.Errorf("config: %s: %d is out of range; use 0 to 50 degrees C", field("thermalMarginC"), c.ThermalMarginC))
	}
	for _, k := range []string{"healthSlowdownSamples", "healthNVMLFailurePolls"} {
		n := c.HealthSlowdownSamples
		if k == "healthNVMLFailurePolls" {
			n = c.HealthNVMLFailurePolls
		}
		if n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("config: %s: %d is out of range; use 1 to 1000 polls", field(k), n))
		}
	}
	for i, check := range c.HealthChecksDisabled {
		if !slices.Contains(policy.Checks(), check) {
			errs = append(errs, fmt.Errorf("config: %s[%d]: %q is not a check; use any of %s", field("healthChecksDisabled"), i, check, strings.Join(policy.Checks(), ", ")))
		}
	}
	if c.StateDir != "" {
		absolute("stateDir", c.StateDir)
	}
	if c.HealthRecoveryPolls < 1 {
		errs = append(errs, fmt.Errorf("config: %s: %d is too small; use at least 1", field("healthRecoveryPolls"), c.HealthRecoveryPolls))
	}
	if c.MetricsAddress != "" {
		host, port, err := net.SplitHostPort(c.MetricsAddress)
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %q is not host:port (example: \":9400\")", field("metricsAddress"), c.MetricsAddress))
		} else if host == "" && strings.HasPrefix(c.MetricsAddress, "[") {
			// The chart renders "[$(HOST_IP)]:port": empty brackets mean the
			// address did not reach us, and would listen on every interface.
			errs = append(errs, fmt.Errorf("config: %s: %q has empty brackets, which would listen on every address; give an IP (example: \"[10.0.0.5]:9400\"), or \":9400\" for every address", field("metricsAddress"), c.MetricsAddress))
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			errs = append(errs, fmt.Errorf("config: %s: port %q of %q is not a number from 0 to 65535 (example: \":9400\")", field("metricsAddress"), port, c.MetricsAddress))
		}
	}
	if len(c.DeviceListStrategy) == 0 {
		errs = append(errs, fmt.Errorf("config: %s: empty; use one or more of %s", field("deviceListStrategy"), strings.Join(deviceListStrategies(), ", ")))
	}
	for i, st := range c.DeviceListStrategy {
		if !slices.Contains(deviceListStrategies(), st) {
			errs = append(errs, fmt.Errorf("config: %s[%d]: %q is not allowed; use one or more of %s", field("deviceListStrategy"), i, st, strings.Join(deviceListStrategies(), ", ")))
		}
	}
	absolute("cdiSpecDir", c.CDISpecDir)
	if c.HostDriverRoot != "" {
		absolute("hostDriverRoot", c.HostDriverRoot)
	}
	if c.CDIHookPath != "" {
		absolute("cdiHookPath", c.CDIHookPath)
	}
	absolute("procRoot", c.ProcRoot)
	absolute("deviceInfoDir", c.DeviceInfoDir)
	if c.PodResourcesSocket != "" {
		absolute("podResourcesSocket", c.PodResourcesSocket)
	}
	if c.NICRescanInterval.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 100ms", field("nicRescanInterval"), c.NICRescanInterval))
	}
	oneOf("kubeletAPI", c.KubeletAPI, KubeletAPIDevicePlugin, KubeletAPIDRA)
	if c.KubeletAPI == KubeletAPIDRA {
		absolute("draPluginDir", c.DRAPluginDir)
		absolute("pluginRegistryDir", c.PluginRegistryDir)
	}
	if c.UsesAPI() && c.Kubeconfig != "" {
		absolute("kubeconfig", c.Kubeconfig)
	}
	strategies := c.DeviceListStrategy
	if c.KubeletAPI == KubeletAPIDRA {
		// DRA names NICs by CDI ID, as cdi-cri does.
		strategies = append(slices.Clone(strategies), "cdi-cri")
	}
	errs = append(errs, ValidateNICResources(c.NICResources, strategies)...)
	for _, err := range validateSharing(c, true) {
		errs = append(errs, fmt.Errorf("config: %w", err))
	}
	return errors.Join(errs...)
}

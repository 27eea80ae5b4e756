package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Setting is one config key: its flag and environment twins, its help,
// its default and the Config field it sets. Settings is the one place a
// key is declared: Default, Set, the flags, the environment and the
// reference are all made from it.
type Setting struct {
	Key      string
	Flag     string
	Env      string
	Usage    string
	Default  string // as a flag or variable would give it
	Category string // the group help and the settings reference list it under
	// EmptyOff: the empty value turns something off, so an empty
	// environment variable sets it as an empty flag does; for the others
	// an empty variable counts as unset.
	EmptyOff bool
	set      setter
}

// setter puts a key's string form (a flag's, a variable's, its default)
// into its field of c.
type setter func(c *Config, key, value string) error

// Categories lists the setting categories in order.
func Categories() []string {
	return []string{CategoryKubelet, CategoryDriver, CategoryHealth, CategoryRemediation, CategoryCDI, CategoryIMEX, CategoryNICs, CategoryDRA, CategoryReporting, CategoryLogging}
}

// EnvPrefix starts every environment variable the plugin reads.
const EnvPrefix = "GPU_DEVICE_PLUGIN_"

// Settings lists every key with its flag and environment variable.
func Settings() []Setting {
	s := []Setting{
		{Key: "devicePluginDir", Category: CategoryKubelet, Flag: "device-plugin-dir", Default: "/var/lib/kubelet/device-plugins", Usage: "the kubelet's device-plugin directory (sockets)",
			set: str(func(c *Config) *string { return &c.DevicePluginDir })},
		{Key: "driverRoot", Category: CategoryDriver, Flag: "driver-root", Default: "/", Usage: "root of the NVIDIA driver installation, where libnvidia-ml.so.1 is searched",
			set: str(func(c *Config) *string { return &c.DriverRoot })},
		{Key: "nvmlLibrary", Category: CategoryDriver, Flag: "nvml-library", Default: "", Usage: "path of libnvidia-ml.so.1 (overrides the search under --driver-root)",
			set: str(func(c *Config) *string { return &c.NVMLLibrary })},
		{Key: "sysfsRoot", Category: CategoryDriver, Flag: "sysfs-root", Default: "/sys", Usage: "where sysfs is mounted",
			set: str(func(c *Config) *string { return &c.SysfsRoot })},
		{Key: "devRoot", Category: CategoryDriver, Flag: "dev-root", Default: "/dev", Usage: "the host's /dev, as this process and the container runtime both see it",
			set: str(func(c *Config) *string { return &c.DevRoot })},
		{Key: "mpsRoot", Category: CategoryKubelet, Flag: "mps-root", Default: DefaultMPSRoot, Usage: "where the MPS control daemons of GPUs shared through MPS (sharing.mps, or DRA claims) keep their pipe, log and shared-memory directories, one directory per GPU; a host path that containers get mounts of, best on a tmpfs such as /run",
			set: str(func(c *Config) *string { return &c.MPSRoot })},
		{Key: "mpsShmSize", Category: CategoryKubelet, Flag: "mps-shm-size", Default: DefaultMPSShmSize, Usage: "the size of the tmpfs mounted as each MPS control daemon's /dev/shm, which every client of its GPU shares as its own /dev/shm; a quantity such as 512Mi or 2Gi, at least 1Mi",
			set: str(func(c *Config) *string { return &c.MPSShmSize })},
		{Key: "mpsLauncherSocket", EmptyOff: true, Category: CategoryKubelet, Flag: "mps-launcher-socket", Default: "", Usage: "the socket of `gpu-device-plugin mps-launcher`, which then starts the MPS control daemons in its own process tree (the chart's mps-launcher DaemonSet), so that they and their clients outlive a plugin restart; the launcher listens on it, the plugin asks it; empty: the plugin starts the daemons itself, and they end with its container",
			set: str(func(c *Config) *string { return &c.MPSLauncherSocket })},
		{Key: "deviceIDStrategy", Category: CategoryKubelet, Flag: "device-id-strategy", Default: "uuid", Usage: "how NVIDIA_VISIBLE_DEVICES names GPUs: uuid or index",
			set: str(func(c *Config) *string { return &c.DeviceIDStrategy })},
		{Key: "migStrategy", Category: CategoryKubelet, Flag: "mig-strategy", Default: MIGStrategyNone, Usage: "how the device-plugin API serves MIG devices: " + MIGStrategyNone + " (no MIG device is served), " + MIGStrategySingle + " (MIG devices of one profile, as nvidia.com/gpu) or " + MIGStrategyMixed + " (nvidia.com/mig-<profile> per profile, nvidia.com/gpu for GPUs without MIG); DRA mode publishes MIG devices whatever it says",
			set: str(func(c *Config) *string { return &c.MIGStrategy })},
		{Key: "migLayoutPollInterval", Category: CategoryKubelet, Flag: "mig-layout-poll-interval", Default: "10s", Usage: "how often the device-plugin front-end reads each GPU's MIG mode and MIG devices, so a layout mig-manager or nvidia-smi changes is served without a restart (NVML has no event for it); at least 1s, or 0s: never, the layout found at start is served until a restart; DRA mode makes its own MIG instances and ignores it",
			set: duration(func(c *Config) *Duration { return &c.MIGLayoutPollInterval }, "10s")},
		{Key: "excludeGPUs", Category: CategoryKubelet, Flag: "exclude-gpus", Default: "", Usage: "GPUs not to serve, comma-separated, each a UUID, an index, a PCI address or a full model name as list shows them; an excluded GPU gets no resource, CDI device, label or health check, and list shows it as excluded; an entry that names no GPU is warned about, and list shows it",
			set: words(func(c *Config) *[]string { return &c.ExcludeGPUs })},
		{Key: "includeGPUs", Category: CategoryKubelet, Flag: "include-gpus", Default: "", Usage: "the only GPUs to serve, in excludeGPUs' forms (a partial model name such as H100 names none: it is warned about); empty serves every GPU",
			set: words(func(c *Config) *[]string { return &c.IncludeGPUs })},
		{Key: "nvmlRetryInterval", Category: CategoryDriver, Flag: "nvml-retry-interval", Default: "30s", Usage: "how often to retry loading NVML when the driver is missing",
			set: duration(func(c *Config) *Duration { return &c.NVMLRetryInterval }, "30s")},
		{Key: "logLevel", Category: CategoryLogging, Flag: "log-level", Default: "info", Usage: "debug, info, warn or error",
			set: str(func(c *Config) *string { return &c.LogLevel })},
		{Key: "logFormat", Category: CategoryLogging, Flag: "log-format", Default: "text", Usage: "text or json",
			set: str(func(c *Config) *string { return &c.LogFormat })},
		{Key: "healthPollInterval", Category: CategoryHealth, Flag: "health-poll-interval", Default: DefaultHealthPollInterval.String(), Usage: "how often GPU temperature and clock-event reasons are read",
			set: duration(func(c *Config) *Duration { return &c.HealthPollInterval }, "5s")},
		{Key: "xidIgnore", Category: CategoryHealth, Flag: "xid-ignore", Default: formatList(DefaultXIDIgnore()), Usage: "comma-separated XIDs that leave the GPU healthy (the application's, or nothing to do); the default is every XID NVIDIA's XID catalog gives RESTART_APP or IGNORE, but 94; a list replaces it",
			set: xids(func(c *Config) *[]uint64 { return &c.XIDIgnore })},
		{Key: "xidFatal", Category: CategoryHealth, Flag: "xid-fatal", Default: formatList(DefaultXIDFatal()), Usage: "comma-separated XIDs that keep a GPU unhealthy until the driver says it was reset (its recovery action, R550 and later; on older drivers until the GPU is reset and health.json in --state-dir removed); wins over --xid-ignore; the default is every XID NVIDIA's XID catalog says needs a GPU reset or a node restart; a list replaces it",
			set: xids(func(c *Config) *[]uint64 { return &c.XIDFatal })},
		{Key: "xids", Category: CategoryHealth, Flag: "xids", Default: "", Usage: "comma-separated XID=CLASS entries that set single XIDs' classes, winning over --xid-ignore and --xid-fatal: ignore (healthy), transient (unhealthy for --xid-recovery-period) or fatal (example: 74=ignore,13=fatal,31=transient)",
			set: words(func(c *Config) *[]string { return &c.XIDs })},
		{Key: "xidRecoveryPeriod", Category: CategoryHealth, Flag: "xid-recovery-period", Default: DefaultXIDRecoveryPeriod.String(), Usage: "how long a GPU stays unhealthy after any other XID; 0s keeps it unhealthy",
			set: duration(func(c *Config) *Duration { return &c.XIDRecoveryPeriod }, "5s")},
		{Key: "thermalMarginC", Category: CategoryHealth, Flag: "thermal-margin", Default: strconv.Itoa(DefaultThermalMarginC), Usage: "degrees C below the slowdown threshold a GPU must cool to before it is healthy again",
			set: number(func(c *Config) *int { return &c.ThermalMarginC })},
		{Key: "healthRecoveryPolls", Category: CategoryHealth, Flag: "health-recovery-polls", Default: strconv.Itoa(DefaultHealthRecoveryPolls), Usage: "consecutive good polls that clear a thermal, power-brake or lost-GPU condition",
			set: number(func(c *Config) *int { return &c.HealthRecoveryPolls })},
		{Key: "metricsAddress", EmptyOff: true, Category: CategoryReporting, Flag: "metrics-address", Default: "", Usage: "host:port to serve Prometheus metrics on; empty turns them off",
			set: str(func(c *Config) *string { return &c.MetricsAddress })},
		{Key: "healthSocket", EmptyOff: true, Category: CategoryReporting, Flag: "health-socket", Default: "", Usage: "a Unix socket answering /livez and /readyz, which `gpu-device-plugin probe` asks (the chart's liveness and readiness probes), and the remediation's status and release, which `gpu-device-plugin remediation` asks; empty turns both off",
			set: str(func(c *Config) *string { return &c.HealthSocket })},
		{Key: "deviceListStrategy", Category: CategoryKubelet, Flag: "device-list-strategy", Default: "envvar", Usage: "comma-separated: envvar, cdi-cri, cdi-annotations",
			set: words(func(c *Config) *[]string { return &c.DeviceListStrategy })},
		{Key: "cdiSpecDir", Category: CategoryCDI, Flag: "cdi-spec-dir", Default: "/var/run/cdi", Usage: "where CDI specs are written when a cdi-* strategy is on",
			set: str(func(c *Config) *string { return &c.CDISpecDir })},
		{Key: "hostDriverRoot", Category: CategoryCDI, Flag: "host-driver-root", Default: "", Usage: "the driver root as the container runtime sees it, when it differs from --driver-root (CDI specs use it); empty: the same",
			set: str(func(c *Config) *string { return &c.HostDriverRoot })},
		{Key: "cdiHookPath", EmptyOff: true, Category: CategoryCDI, Flag: "cdi-hook-path", Default: DefaultCDIHookPath, Usage: "where the container runtime finds gpu-device-plugin-cdi-hook on the host (the GPU CDI spec's createContainer hook: libcuda.so link, ld cache); empty leaves the hook out",
			set: str(func(c *Config) *string { return &c.CDIHookPath })},
		{Key: "healthSlowdownSamples", Category: CategoryHealth, Flag: "health-slowdown-samples", Default: strconv.Itoa(DefaultHealthSlowdownSamples), Usage: "consecutive polls showing hardware slowdown or power brake before a GPU is unhealthy (they flicker under load on some SKUs)",
			set: number(func(c *Config) *int { return &c.HealthSlowdownSamples })},
		{Key: "healthNVMLFailurePolls", Category: CategoryHealth, Flag: "health-nvml-failure-polls", Default: strconv.Itoa(DefaultHealthNVMLFailurePolls), Usage: "consecutive polls in which no GPU can be read before every GPU is unhealthy",
			set: number(func(c *Config) *int { return &c.HealthNVMLFailurePolls })},
		{Key: "healthChecksDisabled", Category: CategoryHealth, Flag: "health-checks-disabled", Default: "", Usage: "comma-separated checks to turn off: " + strings.Join(HealthChecks(), ", "),
			set: words(func(c *Config) *[]string { return &c.HealthChecksDisabled })},
		{Key: "stateDir", EmptyOff: true, Category: CategoryHealth, Flag: "state-dir", Default: DefaultStateDir, Usage: "where conditions that must survive a plugin restart (fatal XID, reset required) are kept for this boot; empty keeps none",
			set: str(func(c *Config) *string { return &c.StateDir })},
		{Key: "procRoot", Category: CategoryDriver, Flag: "proc-root", Default: "/proc", Usage: "the host's /proc, to find the NIC with the default route",
			set: str(func(c *Config) *string { return &c.ProcRoot })},
		{Key: "runtimeConfigRoot", EmptyOff: true, Category: CategoryDriver, Flag: "runtime-config-root", Default: "/", Usage: "the host's root as this process sees it; the container runtimes' configs under it (etc/nvidia-container-runtime, etc/containerd, etc/crio, the OCI hooks.d folders) are read at start to warn when any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES; empty skips the check",
			set: str(func(c *Config) *string { return &c.RuntimeConfigRoot })},
		{Key: "deviceInfoDir", Category: CategoryNICs, Flag: "device-info-dir", Default: DefaultDeviceInfoDir, Usage: "where NIC pools write the device-information files CNI plugins read (Network Plumbing WG spec)",
			set: str(func(c *Config) *string { return &c.DeviceInfoDir })},
		{Key: "nicRescanInterval", Category: CategoryNICs, Flag: "nic-rescan-interval", Default: "10s", Usage: "how often NICs are rescanned for hot-plug and health",
			set: duration(func(c *Config) *Duration { return &c.NICRescanInterval }, "10s")},
		{Key: "podResourcesSocket", EmptyOff: true, Category: CategoryReporting, Flag: "pod-resources-socket", Default: DefaultPodResourcesSocket, Usage: "the kubelet's PodResources API socket, read to show which container holds each device (list, gpu_device_plugin_device_allocated, Events on pods); empty reads none",
			set: str(func(c *Config) *string { return &c.PodResourcesSocket })},
		{Key: "kubeletAPI", Category: CategoryKubelet, Flag: "kubelet-api", Default: KubeletAPIDevicePlugin, Usage: "how devices reach the kubelet: " + KubeletAPIDevicePlugin + " (v1beta1 extended resources) or " + KubeletAPIDRA + " (Dynamic Resource Allocation: ResourceSlices, needs API access)",
			set: str(func(c *Config) *string { return &c.KubeletAPI })},
		{Key: "kubeconfig", Category: CategoryReporting, Flag: "kubeconfig", Default: "", Usage: "DRA mode, events, nodeCondition and nodeLabels: node or nodefeature: kubeconfig file for API access; empty uses the pod's service account",
			set: str(func(c *Config) *string { return &c.Kubeconfig })},
		{Key: "nodeName", Category: CategoryReporting, Flag: "node-name", Default: "", Usage: "DRA mode, events, nodeCondition and nodeLabels: node or nodefeature: this node's name (the chart sets it from the downward API); empty uses the host name",
			set: str(func(c *Config) *string { return &c.NodeName })},
		{Key: "podUID", Category: CategoryDRA, Flag: "pod-uid", Default: "", Usage: "DRA mode: this pod's UID (the chart sets it); lets two plugin pods hand over during a rolling update",
			set: str(func(c *Config) *string { return &c.PodUID })},
		{Key: "podName", Category: CategoryReporting, Flag: "pod-name", Default: "", Usage: "nodeLabels: nodefeature: this pod's name (the chart sets it from the downward API); the NodeFeature is then owned by the pod's DaemonSet, so uninstalling deletes it; empty: no owner",
			set: str(func(c *Config) *string { return &c.PodName })},
		{Key: "podNamespace", Category: CategoryReporting, Flag: "pod-namespace", Default: "", Usage: "nodeLabels: nodefeature: this pod's namespace, where its NodeFeature goes (the chart sets it from the downward API)",
			set: str(func(c *Config) *string { return &c.PodNamespace })},
		{Key: "draPluginDir", Category: CategoryDRA, Flag: "dra-plugin-dir", Default: "/var/lib/kubelet/plugins/" + DRADriverName, Usage: "DRA mode: the kubelet's directory for this driver's socket and checkpoint",
			set: str(func(c *Config) *string { return &c.DRAPluginDir })},
		{Key: "pluginRegistryDir", Category: CategoryDRA, Flag: "plugin-registry-dir", Default: "/var/lib/kubelet/plugins_registry", Usage: "DRA mode: the kubelet's plugin registration directory",
			set: str(func(c *Config) *string { return &c.PluginRegistryDir })},
		{Key: "draDeviceMetadata", Category: CategoryDRA, Flag: "dra-device-metadata", Default: "true", Usage: "DRA mode: give each container using a claim a read-only file with its devices' attributes, as the ResourceSlice publishes them, under /var/run/kubernetes.io/dra-device-attributes/ (KEP-5304, metadata.resource.k8s.io/v1beta1); written under draPluginDir and mounted through a CDI spec in cdiSpecDir, so any kubelet with a CDI-enabled runtime serves it; false: no file",
			set: boolean(func(c *Config) *bool { return &c.DRADeviceMetadata })},
		{Key: "events", Category: CategoryReporting, Flag: "events", Default: "false", Usage: "true: a Kubernetes Event on the Node and on every pod holding a device at each device health change (needs API access)",
			set: boolean(func(c *Config) *bool { return &c.Events })},
		{Key: "nodeLabels", Category: CategoryReporting, Flag: "node-labels", Default: NodeLabelsNFD, Usage: "how the GPUs' labels (GPU Feature Discovery's names: nvidia.com/gpu.product, gpu.memory, mig.capable, ...) reach the Node: " + NodeLabelsNFD + " (NFD's local feature file in --nfd-features-dir, when that folder exists; no API access), " + NodeLabelsNode + " (the Node's own labels, patched through the API: needs API access, nodes get and patch), " + NodeLabelsNodeFeature + " (an NFD NodeFeature object, nvidia-features-for-<node> in --pod-namespace, which nfd-master turns into labels: needs API access, nodefeatures get, create and update, and NFD's master) or " + NodeLabelsNone,
			set: str(func(c *Config) *string { return &c.NodeLabels })},
		{Key: "nfdFeaturesDir", Category: CategoryReporting, Flag: "nfd-features-dir", Default: DefaultNFDFeaturesDir, Usage: "Node Feature Discovery's local feature folder (nfd-worker's features.d), where nodeLabels: nfd writes",
			set: str(func(c *Config) *string { return &c.NFDFeaturesDir })},
		{Key: "nodeCondition", Category: CategoryReporting, Flag: "node-condition", Default: "false", Usage: "true: keep the Node conditions GPUHealthy (and NICHealthy with NIC pools) False while a device is unhealthy (needs API access)",
			set: boolean(func(c *Config) *bool { return &c.NodeCondition })},
	}
	s = append(s, remediationSettings()...)
	s = append(s, imexSettings()...)
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

// fileKeys are the config file's top-level keys: a setting's key, or the
// section a dotted key is in (remediation.reset is reset in the
// remediation section), and the file-only keys.
func fileKeys() []string {
	var out []string
	for _, s := range Settings() {
		k, _, _ := strings.Cut(s.Key, ".")
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for _, f := range fileOnly {
		out = append(out, f.key)
	}
	return out
}

// Set assigns one key from its string form, as flags and environment
// variables give it.
func (c *Config) Set(key, value string) error {
	for _, s := range Settings() {
		if s.Key == key {
			return s.set(c, key, value)
		}
	}
	return fmt.Errorf("config: unknown key %q", key)
}

func str(field func(*Config) *string) setter {
	return func(c *Config, _, value string) error {
		*field(c) = value
		return nil
	}
}

// words is a comma-separated list; blank items are dropped.
func words(field func(*Config) *[]string) setter {
	return func(c *Config, _, value string) error {
		var out []string
		for _, f := range strings.Split(value, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		*field(c) = out
		return nil
	}
}

func xids(field func(*Config) *[]uint64) setter {
	return func(c *Config, key, value string) error {
		xs, err := parseList(key, value)
		if err != nil {
			return err
		}
		*field(c) = xs
		return nil
	}
}

// duration's example is the one its error shows.
func duration(field func(*Config) *Duration, example string) setter {
	return func(c *Config, key, value string) error {
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not a duration (example: %q)", key, value, example)
		}
		*field(c) = Duration{d}
		return nil
	}
}

func number(field func(*Config) *int) setter {
	return func(c *Config, key, value string) error {
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not a whole number", key, value)
		}
		*field(c) = n
		return nil
	}
}

func boolean(field func(*Config) *bool) setter {
	return func(c *Config, key, value string) error {
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("config: %s: %q is not true or false", key, value)
		}
		*field(c) = b
		return nil
	}
}

// Setting categories, in the order help and docs show them.
const (
	CategoryKubelet = "Kubelet"
	CategoryDriver  = "NVML and driver"
	CategoryHealth  = "Health"
	// CategoryRemediation: GPUs that heal themselves.
	CategoryRemediation = "Remediation"
	CategoryCDI         = "CDI"
	// CategoryIMEX: multi-node NVLink's IMEX channels.
	CategoryIMEX      = "IMEX channels"
	CategoryNICs      = "NICs"
	CategoryDRA       = "DRA"
	CategoryReporting = "Reporting"
	CategoryLogging   = "Logging"
)

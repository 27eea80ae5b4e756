package config

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// Config is every setting of the plugin. The YAML keys are the JSON tags.
type Config struct {
	DevicePluginDir  string `json:"devicePluginDir"`
	DriverRoot       string `json:"driverRoot"`
	NVMLLibrary      string `json:"nvmlLibrary"`
	SysfsRoot        string `json:"sysfsRoot"`
	DevRoot          string `json:"devRoot"`
	DeviceIDStrategy string `json:"deviceIDStrategy"`
	MIGStrategy      string `json:"migStrategy"`
	// MIGLayoutPollInterval is how often a MIG layout change is looked
	// for; zero: never.
	MIGLayoutPollInterval Duration `json:"migLayoutPollInterval"`
	// ExcludeGPUs and IncludeGPUs choose the GPUs served (GPUSelected).
	ExcludeGPUs       []string `json:"excludeGPUs"`
	IncludeGPUs       []string `json:"includeGPUs"` // MIGStrategy*: how the device-plugin API serves MIG devices
	NVMLRetryInterval Duration `json:"nvmlRetryInterval"`
	LogLevel          string   `json:"logLevel"`
	LogFormat         string   `json:"logFormat"`

	HealthPollInterval Duration `json:"healthPollInterval"`
	XIDIgnore          []uint64 `json:"xidIgnore"`
	XIDFatal           []uint64 `json:"xidFatal"`
	// XIDs sets single XIDs' classes, "XID=CLASS", over xidIgnore and
	// xidFatal; XIDOverrides reads it.
	XIDs                []string `json:"xids"`
	XIDRecoveryPeriod   Duration `json:"xidRecoveryPeriod"`
	ThermalMarginC      int      `json:"thermalMarginC"`
	HealthRecoveryPolls int      `json:"healthRecoveryPolls"`
	// HealthSlowdownSamples and HealthNVMLFailurePolls: see health.go.
	HealthSlowdownSamples  int      `json:"healthSlowdownSamples"`
	HealthNVMLFailurePolls int      `json:"healthNVMLFailurePolls"`
	HealthChecksDisabled   []string `json:"healthChecksDisabled"`
	// StateDir keeps what must survive a plugin restart on one boot
	// (conditions only the driver or a reboot clears); empty keeps nothing.
	StateDir string `json:"stateDir"`
	// MPSRoot holds the MPS control daemons' directories (sharing.mps).
	MPSRoot string `json:"mpsRoot"`
	// MPSShmSize is the size of each MPS daemon's /dev/shm tmpfs, a
	// quantity (1Gi); MPSShmBytes reads it.
	MPSShmSize string `json:"mpsShmSize"`
	// MPSLauncherSocket is where the MPS launcher listens; empty: none,
	// the plugin starts the daemons itself.
	MPSLauncherSocket string `json:"mpsLauncherSocket"`
	MetricsAddress    string `json:"metricsAddress"`
	HealthSocket      string `json:"healthSocket"`

	DeviceListStrategy []string `json:"deviceListStrategy"`
	CDISpecDir         string   `json:"cdiSpecDir"`
	HostDriverRoot     string   `json:"hostDriverRoot"`
	CDIHookPath        string   `json:"cdiHookPath"`
	ProcRoot           string   `json:"procRoot"`
	// RuntimeConfigRoot is the host's root, under which the container
	// runtimes' configs are read; empty skips that check.
	RuntimeConfigRoot string `json:"runtimeConfigRoot"`
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
	// ResourceSlices we own), Events, NodeCondition and NodeLabelsNode. PodUID,
	// DRAPluginDir and PluginRegistryDir are DRA mode's: the pod for
	// rolling-update hand-over, and the kubelet's directories.
	Kubeconfig string `json:"kubeconfig"`
	NodeName   string `json:"nodeName"`
	PodUID     string `json:"podUID"`
	// PodName and PodNamespace are this pod's, for NodeLabelsNodeFeature:
	// the object's namespace, and its owners (the pod's DaemonSet).
	PodName           string `json:"podName"`
	PodNamespace      string `json:"podNamespace"`
	DRAPluginDir      string `json:"draPluginDir"`
	PluginRegistryDir string `json:"pluginRegistryDir"`
	// DRADeviceMetadata: DRA mode writes each prepared request's device
	// attributes to a file mounted into its containers (KEP-5304).
	DRADeviceMetadata bool `json:"draDeviceMetadata"`
	// Events and NodeCondition report device health to the API server:
	// an Event on the Node and the pods holding a device at each health
	// change, and the Node conditions GPUHealthy and NICHealthy (package
	// report). Off by default: they need API access.
	Events bool `json:"events"`
	// NodeLabels is how the GPUs' labels reach the Node (NodeLabels*:
	// NFD's feature file, or the Node itself through the API);
	// NFDFeaturesDir is NFD's features.d for NodeLabelsNFD.
	NodeLabels     string `json:"nodeLabels"`
	NFDFeaturesDir string `json:"nfdFeaturesDir"`
	NodeCondition  bool   `json:"nodeCondition"`

	// NICResources are the NIC pools, file-only (no flag): see nics.go.
	NICResources []NICResource `json:"nicResources,omitempty"`
	// Sharing is device sharing (time-slicing), file-only: see sharing.go.
	Sharing Sharing `json:"sharing,omitempty"`
	// Remediation is what the plugin may do to heal a faulted GPU: see
	// remediation.go.
	Remediation Remediation `json:"remediation"`
	// IMEX is the IMEX channels the device-plugin front-end gives every
	// container with a GPU: see imex.go.
	IMEX IMEX `json:"imex"`
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

// Default is the configuration with nothing set: every setting at its
// Settings default, and the file-only keys' own.
func Default() Config {
	c := Config{Sharing: Sharing{TimeSlicing: TimeSlicing{Placement: PlacementDistributed}}}
	for _, s := range Settings() {
		if err := s.set(&c, s.Key, s.Default); err != nil {
			panic(fmt.Sprintf("config: the default of %s: %v", s.Key, err)) // a bad table entry; TestEverySettingCanBeSet
		}
	}
	return c
}

// The kubelet APIs the plugin serves through (kubeletAPI).
const (
	KubeletAPIDevicePlugin = "device-plugin"
	KubeletAPIDRA          = "dra"
)

// How the GPUs' labels reach the Node (nodeLabels).
const (
	NodeLabelsNFD = "nfd"
	// NodeLabelsNode patches the Node's labels through the API.
	NodeLabelsNode = "node"
	// NodeLabelsNodeFeature writes an NFD NodeFeature object through the
	// API, which nfd-master turns into the Node's labels.
	NodeLabelsNodeFeature = "nodefeature"
	NodeLabelsNone        = "none"
	// DefaultNFDFeaturesDir is where nfd-worker reads local feature files.
	DefaultNFDFeaturesDir = "/etc/kubernetes/node-feature-discovery/features.d"
)

// DRADriverName is the DRA driver name: the ResourceSlices' driver, the
// domain of device attributes and taint keys, and the DeviceClasses'
// selector. It is the CDI vendor of our specs too.
const DRADriverName = "gpu-device-plugin.github.io"

// FieldManager is the plugin's field manager in every write to the API
// server (managedFields): the chart's admission policies tell the plugin's
// own entry from the others' by it, so every client must use it.
const FieldManager = "gpu-device-plugin"

// DefaultDeviceInfoDir is the directory the Device Information spec fixes
// for device plugins.
const DefaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// DefaultPodResourcesSocket is where the kubelet serves its PodResources
// API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// DefaultMPSRoot is where MPS control daemons keep their directories: on
// the host's /run, a tmpfs, as MPS's shared memory wants.
const DefaultMPSRoot = "/run/gpu-device-plugin/mps"

// DefaultMPSShmSize is the default size of each MPS daemon's /dev/shm:
// room for PyTorch DataLoader workers and NCCL's buffers of the GPU's
// clients together, as the 64 MiB a container gets by default is not.
const DefaultMPSShmSize = "1Gi"

// MinMPSShmSize is the least each MPS daemon's /dev/shm may be given.
const MinMPSShmSize = 1 << 20

// MPSShmBytes is MPSShmSize in bytes; 0 when it is not a valid size
// (Validate says so).
func (c Config) MPSShmBytes() uint64 {
	n, err := parseBytes(c.MPSShmSize)
	if err != nil {
		return 0
	}
	return n
}

// MaxMPSRoot is the longest mpsRoot whose daemons' control sockets
// (<mpsRoot>/<GPU UUID>/pipe/control) fit a UNIX socket's path, 107 bytes:
// past it, every client and the plugin fail to connect ("invalid argument").
const MaxMPSRoot = 107 - len("/GPU-00000000-0000-0000-0000-000000000000/pipe/control")

// DefaultStateDir is the state directory of the node package's unit
// (StateDirectory=gpu-device-plugin) and the chart's hostPath.
const DefaultStateDir = "/var/lib/gpu-device-plugin"

// DefaultCDIHookPath is where the node package installs the CDI hook.
const DefaultCDIHookPath = "/usr/libexec/gpu-device-plugin/gpu-device-plugin-cdi-hook"

// UsesAPI says whether the plugin talks to the API server: DRA mode,
// events, nodeCondition, nodeLabels: node.
func (c Config) UsesAPI() bool {
	return c.KubeletAPI == KubeletAPIDRA || c.Events || c.NodeCondition || c.NodeLabels == NodeLabelsNode || c.NodeLabels == NodeLabelsNodeFeature
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

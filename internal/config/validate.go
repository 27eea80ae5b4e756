package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// deviceListStrategies are the values deviceListStrategy takes.
func deviceListStrategies() []string { return []string{"envvar", "cdi-cri", "cdi-annotations"} }

// Validate checks every field and reports all problems at once, naming
// each key with its flag.
func (c Config) Validate() error { return c.ValidateFrom(nil) }

// ValidateFrom is Validate naming each key with where its value came
// from: from(key) is "--flag", "env GPU_DEVICE_PLUGIN_..." or "in <file>";
// "" names the key's flag.
func (c Config) ValidateFrom(from func(key string) string) error { return c.ValidateWith(from) }

// Check is a check of the configuration by a part below it that owns the
// rules of its values (the remediation's policy, package remedy, which
// config may not import); field names a key with where its value came
// from, as every message starts.
type Check func(c Config, field func(key string) string) []error

// ValidateWith is ValidateFrom with more checks, whose errors are
// reported among the others.
func (c Config) ValidateWith(from func(key string) string, more ...Check) error {
	var errs []error
	flags := map[string]string{}
	for _, s := range Settings() {
		flags[s.Key] = s.Flag
	}
	field := func(key string) string {
		where := ""
		if from != nil {
			where = from(key)
		}
		if where == "" {
			where = "--" + flags[key]
		}
		return fmt.Sprintf("%s (%s)", key, where)
	}
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
	oneOf("nodeLabels", c.NodeLabels, NodeLabelsNFD, NodeLabelsNode, NodeLabelsNodeFeature, NodeLabelsNone)
	if c.NodeLabels == NodeLabelsNodeFeature && c.PodNamespace == "" {
		errs = append(errs, fmt.Errorf("config: %s: %s needs %s, the namespace its NodeFeature goes in; set --pod-namespace (the chart sets it from the downward API) or use nodeLabels %s", field("nodeLabels"), NodeLabelsNodeFeature, field("podNamespace"), NodeLabelsNode))
	}
	if c.NVMLRetryInterval.Duration < time.Second {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 1s", field("nvmlRetryInterval"), c.NVMLRetryInterval))
	}
	if d := c.MIGLayoutPollInterval.Duration; d != 0 && d < time.Second {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 1s, or 0s to serve the layout found at start until a restart", field("migLayoutPollInterval"), c.MIGLayoutPollInterval))
	}
	if c.HealthPollInterval.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("config: %s: %s is too short; use at least 100ms", field("healthPollInterval"), c.HealthPollInterval))
	}
	if c.XIDRecoveryPeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("config: %s: %s must not be negative; 0s keeps GPUs unhealthy after an XID", field("xidRecoveryPeriod"), c.XIDRecoveryPeriod))
	}
	seenXID := map[uint64]int{}
	for i, e := range c.XIDs {
		x, _, err := parseXIDEntry(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s[%d]: %w", field("xids"), i, err))
			continue
		}
		if j, twice := seenXID[x]; twice {
			errs = append(errs, fmt.Errorf("config: %s[%d]: XID %d is given twice (also [%d]); keep one entry", field("xids"), i, x, j))
		}
		seenXID[x] = i
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
		if !slices.Contains(HealthChecks(), check) {
			errs = append(errs, fmt.Errorf("config: %s[%d]: %q is not a check; use any of %s", field("healthChecksDisabled"), i, check, strings.Join(HealthChecks(), ", ")))
		}
	}
	if c.Sharing.MPS.Enabled() || c.Sharing.MemoryShares.Enabled {
		absolute("mpsRoot", c.MPSRoot)
		if root := filepath.Clean(c.MPSRoot); len(root) > MaxMPSRoot {
			errs = append(errs, fmt.Errorf("config: %s: %q is %d bytes, %d too many: each MPS daemon's control socket is <mpsRoot>/<GPU UUID>/pipe/control, and a UNIX socket path takes at most 107 bytes; use a folder of at most %d bytes (the default is %s)",
				field("mpsRoot"), c.MPSRoot, len(root), len(root)-MaxMPSRoot, MaxMPSRoot, DefaultMPSRoot))
		}
	}
	if c.MPSShmBytes() < MinMPSShmSize {
		errs = append(errs, fmt.Errorf("config: %s: %q is not a size of at least 1Mi; write a quantity such as %q", field("mpsShmSize"), c.MPSShmSize, DefaultMPSShmSize))
	}
	if c.StateDir != "" {
		absolute("stateDir", c.StateDir)
	}
	// A Unix socket's path fits in 107 bytes (sun_path).
	socket := func(key, path, example string) {
		if path == "" {
			return
		}
		absolute(key, path)
		if n := len(path); n > 107 {
			errs = append(errs, fmt.Errorf("config: %s: %q is %d bytes, %d too many for a UNIX socket's path; use at most 107 (example: %s)", field(key), path, n, n-107, example))
		}
	}
	socket("mpsLauncherSocket", c.MPSLauncherSocket, DefaultMPSRoot+"/launcher.sock")
	socket("healthSocket", c.HealthSocket, "/run/gpu-device-plugin/health.sock")
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
	if c.RuntimeConfigRoot != "" {
		absolute("runtimeConfigRoot", c.RuntimeConfigRoot)
	}
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
	errs = append(errs, validateRemediation(c, field)...)
	errs = append(errs, validateIMEX(c, field)...)
	for _, check := range more {
		errs = append(errs, check(c, field)...)
	}
	for _, err := range validateSharing(c, true) {
		errs = append(errs, fmt.Errorf("config: %w", err))
	}
	return errors.Join(errs...)
}

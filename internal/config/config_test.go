package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	c, err := Load(writeFile(t, "deviceIDStrategy: index\nnvmlRetryInterval: 5s\ndevRoot: /host/dev\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.DeviceIDStrategy != "index" || c.NVMLRetryInterval.Duration != 5*time.Second || c.DevRoot != "/host/dev" {
		t.Fatalf("loaded %+v", c)
	}
	if c.SysfsRoot != "/sys" {
		t.Errorf("unset key lost its default: sysfsRoot = %q", c.SysfsRoot)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadEmptyFileIsDefaults(t *testing.T) {
	c, err := Load(writeFile(t, "\n"))
	if err != nil || !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load(empty) = %+v, %v", c, err)
	}
}

func TestErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string
	}{
		{name: "unknown key", body: "deviceIDStrategi: uuid\n", want: []string{"deviceIDStrategi", "deviceIDStrategy"}},
		{name: "bad duration", body: "nvmlRetryInterval: soon\n", want: []string{"30s"}},
		{name: "bad strategy", body: "deviceIDStrategy: serial\n", want: []string{"deviceIDStrategy", "serial", "uuid, index"}},
		{name: "relative path", body: "devRoot: dev\n", want: []string{"devRoot", "absolute"}},
		{name: "short retry", body: "nvmlRetryInterval: 10ms\n", want: []string{"nvmlRetryInterval", "1s"}},
		{name: "short MIG layout poll", body: "migLayoutPollInterval: 100ms\n", want: []string{"migLayoutPollInterval", "1s", "0s"}},
		{name: "negative MIG layout poll", body: "migLayoutPollInterval: -1s\n", want: []string{"migLayoutPollInterval", "at least 1s"}},
		{name: "two problems", body: "logLevel: loud\nlogFormat: xml\n", want: []string{"logLevel", "logFormat"}},
		{name: "bad xid list", body: "xidIgnore: [13, x]\n", want: []string{"xidIgnore"}},
		{name: "negative margin", body: "thermalMarginC: -1\n", want: []string{"thermalMarginC", "--thermal-margin"}},
		{name: "bad metrics address", body: "metricsAddress: 9400\n", want: []string{"metricsAddress", ":9400"}},
		{name: "bad strategy", body: "deviceListStrategy: [envvar, cdi]\n", want: []string{"deviceListStrategy", "--device-list-strategy", "cdi-cri"}},
		{name: "no strategy", body: "deviceListStrategy: []\n", want: []string{"deviceListStrategy", "empty"}},
		{name: "not yaml", body: "deviceIDStrategy: [\n", want: []string{"config.yaml"}},
		{name: "duration without unit", body: "healthPollInterval: 5\n", want: []string{"healthPollInterval", `"5s"`}},
		{name: "duration out of range", body: "nvmlRetryInterval: 9999999999999h\n", want: []string{"nvmlRetryInterval", "9999999999999h"}},
		{name: "key differing in case", body: "xidFatal: [48]\nXIDFatal: [79]\n", want: []string{`"XIDFatal"`, "case-sensitive", `"xidFatal"`}},
		{name: "key in another case alone", body: "LogLevel: debug\n", want: []string{`"LogLevel"`, `"logLevel"`}},
		{name: "wrong type names the key", body: "thermalMarginC: hot\n", want: []string{"thermalMarginC", "whole number"}},
		{name: "metrics port out of range", body: "metricsAddress: \":99999\"\n", want: []string{"metricsAddress", "99999", "65535"}},
		{name: "metrics address with empty brackets", body: "metricsAddress: \"[]:9400\"\n", want: []string{"metricsAddress", "empty brackets", "every address"}},
		{name: "metrics port not a number", body: "metricsAddress: \"localhost:metrics\"\n", want: []string{"metricsAddress", "metrics"}},
		{name: "not a map", body: "- 1\n", want: []string{"config.yaml", "map of keys"}},
		{name: "xids entry without a class", body: "xids: [\"74\"]\n", want: []string{"xids (--xids)[0]", `"74"`, "XID=CLASS", `"74=ignore"`}},
		{name: "xids entry with an unknown class", body: "xids: [\"13=fatal\", \"74=reboot\"]\n", want: []string{"xids (--xids)[1]", `"reboot"`, "ignore, transient, fatal"}},
		{name: "xids entry not a number", body: "xids: [\"x=ignore\"]\n", want: []string{"xids (--xids)[0]", `"x=ignore"`, "XID=CLASS"}},
		{name: "xids XID twice", body: "xids: [\"74=ignore\", \" 74 = fatal\"]\n", want: []string{"xids (--xids)[1]", "XID 74 is given twice", "[0]", "keep one"}},
		{name: "unknown health check", body: "healthChecksDisabled: [thermal, temp]\n", want: []string{"healthChecksDisabled (--health-checks-disabled)[1]", `"temp"`, "hw-slowdown"}},
		{name: "no slowdown samples", body: "healthSlowdownSamples: 0\n", want: []string{"healthSlowdownSamples", "--health-slowdown-samples", "1 to 1000"}},
		{name: "relative state dir", body: "stateDir: state\n", want: []string{"stateDir", "absolute"}},
		{name: "relative pod resources socket", body: "podResourcesSocket: kubelet.sock\n", want: []string{"podResourcesSocket (--pod-resources-socket)", "absolute"}},
	}
	tests = append(tests, []struct {
		name string
		body string
		want []string
	}{
		{name: "events not a bool", body: "events: sometimes\n", want: []string{"events"}},
		{name: "relative kubeconfig for events", body: "events: true\nkubeconfig: kubelet.conf\n", want: []string{"kubeconfig (--kubeconfig)", "absolute"}},
		{name: "relative kubeconfig for nodeCondition", body: "nodeCondition: true\nkubeconfig: kubelet.conf\n", want: []string{"kubeconfig (--kubeconfig)", "absolute"}},
	}...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantConfigErrors(t, tt.body, tt.want...) })
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml")); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}

// The forms the chart renders for metricsAddress: every address, a given
// IP, and the node's IP in brackets, which fit IPv4 and IPv6 alike.
func TestMetricsAddressForms(t *testing.T) {
	for _, addr := range []string{":9400", "127.0.0.1:9400", "[::1]:9400", "[10.0.0.5]:9400", "[fd00::5]:9400"} {
		c := Default()
		c.MetricsAddress = addr
		if err := c.Validate(); err != nil {
			t.Errorf("metricsAddress %q: %v", addr, err)
		}
	}
}

func TestEverySettingCanBeSet(t *testing.T) {
	for _, s := range Settings() {
		c := Default()
		if err := c.Set(s.Key, s.Default); err != nil {
			t.Errorf("Set(%s, %q): %v", s.Key, s.Default, err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Errorf("setting %s to its default changed the config", s.Key)
		}
		if !strings.HasPrefix(s.Env, EnvPrefix) || s.Flag == "" {
			t.Errorf("setting %s has flag %q env %q", s.Key, s.Flag, s.Env)
		}
	}
	c := Default()
	if err := c.Set("nvmlRetryInterval", "never"); err == nil || !strings.Contains(err.Error(), "nvmlRetryInterval") {
		t.Errorf("bad duration: %v", err)
	}
	if err := c.Set("bogus", "x"); err == nil {
		t.Error("unknown key accepted")
	}
}

func TestHealthSettings(t *testing.T) {
	c, err := Load(writeFile(t, "xidIgnore: [13]\nxidFatal: [79, 48]\nxidRecoveryPeriod: 0s\nhealthPollInterval: 2s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set("thermalMarginC", "7"); err != nil {
		t.Fatal(err)
	}
	// daemon.HealthPolicy copies these fields into the watcher's policy
	// (its TestHealthPolicy).
	if !reflect.DeepEqual(c.XIDIgnore, []uint64{13}) || !reflect.DeepEqual(c.XIDFatal, []uint64{79, 48}) ||
		c.XIDRecoveryPeriod.Duration != 0 || c.HealthPollInterval.Duration != 2*time.Second || c.ThermalMarginC != 7 || c.HealthRecoveryPolls != 3 {
		t.Fatalf("health settings = %+v", c)
	}
	if err := c.Set("xidIgnore", "13, 31,43"); err != nil || !reflect.DeepEqual(c.XIDIgnore, []uint64{13, 31, 43}) {
		t.Fatalf("xidIgnore = %v, %v", c.XIDIgnore, err)
	}
	if err := c.Set("xidFatal", ""); err != nil || len(c.XIDFatal) != 0 {
		t.Fatalf("empty xidFatal = %v, %v", c.XIDFatal, err)
	}
	if err := c.Set("xidFatal", "79,abc"); err == nil || !strings.Contains(err.Error(), "xidFatal") {
		t.Fatalf("bad list: %v", err)
	}
	// xids from the file, a flag or a variable: XID=CLASS entries.
	c, err = Load(writeFile(t, "xids: [\"74=ignore\", \"13 = fatal\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.XIDOverrides(), map[uint64]string{74: "ignore", 13: "fatal"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("xids from the file = %v, want %v", got, want)
	}
	if err := c.Set("xids", "31=transient, 79=ignore"); err != nil || !reflect.DeepEqual(c.XIDOverrides(), map[uint64]string{31: "transient", 79: "ignore"}) {
		t.Fatalf("xids flag = %v, %v", c.XIDOverrides(), err)
	}
	if got := Default().XIDOverrides(); len(got) != 0 {
		t.Fatalf("default xids = %v, want none", got)
	}
	c, err = Load(writeFile(t, "healthChecksDisabled: [power-brake, recovery-action]\nhealthSlowdownSamples: 5\nhealthNVMLFailurePolls: 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.HealthChecksDisabled, []string{"power-brake", "recovery-action"}) || c.HealthSlowdownSamples != 5 || c.HealthNVMLFailurePolls != 4 {
		t.Fatalf("health settings = %+v", c)
	}
	// That health accepts the policy built from them is daemon's
	// TestHealthPolicy.
}

func TestDeviceListStrategy(t *testing.T) {
	c := Default()
	if c.UsesCDI() {
		t.Error("default uses CDI")
	}
	if err := c.Set("deviceListStrategy", "envvar, cdi-cri"); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.DeviceListStrategy, []string{"envvar", "cdi-cri"}) || !c.UsesCDI() {
		t.Fatalf("strategies = %v", c.DeviceListStrategy)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestReportSettings(t *testing.T) {
	c := Default()
	if c.Events || c.NodeCondition || c.UsesAPI() {
		t.Fatalf("reporting on by default: %+v", c)
	}
	c, err := Load(writeFile(t, "events: true\nnodeCondition: true\nkubeconfig: /etc/kubernetes/kubelet.conf\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.Events || !c.NodeCondition || !c.UsesAPI() {
		t.Fatalf("loaded %+v", c)
	}
	if err := c.Set("nodeCondition", "false"); err != nil || c.NodeCondition {
		t.Fatalf("Set nodeCondition false: %v, %v", c.NodeCondition, err)
	}
	if err := c.Set("events", "yes"); err == nil || !strings.Contains(err.Error(), "events") {
		t.Fatalf("Set events yes: %v", err)
	}
	// In-cluster is the default: nothing else is required.
	c = Default()
	c.Events = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestNodeLabelsModes(t *testing.T) {
	for _, mode := range []string{NodeLabelsNFD, NodeLabelsNode, NodeLabelsNodeFeature, NodeLabelsNone} {
		c := Default()
		if err := c.Set("nodeLabels", mode); err != nil {
			t.Fatal(err)
		}
		c.PodNamespace = "gpu"
		if err := c.Validate(); err != nil {
			t.Errorf("nodeLabels %s: %v", mode, err)
		}
		if c.UsesAPI() != (mode == NodeLabelsNode || mode == NodeLabelsNodeFeature) {
			t.Errorf("nodeLabels %s: UsesAPI %v", mode, c.UsesAPI())
		}
	}
	c := Default()
	c.NodeLabels = "gfd"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "nodeLabels") || !strings.Contains(err.Error(), NodeLabelsNode) {
		t.Errorf("nodeLabels gfd: %v", err)
	}
	// nodefeature needs the namespace its object goes in: one line naming
	// both keys and the flag.
	c = Default()
	c.NodeLabels = NodeLabelsNodeFeature
	err := c.Validate()
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "nodeLabels") || !strings.Contains(err.Error(), "podNamespace") || !strings.Contains(err.Error(), "--pod-namespace") {
		t.Errorf("nodeLabels nodefeature without podNamespace: %v", err)
	}
}

func TestNode(t *testing.T) {
	c := Default()
	c.NodeName = "gpu-node-7"
	if n, err := c.Node(); n != "gpu-node-7" || err != nil {
		t.Errorf("Node() = %q, %v; want the nodeName setting", n, err)
	}
	c.NodeName = ""
	h, _ := os.Hostname()
	if n, err := c.Node(); n != strings.ToLower(h) || err != nil {
		t.Errorf("Node() = %q, %v; want the host name %q in lower case", n, err, strings.ToLower(h))
	}
}

// TestLoadFileMistakes: each mistake gets one line naming the key and the
// way out.
func TestLoadFileMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"duplicate key", "logLevel: info\nmigStrategy: none\nlogLevel: debug\n", `key "logLevel" is set twice, on lines 1 and 3; keep one`},
		{"duplicate nested key", "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      replicas: 3\n",
			`key "sharing.timeSlicing.resources[0].replicas" is set twice, on lines 5 and 6`},
		{"typo", "migStratgy: mixed\n", `unknown key "migStratgy"; did you mean "migStrategy"?`},
		{"typo in a long key", "healthNVMLFailurePoll: 3\n", `did you mean "healthNVMLFailurePolls"?`},
		{"case", "loglevel: debug\n", `keys are case-sensitive: did you mean "logLevel"?`},
		{"NVIDIA's format", "version: v1\nflags:\n  migStrategy: none\n  failOnInitError: true\n",
			"this is NVIDIA k8s-device-plugin's config format (version: v1, flags: ...); gpu-device-plugin takes its own keys: " + MigrationGuide},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %v, want one line saying %q", err, tc.want)
			}
		})
	}
	// Far from every key: the list, no guess.
	if got := unknownKey("bogusThing", keys()); strings.Contains(got, "did you mean") || !strings.Contains(got, "known keys: ") {
		t.Errorf("unknownKey(bogusThing) = %q", got)
	}
}

// TestMigrationGuideKeys: every key the migration guide maps NVIDIA's
// settings onto is one Load accepts.
func TestMigrationGuideKeys(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", MigrationGuide))
	if err != nil {
		t.Fatal(err)
	}
	known := keys()
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[3], -1) {
			n++
			// A section's own key (imex.required), or a key inside a
			// file-only value (sharing.timeSlicing.placement).
			if root, _, _ := strings.Cut(m[1], "."); !slices.Contains(known, m[1]) && !slices.Contains(known, root) {
				t.Errorf("%s maps onto %q, which is no key", MigrationGuide, m[1])
			}
		}
	}
	if n < 5 {
		t.Errorf("found only %d mapped keys in %s", n, MigrationGuide)
	}
}

// An empty podResourcesSocket reads no holders (list off the node); it is
// not an error.
func TestEmptyPodResourcesSocket(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("podResourcesSocket: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err == nil {
		err = c.Validate()
	}
	if err != nil || c.PodResourcesSocket != "" {
		t.Errorf("podResourcesSocket \"\": %v, %q", err, c.PodResourcesSocket)
	}
}

// Each setting's field is the one its key names in the file: the table
// and the Config's JSON tags cannot drift apart.
func TestSettingsSetTheFieldOfTheirKey(t *testing.T) {
	asMap := func(c Config) map[string]any {
		t.Helper()
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		// A section's keys are settings of their own (remediation.reset).
		for k := range sectionKeys {
			for sub, v := range m[k].(map[string]any) {
				m[k+"."+sub] = v
			}
			delete(m, k)
		}
		return m
	}
	zero := asMap(Config{})
	for _, s := range Settings() {
		var c Config
		for _, v := range []string{"7s", "7", "true"} {
			if c.Set(s.Key, v) == nil {
				break
			}
		}
		var changed []string
		for k, v := range asMap(c) {
			if !reflect.DeepEqual(v, zero[k]) {
				changed = append(changed, k)
			}
		}
		if !slices.Equal(changed, []string{s.Key}) {
			t.Errorf("setting %s changed %v", s.Key, changed)
		}
	}
}

// wantConfigErrors loads a config file with body and validates it, and
// wants an error that mentions each of want.
func wantConfigErrors(t *testing.T, body string, want ...string) {
	t.Helper()
	c, err := Load(writeFile(t, body))
	if err == nil {
		err = c.Validate()
	}
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// The remediation section: each key from the file, a flag or a variable,
// and the checks that depend on the rest of the configuration, each one
// line naming its key and where it came from.
func TestRemediationSettings(t *testing.T) {
	d := Default().Remediation
	if !d.Reset || d.Evict || d.GracePeriod.Duration != 10*time.Minute || d.MaxResets != 3 || d.Window.Duration != 24*time.Hour || d.ResetPeers || d.Cordon || d.UsagePoll.Duration != 5*time.Second {
		t.Fatalf("defaults %+v", d)
	}
	c, err := Parse("f.yaml", []byte("remediation:\n  reset: false\n  gracePeriod: 1m\n  maxResets: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Remediation; r.Reset || r.GracePeriod.Duration != time.Minute || r.MaxResets != 5 || r.Window.Duration != 24*time.Hour || r.UsagePoll.Duration != 5*time.Second {
		t.Fatalf("from the file: %+v (the keys it leaves out keep their defaults)", r)
	}
	if v := c.Values(); v["remediation.reset"] != "false" || v["remediation.maxResets"] != "5" || v["remediation"] != "" {
		t.Errorf("Values: %v", v)
	}
	if err := c.Set("remediation.window", "1h"); err != nil || c.Remediation.Window.Duration != time.Hour {
		t.Errorf("Set: %v %+v", err, c.Remediation)
	}
	if _, err := Parse("f.yaml", []byte("remediation:\n  resets: 2\n")); err == nil || !strings.Contains(err.Error(), "resets") {
		t.Errorf("an unknown key of the section: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"evict in device-plugin mode", func(c *Config) { c.Remediation.Evict = true },
			"config: remediation.evict (--remediation-evict): true needs kubeletAPI dra: eviction is DRA-only, through the device taint's NoExecute effect; in device-plugin mode set it to false (a withheld GPU then waits for its pods to end)"},
		{"usage poll too short", func(c *Config) { c.Remediation.UsagePoll = Duration{time.Millisecond} },
			"config: remediation.usagePoll (--remediation-usage-poll): 1ms is too short; use at least 100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
	c = Default()
	c.KubeletAPI, c.DRAPluginDir, c.Remediation.Evict = KubeletAPIDRA, "/x", true
	if err := c.Validate(); err != nil {
		t.Errorf("evict in DRA mode: %v", err)
	}
	check := func(c Config, field func(string) string) []error {
		return []error{fmt.Errorf("config: %s: checked", field("remediation.maxResets"))}
	}
	if err := Default().ValidateWith(func(string) string { return "in f.yaml" }, check); err == nil || err.Error() != "config: remediation.maxResets (in f.yaml): checked" {
		t.Errorf("ValidateWith: %v", err)
	}
}

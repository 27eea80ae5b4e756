package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const h100UUID = "GPU-5c1d7c3e-2a4b-4f6e-9d0a-1b2c3d4e5f60"

var exampleSharing = Sharing{TimeSlicing: TimeSlicing{
	RenameByDefault:            true,
	FailRequestsGreaterThanOne: true,
	Placement:                  PlacementPacked,
	Resources: []SharedResource{
		{Name: "nvidia.com/gpu", Replicas: 4},
		{Name: "nvidia.com/gpu", Replicas: 8, Rename: "nvidia.com/h100.shared", Devices: []string{"NVIDIA H100 80GB HBM3"}},
		{Name: "nvidia.com/gpu", Replicas: 2, Devices: []string{h100UUID}},
		{Name: "nvidia.com/mig-1g.10gb", Replicas: 7},
	},
}}

func TestLoadExampleSharing(t *testing.T) {
	c, err := Load("testdata/example-sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.MIGStrategy != MIGStrategyMixed {
		t.Errorf("migStrategy = %q, want mixed", c.MIGStrategy)
	}
	if !reflect.DeepEqual(c.Sharing, exampleSharing) {
		t.Errorf("sharing = %+v\nwant %+v", c.Sharing, exampleSharing)
	}
	if !c.Sharing.TimeSlicing.Enabled() {
		t.Error("Enabled() = false with resources")
	}
	if c.DeviceIDStrategy != "uuid" || c.NICResources != nil {
		t.Errorf("a sharing-only file changed other settings: %+v", c)
	}
}

// The section decodes with a plain YAML decoder too, as a chart or test
// that builds it would.
func TestSharingYAMLDecode(t *testing.T) {
	data, err := os.ReadFile("testdata/example-sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		MIGStrategy string  `json:"migStrategy"`
		Sharing     Sharing `json:"sharing"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.MIGStrategy != MIGStrategyMixed || !reflect.DeepEqual(doc.Sharing, exampleSharing) {
		t.Errorf("decoded %+v", doc)
	}
}

func TestSharingDefaults(t *testing.T) {
	d := Default()
	if d.MIGStrategy != MIGStrategyNone || d.Sharing.TimeSlicing.Placement != PlacementDistributed || d.Sharing.TimeSlicing.Enabled() {
		t.Errorf("defaults: migStrategy %q, sharing %+v", d.MIGStrategy, d.Sharing)
	}
	// placement left out keeps the default; resources alone turn it on.
	c, err := Load(writeFile(t, "migStrategy: single\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Sharing.TimeSlicing.Placement != PlacementDistributed || !c.Sharing.TimeSlicing.Enabled() {
		t.Errorf("sharing = %+v", c.Sharing)
	}
	for _, body := range []string{"sharing:\n", "sharing: {}\n", "sharing: {timeSlicing: {}}\n", "sharing: {timeSlicing: {resources: []}}\n"} {
		c, err := Load(writeFile(t, body))
		if err == nil {
			err = c.Validate()
		}
		if err != nil || c.Sharing.TimeSlicing.Enabled() {
			t.Errorf("%q: enabled %v, %v", body, c.Sharing.TimeSlicing.Enabled(), err)
		}
	}
}

// What gpu-device-plugin serve hands the DRA program, and what a config
// dump shows, is lowerCamelCase JSON that reads back to the same config.
func TestSharingRoundTrip(t *testing.T) {
	c, err := Load("testdata/example-sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"migStrategy":"mixed"`, `"sharing":{"timeSlicing":{`, `"renameByDefault":true`, `"failRequestsGreaterThanOne":true`,
		`"placement":"packed"`, `"resources":[`, `"name":"nvidia.com/gpu"`, `"replicas":8`, `"rename":"nvidia.com/h100.shared"`, `"devices":["NVIDIA H100 80GB HBM3"]`} {
		if !strings.Contains(string(js), key) {
			t.Errorf("JSON lacks %s:\n%s", key, js)
		}
	}
	back := Default()
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("JSON round trip:\n got %+v\nwant %+v", back, c)
	}
	y, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "resolved.yaml")
	if err := os.WriteFile(p, y, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err = Load(p)
	if err != nil {
		t.Fatalf("Load of the marshalled YAML: %v\n%s", err, y)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("YAML round trip:\n got %+v\nwant %+v", back, c)
	}
}

func TestSharingErrors(t *testing.T) {
	const ts = "sharing:\n  timeSlicing:\n"
	const res = ts + "    resources:\n"
	tests := []struct {
		name string
		body string
		want []string
	}{
		{name: "one replica", body: res + "      - {name: nvidia.com/gpu, replicas: 1}\n",
			want: []string{"sharing.timeSlicing.resources[0].replicas: 1 is too few; use 2 or more (1 is not sharing: remove the entry)"}},
		{name: "replicas left out", body: res + "      - {name: nvidia.com/gpu}\n",
			want: []string{"sharing.timeSlicing.resources[0].replicas: 0 is too few; use 2 or more"}},
		{name: "too many replicas", body: res + "      - {name: nvidia.com/gpu, replicas: 2}\n      - {name: nvidia.com/mig-1g.10gb, replicas: 5000}\n",
			want: []string{"sharing.timeSlicing.resources[1].replicas: 5000 is too many; use at most 1024"}},
		{name: "replicas not a number", body: res + "      - {name: nvidia.com/gpu, replicas: four}\n",
			want: []string{"sharing.timeSlicing.resources[0].replicas: got a string, want a whole number"}},
		{name: "name not served", body: res + "      - {name: nvidia.com/gpus, replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0].name: "nvidia.com/gpus" is not a resource the plugin serves; use nvidia.com/gpu or nvidia.com/mig-<profile>`, "nvidia.com/mig-1g.10gb"}},
		{name: "bare profile", body: res + "      - {name: 1g.10gb, replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0].name: "1g.10gb" is not a resource the plugin serves`}},
		{name: "profile with plus", body: res + "      - {name: nvidia.com/mig-1g.10gb+me, replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0].name: "nvidia.com/mig-1g.10gb+me"`, `use "nvidia.com/mig-1g.10gb.me"`}},
		{name: "name missing", body: res + "      - {replicas: 2}\n",
			want: []string{"sharing.timeSlicing.resources[0].name: missing; use nvidia.com/gpu"}},
		{name: "rename same as name", body: res + "      - {name: nvidia.com/gpu, replicas: 2, rename: nvidia.com/gpu}\n",
			want: []string{`sharing.timeSlicing.resources[0].rename: "nvidia.com/gpu" is the entry's own name`, "nvidia.com/gpu.shared"}},
		{name: "rename to a served name", body: res + "      - {name: nvidia.com/mig-1g.10gb, replicas: 2, rename: nvidia.com/gpu}\n",
			want: []string{`sharing.timeSlicing.resources[0].rename: "nvidia.com/gpu" is a name the plugin serves devices under; pick another`}},
		{name: "rename without domain", body: res + "      - {name: nvidia.com/gpu, replicas: 2, rename: shared-gpu}\n",
			want: []string{`sharing.timeSlicing.resources[0].rename: "shared-gpu" is not a full extended-resource name <vendor-domain>/<name> (example: nvidia.com/gpu.shared)`}},
		{name: "rename with upper-case domain", body: res + "      - {name: nvidia.com/gpu, replicas: 2, rename: Example.com/gpu}\n",
			want: []string{"sharing.timeSlicing.resources[0].rename", "lower-case DNS name"}},
		{name: "rename to a NIC pool", body: "nicResources: [{name: example.com/rdma, selectors: {vendors: [\"15b3\"]}}]\n" + res + "      - {name: nvidia.com/gpu, replicas: 2, rename: example.com/rdma}\n",
			want: []string{`sharing.timeSlicing.resources[0]: replicas would be served as "example.com/rdma", already the name of nicResources[0]`}},
		{name: "two kinds under one rename", body: "migStrategy: mixed\n" + res + "      - {name: nvidia.com/gpu, replicas: 2, rename: example.com/shared}\n      - {name: nvidia.com/mig-1g.10gb, replicas: 2, rename: example.com/shared}\n",
			want: []string{`sharing.timeSlicing.resources[1]: replicas of nvidia.com/mig-1g.10gb would be served as "example.com/shared", as are those of nvidia.com/gpu (sharing.timeSlicing.resources[0])`}},
		{name: "two catch-alls", body: res + "      - {name: nvidia.com/gpu, replicas: 2}\n      - {name: nvidia.com/gpu, replicas: 4}\n",
			want: []string{"sharing.timeSlicing.resources[1]: a second entry for nvidia.com/gpu without devices (sharing.timeSlicing.resources[0] has none either)", "give one devices, or remove one"}},
		{name: "same model twice", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [\"NVIDIA H100 80GB HBM3\"]}\n      - {name: nvidia.com/gpu, replicas: 4, devices: [\"GPU-1\", \"nvidia h100 80gb hbm3\"]}\n",
			want: []string{`sharing.timeSlicing.resources[1].devices[1]: "nvidia h100 80gb hbm3" is already selected for nvidia.com/gpu by sharing.timeSlicing.resources[0].devices[0]`, "remove one"}},
		{name: "same UUID twice in one entry", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [GPU-1, GPU-1]}\n",
			want: []string{`sharing.timeSlicing.resources[0].devices[1]: "GPU-1" is already selected for nvidia.com/gpu by sharing.timeSlicing.resources[0].devices[0]`}},
		{name: "device index", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [\"0\"]}\n",
			want: []string{`sharing.timeSlicing.resources[0].devices[0]: "0" looks like a device index`, "use the UUID"}},
		{name: "device unquoted number", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [0]}\n",
			want: []string{"sharing.timeSlicing.resources[0].devices: got a number, want a list of strings"}},
		{name: "device with spaces around", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [\" NVIDIA H100 80GB HBM3\"]}\n",
			want: []string{`sharing.timeSlicing.resources[0].devices[0]: " NVIDIA H100 80GB HBM3" has spaces around it`, `"NVIDIA H100 80GB HBM3"`}},
		{name: "empty device", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [\"\"]}\n",
			want: []string{"sharing.timeSlicing.resources[0].devices[0]: empty; use a UUID"}},
		{name: "GPU UUID for a MIG resource", body: "migStrategy: mixed\n" + res + "      - {name: nvidia.com/mig-1g.10gb, replicas: 2, devices: [GPU-1]}\n",
			want: []string{`sharing.timeSlicing.resources[0].devices[0]: "GPU-1" is a GPU UUID, which names no device of nvidia.com/mig-1g.10gb`}},
		{name: "unknown placement", body: ts + "    placement: spread\n",
			want: []string{`sharing.timeSlicing.placement: "spread" is not allowed; use one of distributed, packed`}},
		{name: "unknown migStrategy", body: "migStrategy: auto\n",
			want: []string{`migStrategy (--mig-strategy): "auto" is not allowed; use one of none, single, mixed`}},
		{name: "MIG resource with single", body: "migStrategy: single\n" + res + "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0].name: "nvidia.com/mig-1g.10gb" is never served with migStrategy single, which serves MIG devices as nvidia.com/gpu; use name nvidia.com/gpu, or migStrategy mixed`}},
		{name: "MIG resource with none", body: res + "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0].name: "nvidia.com/mig-1g.10gb" is never served with migStrategy none`, "set migStrategy mixed"}},
		{name: "MIG UUID under nvidia.com/gpu with mixed", body: "migStrategy: mixed\n" + res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [MIG-1]}\n",
			want: []string{`sharing.timeSlicing.resources[0].devices[0]: "MIG-1" is a MIG device, which migStrategy mixed never serves as nvidia.com/gpu`}},
		{name: "misspelt entry key", body: res + "      - {name: nvidia.com/gpu, replica: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0]: unknown key "replica"; known keys: name, rename, replicas, devices`}},
		{name: "entry key in another case", body: res + "      - {name: nvidia.com/gpu, Replicas: 2}\n",
			want: []string{`sharing.timeSlicing.resources[0]: unknown key "Replicas"`}},
		{name: "misspelt timeSlicing key", body: ts + "    renameByDefaults: true\n",
			want: []string{`sharing.timeSlicing: unknown key "renameByDefaults"; known keys: renameByDefault, failRequestsGreaterThanOne, placement, resources`}},
		{name: "misspelt sharing key", body: "sharing:\n  timeslicing: {}\n",
			want: []string{`sharing: unknown key "timeslicing"; known keys: timeSlicing`}},
		{name: "bool not a bool", body: ts + "    failRequestsGreaterThanOne: sometimes\n",
			want: []string{"sharing.timeSlicing.failRequestsGreaterThanOne: got a string, want true or false"}},
		{name: "sharing not a map", body: "sharing: [timeSlicing]\n",
			want: []string{"sharing: want a map with the key timeSlicing", "example-sharing.yaml"}},
		{name: "timeSlicing not a map", body: "sharing:\n  timeSlicing: on\n",
			want: []string{"sharing.timeSlicing: want a map of keys such as resources"}},
		{name: "resources not a list", body: ts + "    resources: {name: nvidia.com/gpu, replicas: 2}\n",
			want: []string{"sharing.timeSlicing.resources: want a list of entries, each with name and replicas"}},
		{name: "entry not a map", body: res + "      - nvidia.com/gpu\n",
			want: []string{"sharing.timeSlicing.resources[0]: want an entry with name and replicas"}},
		{name: "top-level key in another case", body: "Sharing: {}\n",
			want: []string{`unknown key "Sharing"; keys are case-sensitive: did you mean "sharing"?`}},
		{name: "every problem at once", body: res + "      - {name: nvidia.com/gpus, replicas: 1, rename: x}\n",
			want: []string{"resources[0].name", "resources[0].replicas", "resources[0].rename"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantConfigErrors(t, tt.body, tt.want...) })
	}
}

// The file-only checks fail Load itself, naming the file; those that
// depend on migStrategy wait for Validate, after flags.
func TestSharingErrorsAtLoad(t *testing.T) {
	p := writeFile(t, "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}\n")
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), "config: "+p+": sharing.timeSlicing.resources[0].replicas") {
		t.Fatalf("Load: %v", err)
	}
	c, err := Load(writeFile(t, "migStrategy: single\nsharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]}}\n"))
	if err != nil {
		t.Fatalf("Load refused what a flag could still fix: %v", err)
	}
	if err := c.Validate(); err == nil {
		t.Fatal("Validate accepted a MIG resource with migStrategy single")
	}
	if err := c.Set("migStrategy", MIGStrategyMixed); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate with --mig-strategy=mixed: %v", err)
	}
}

func TestMIGStrategySetting(t *testing.T) {
	var s Setting
	for _, x := range Settings() {
		if x.Key == "migStrategy" {
			s = x
		}
	}
	if s.Flag != "mig-strategy" || s.Env != "GPU_DEVICE_PLUGIN_MIG_STRATEGY" || s.Default != MIGStrategyNone {
		t.Fatalf("setting = %+v", s)
	}
	for _, w := range []string{"none", "single", "mixed", "DRA"} {
		if !strings.Contains(s.Usage, w) {
			t.Errorf("usage %q does not mention %s", s.Usage, w)
		}
	}
	for _, v := range migStrategies() {
		c := Default()
		if err := c.Set("migStrategy", v); err != nil || c.MIGStrategy != v {
			t.Fatalf("Set(%q) = %v, %q", v, err, c.MIGStrategy)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// Time-slicing under DRA is accepted: the DRA front-end ignores it and the
// daemon says so.
func TestSharingWithDRA(t *testing.T) {
	c, err := Load(writeFile(t, "kubeletAPI: dra\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

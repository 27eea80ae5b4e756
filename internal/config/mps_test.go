package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

const notThroughDRA = "sharing.mps: in DRA mode GPUs are shared through MPS by claims (opaque configuration, or sharing.memoryShares), not replicas; remove the section, or set kubeletAPI (--kubelet-api) to device-plugin"

func TestLoadExampleMPS(t *testing.T) {
	c, err := Load("testdata/example-mps.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Sharing{
		TimeSlicing: TimeSlicing{Placement: PlacementDistributed, Resources: []SharedResource{
			{Name: "nvidia.com/gpu", Replicas: 4, Devices: []string{"NVIDIA A100-SXM4-40GB"}},
		}},
		MPS: MPS{RenameByDefault: true, Resources: []SharedResource{
			{Name: "nvidia.com/gpu", Replicas: 8, Rename: "nvidia.com/h100.mps", Devices: []string{"NVIDIA H100 80GB HBM3"}},
			{Name: "nvidia.com/gpu", Replicas: 2, Devices: []string{h100UUID}},
		}},
	}
	if !reflect.DeepEqual(c.Sharing, want) {
		t.Errorf("sharing = %+v\nwant %+v", c.Sharing, want)
	}
	if !c.Sharing.MPS.Enabled() || Default().Sharing.MPS.Enabled() {
		t.Error("Enabled() wrong")
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// DRA mode refuses it with this one error only: the section itself
	// is valid.
	c.KubeletAPI = KubeletAPIDRA
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), notThroughDRA) || strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("Validate: %v, want only %q", err, notThroughDRA)
	}
	c.KubeletAPI, c.MPSRoot = KubeletAPIDevicePlugin, "run/mps"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "mpsRoot") {
		t.Errorf("relative mpsRoot: %v", err)
	}
	// The longest root whose control sockets fit 107 bytes, and one byte more.
	c.MPSRoot = "/" + strings.Repeat("m", MaxMPSRoot-1)
	if err := c.Validate(); err != nil {
		t.Errorf("mpsRoot of %d bytes: %v", len(c.MPSRoot), err)
	}
	if sock := c.MPSRoot + "/GPU-8c1e7d5a-0000-4000-8000-000000000000/pipe/control"; len(sock) != 107 {
		t.Errorf("MaxMPSRoot gives a %d-byte socket path, want 107", len(sock))
	}
	c.MPSRoot += "m"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "mpsRoot") || !strings.Contains(err.Error(), "1 too many") || strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("mpsRoot of %d bytes: %v, want one line saying it is 1 byte too long", len(c.MPSRoot), err)
	}
	c.MPSRoot = DefaultMPSRoot
	js, err := json.Marshal(c.Sharing)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"mps":{"renameByDefault":true,"resources":[{"name":"nvidia.com/gpu","rename":"nvidia.com/h100.mps","replicas":8,`) {
		t.Errorf("JSON: %s", js)
	}
	var back Sharing
	if err := json.Unmarshal(js, &back); err != nil || !reflect.DeepEqual(back, c.Sharing) {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}

func TestMPSErrors(t *testing.T) {
	const res = "sharing:\n  mps:\n    resources:\n"
	const ts = "  timeSlicing:\n    resources:\n"
	tests := []struct {
		name string
		body string
		want []string
	}{
		{name: "MIG resource", body: "migStrategy: mixed\n" + res + "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
			want: []string{`sharing.mps.resources[0].name: "nvidia.com/mig-1g.10gb" is a MIG resource, and the plugin runs MPS on whole GPUs only; use nvidia.com/gpu, or share MIG devices with sharing.timeSlicing`}},
		{name: "MIG UUID", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [MIG-1]}\n",
			want: []string{`sharing.mps.resources[0].devices[0]: "MIG-1" is a MIG device, and the plugin runs MPS on whole GPUs only`}},
		{name: "too many replicas", body: res + "      - {name: nvidia.com/gpu, replicas: 64}\n",
			want: []string{"sharing.mps.resources[0].replicas: 64 is too many; use at most 48 (an MPS server takes at most 48 client processes per GPU, and each replica runs at least one)"}},
		{name: "one replica", body: res + "      - {name: nvidia.com/gpu, replicas: 1}\n",
			want: []string{"sharing.mps.resources[0].replicas: 1 is too few"}},
		{name: "name missing", body: res + "      - {replicas: 2}\n",
			want: []string{"sharing.mps.resources[0].name: missing; use nvidia.com/gpu (MPS shares whole GPUs)"}},
		{name: "other name", body: res + "      - {name: example.com/gpu, replicas: 2}\n",
			want: []string{`sharing.mps.resources[0].name: "example.com/gpu" is not a resource MPS can share; use nvidia.com/gpu`}},
		{name: "both catch-all", body: res + "      - {name: nvidia.com/gpu, replicas: 2, rename: example.com/mps}\n" + ts + "      - {name: nvidia.com/gpu, replicas: 4}\n",
			want: []string{"sharing.mps.resources[0]: every nvidia.com/gpu would be shared through MPS, and sharing.timeSlicing.resources[0] time-slices every nvidia.com/gpu too; a GPU is shared one way"}},
		{name: "same model both ways", body: res + "      - {name: nvidia.com/gpu, replicas: 2, rename: example.com/mps, devices: [\"NVIDIA H100 80GB HBM3\"]}\n" + ts + "      - {name: nvidia.com/gpu, replicas: 4, devices: [\"nvidia h100 80gb hbm3\"]}\n",
			want: []string{`sharing.mps.resources[0].devices[0]: "NVIDIA H100 80GB HBM3" is also time-sliced by sharing.timeSlicing.resources[0].devices[0]; a GPU is shared one way: remove one`}},
		{name: "one name both ways", body: res + "      - {name: nvidia.com/gpu, replicas: 2, devices: [GPU-1]}\n" + ts + "      - {name: nvidia.com/gpu, replicas: 4, devices: [GPU-2]}\n",
			want: []string{`sharing.mps.resources[0]: replicas would be served as "nvidia.com/gpu", as are those of sharing.timeSlicing.resources[0], which shares its devices the other way`}},
		{name: "misspelt key", body: "sharing:\n  mps:\n    replicas: 2\n",
			want: []string{`sharing.mps: unknown key "replicas"; known keys: renameByDefault, failRequestsGreaterThanOne, maxSharesPerContainer, resources`}},
		{name: "placement is time-slicing's", body: "sharing:\n  mps:\n    placement: packed\n",
			want: []string{`sharing.mps: unknown key "placement"`}},
		{name: "not a map", body: "sharing:\n  mps: on\n",
			want: []string{"sharing.mps: want a map of keys such as resources"}},
		{name: "more shares per container than an entry has replicas", body: "sharing:\n  mps:\n    maxSharesPerContainer: 4\n    resources:\n      - {name: nvidia.com/gpu, replicas: 8, devices: [GPU-1]}\n      - {name: nvidia.com/gpu, replicas: 2, devices: [GPU-2]}\n",
			want: []string{"sharing.mps.maxSharesPerContainer: 4 is more than the 2 replicas of sharing.mps.resources[1]; use at most 2, or give that entry more replicas"}},
		{name: "negative shares per container", body: "sharing:\n  mps:\n    maxSharesPerContainer: -1\n",
			want: []string{"sharing.mps.maxSharesPerContainer: -1 is too few; use 1 (the default: one share per container) or more"}},
		{name: "several shares per container beside failRequestsGreaterThanOne", body: "sharing:\n  mps:\n    failRequestsGreaterThanOne: true\n    maxSharesPerContainer: 2\n",
			want: []string{"sharing.mps.maxSharesPerContainer: 2 shares per container, but sharing.mps.failRequestsGreaterThanOne is true, which allows one; remove one of the two keys"}},
		{name: "shares per container mistyped", body: "sharing:\n  mps:\n    maxSharesPerContainer: all\n",
			want: []string{"sharing.mps.maxSharesPerContainer: got a string, want a whole number"}},
		{name: "entry key mistyped", body: res + "      - {name: nvidia.com/gpu, replicas: two}\n",
			want: []string{"sharing.mps.resources[0].replicas: got a string, want a whole number"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantConfigErrors(t, tt.body, tt.want...) })
	}
}

// maxSharesPerContainer may be as many as the fewest replicas (package
// sharing's TestSharesPerContainer: what a container may hold).
func TestMPSSharesPerContainer(t *testing.T) {
	c, err := Load(writeFile(t, "sharing:\n  mps:\n    maxSharesPerContainer: 2\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil || c.Sharing.MPS.MaxSharesPerContainer != 2 {
		t.Errorf("as many shares as replicas: %v, %d", err, c.Sharing.MPS.MaxSharesPerContainer)
	}
}

// Sharing different GPUs each way, under different names, is fine.
func TestMPSBesideTimeSlicing(t *testing.T) {
	c, err := Load(writeFile(t, "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4, rename: example.com/mps, devices: [GPU-1]}]\n"+
		"  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4, devices: [GPU-2]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if errs := validateSharing(c, true); len(errs) != 0 {
		t.Errorf("errors %v", errs)
	}
}

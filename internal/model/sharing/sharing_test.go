package sharing

import (
	"strings"
	"testing"
)

const h100UUID = "GPU-5c1d7c3e-2a4b-4f6e-9d0a-1b2c3d4e5f60"

// exampleSharing is config's testdata/example-sharing.yaml (config's
// TestLoadExampleSharing pins the file).
var exampleSharing = struct{ TimeSlicing TimeSlicing }{TimeSlicing{
	Rules: Rules{
		RenameByDefault: true,
		Resources: []Resource{
			{Name: "nvidia.com/gpu", Replicas: 4},
			{Name: "nvidia.com/gpu", Replicas: 8, Rename: "nvidia.com/h100.shared", Devices: []string{"NVIDIA H100 80GB HBM3"}},
			{Name: "nvidia.com/gpu", Replicas: 2, Devices: []string{h100UUID}},
			{Name: "nvidia.com/mig-1g.10gb", Replicas: 7},
		},
	},
	Placement:                  "packed",
	FailRequestsGreaterThanOne: true,
}}

func TestReplicas(t *testing.T) {
	const (
		h100  = "NVIDIA H100 80GB HBM3"
		a100  = "NVIDIA A100-SXM4-40GB"
		other = "GPU-00000000-0000-0000-0000-000000000000"
		mig   = "MIG-8b2f3c4d-0000-5555-aaaa-123456789abc"
	)
	ts := exampleSharing.TimeSlicing
	tests := []struct {
		name                string
		ts                  TimeSlicing
		resource, uuid, mdl string
		replicas            int
		as                  string
	}{
		{"UUID wins over model", ts, "nvidia.com/gpu", h100UUID, h100, 2, "nvidia.com/gpu.shared"},
		{"UUID in another case", ts, "nvidia.com/gpu", strings.ToLower(h100UUID), h100, 2, "nvidia.com/gpu.shared"},
		{"model wins over catch-all, renamed", ts, "nvidia.com/gpu", other, h100, 8, "nvidia.com/h100.shared"},
		{"catch-all, renamed by default", ts, "nvidia.com/gpu", other, a100, 4, "nvidia.com/gpu.shared"},
		{"MIG profile entry", ts, "nvidia.com/mig-1g.10gb", mig, h100, 7, "nvidia.com/mig-1g.10gb.shared"},
		{"no entry for the resource", ts, "nvidia.com/mig-3g.40gb", mig, h100, 1, "nvidia.com/mig-3g.40gb"},
		{"no sharing", TimeSlicing{}, "nvidia.com/gpu", other, h100, 1, "nvidia.com/gpu"},
		{"no rename, not by default", TimeSlicing{Rules: Rules{Resources: []Resource{{Name: "nvidia.com/gpu", Replicas: 3}}}}, "nvidia.com/gpu", other, a100, 3, "nvidia.com/gpu"},
		{"only devices entries, device not named", TimeSlicing{Rules: Rules{Resources: []Resource{{Name: "nvidia.com/gpu", Replicas: 3, Devices: []string{h100}}}}}, "nvidia.com/gpu", other, a100, 1, "nvidia.com/gpu"},
		{"UUID entry after model entry still wins", TimeSlicing{Rules: Rules{RenameByDefault: true, Resources: []Resource{
			{Name: "nvidia.com/gpu", Replicas: 3, Devices: []string{a100}},
			{Name: "nvidia.com/gpu", Replicas: 5, Rename: "example.com/special", Devices: []string{"gpu-0000", other}},
		}}}, "nvidia.com/gpu", other, a100, 5, "example.com/special"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, as := tt.ts.Replicas(tt.resource, tt.uuid, tt.mdl)
			if n != tt.replicas || as != tt.as {
				t.Errorf("Replicas(%q, %q, %q) = %d, %q; want %d, %q", tt.resource, tt.uuid, tt.mdl, n, as, tt.replicas, tt.as)
			}
		})
	}
}

func TestMPSReplicas(t *testing.T) {
	m := MPS{Rules: Rules{RenameByDefault: true, Resources: []Resource{
		{Name: "nvidia.com/gpu", Replicas: 8, Devices: []string{"NVIDIA H100 80GB HBM3"}},
		{Name: "nvidia.com/gpu", Replicas: 2, Rename: "example.com/half", Devices: []string{h100UUID}},
	}}}
	for _, tt := range []struct {
		uuid, model string
		n           int
		name        string
	}{
		{"GPU-other", "NVIDIA H100 80GB HBM3", 8, "nvidia.com/gpu.shared"},
		{strings.ToLower(h100UUID), "NVIDIA H100 80GB HBM3", 2, "example.com/half"},
		{"GPU-other", "NVIDIA A100-SXM4-40GB", 1, "nvidia.com/gpu"},
	} {
		if n, name := m.Replicas("nvidia.com/gpu", tt.uuid, tt.model); n != tt.n || name != tt.name {
			t.Errorf("Replicas(%s, %s) = %d, %s; want %d, %s", tt.uuid, tt.model, n, name, tt.n, tt.name)
		}
	}
}

// One share per container unless maxSharesPerContainer says more (config's
// failRequestsGreaterThanOne: true is the default: daemon's
// TestSharingOptions).
func TestSharesPerContainer(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    MPS
		want int
	}{
		{"default", MPS{}, 1},
		{"several", MPS{MaxSharesPerContainer: 4}, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.m.SharesPerContainer(); got != tt.want {
				t.Errorf("SharesPerContainer() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestIntervalLevel(t *testing.T) {
	for name, want := range map[string]int{IntervalDefault: 0, IntervalShort: 1, IntervalMedium: 2, IntervalLong: 3} {
		if got, ok := IntervalLevel(name); !ok || got != want {
			t.Errorf("IntervalLevel(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	if _, ok := IntervalLevel("short"); ok {
		t.Error("an interval in another case is one")
	}
}

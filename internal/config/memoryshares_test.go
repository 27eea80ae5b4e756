package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadExampleMemoryShares(t *testing.T) {
	c, err := Load("testdata/example-memory-shares.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := c.Sharing.MemoryShares
	if !m.Enabled || m.MinimumBytes() != 2<<30 {
		t.Errorf("memoryShares = %+v (minimum %d bytes), want enabled, 2Gi", m, m.MinimumBytes())
	}
	if !m.Selects(0, "GPU-1", "0000:01:00.0", "nvidia h100 80gb hbm3") || m.Selects(1, "GPU-2", "0000:02:00.0", "NVIDIA A100-SXM4-40GB") {
		t.Error("Selects: want the H100 (model, any case) and not the A100")
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if (MemoryShares{Enabled: true}).MinimumBytes() != 1<<30 {
		t.Errorf("default minimum is not %s", DefaultMemoryShareMinimum)
	}
	for in, want := range map[string]uint64{"512Mi": 512 << 20, "2G": 2e9, "1048576": 1 << 20, "3Ti": 3 << 40} {
		if got := (MemoryShares{Enabled: true, Minimum: in}).MinimumBytes(); got != want {
			t.Errorf("minimum %s = %d bytes, want %d", in, got, want)
		}
	}
	if !(MemoryShares{Enabled: true}).Selects(3, "GPU-3", "", "any") || (MemoryShares{}).Selects(3, "GPU-3", "", "any") {
		t.Error("Selects: enabled without devices selects every GPU; disabled, none")
	}
}

func TestMemorySharesErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"device-plugin mode", "sharing: {memoryShares: {enabled: true}}", "sharing.memoryShares: memory shares are claims' consumable capacity, a DRA feature; set kubeletAPI (--kubelet-api) to dra"},
		{"bad minimum", "kubeletAPI: dra\nsharing: {memoryShares: {enabled: true, minimum: lots}}", `sharing.memoryShares.minimum: "lots" is not a size`},
		{"zero minimum", "kubeletAPI: dra\nsharing: {memoryShares: {enabled: true, minimum: \"0\"}}", `sharing.memoryShares.minimum: "0" is not above zero`},
		{"MIG device", "kubeletAPI: dra\nsharing: {memoryShares: {enabled: true, devices: [MIG-1]}}", `sharing.memoryShares.devices[0]: "MIG-1" is a MIG device`},
		{"not enabled", "kubeletAPI: dra\nsharing: {memoryShares: {minimum: 2Gi}}", "sharing.memoryShares: devices or minimum are set but enabled is not"},
		{"unknown key", "kubeletAPI: dra\nsharing: {memoryShares: {enabled: true, minimun: 2Gi}}", "sharing.memoryShares"},
		{"wrong type", "kubeletAPI: dra\nsharing: {memoryShares: {enabled: yes please}}", "sharing.memoryShares.enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p)
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadExampleMIGPartitions(t *testing.T) {
	c, err := Load("testdata/example-mig-partitions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := c.Sharing.MIGPartitions
	if !m.Enabled || !m.Selects(2, "GPU-2", "0000:87:00.0", "NVIDIA H100 80GB HBM3") || m.Selects(1, "GPU-1", "0000:0f:00.0", "NVIDIA H100 80GB HBM3") {
		t.Errorf("migPartitions = %+v: want GPU 2 only", m)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if !(MIGPartitions{Enabled: true}).Selects(5, "GPU-5", "", "any") || (MIGPartitions{}).Selects(5, "GPU-5", "", "any") {
		t.Error("Selects: enabled without devices selects every GPU; disabled, none")
	}
}

func TestMIGPartitionsErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"device-plugin mode", "sharing: {migPartitions: {enabled: true}}", "sharing.migPartitions: MIG partitions are made for DRA claims; set kubeletAPI (--kubelet-api) to dra"},
		{"MIG device", "kubeletAPI: dra\nsharing: {migPartitions: {enabled: true, devices: [MIG-1]}}", `sharing.migPartitions.devices[0]: "MIG-1" is a MIG device`},
		{"blank device", "kubeletAPI: dra\nsharing: {migPartitions: {enabled: true, devices: [\" 2\"]}}", `sharing.migPartitions.devices[0]: " 2" matches no GPU`},
		{"not enabled", "kubeletAPI: dra\nsharing: {migPartitions: {devices: [\"2\"]}}", "sharing.migPartitions: devices are set but enabled is not"},
		{"unknown key", "kubeletAPI: dra\nsharing: {migPartitions: {enabled: true, profiles: [3g.40gb]}}", "sharing.migPartitions"},
		{"wrong type", "kubeletAPI: dra\nsharing: {migPartitions: {enabled: sure}}", "sharing.migPartitions.enabled"},
		{"not a map", "kubeletAPI: dra\nsharing: {migPartitions: yes}", "sharing.migPartitions: want a map with the keys enabled and devices"},
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

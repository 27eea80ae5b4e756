package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// remediation.cordon asks the API server at the start whether the Node
// carries a cordon of the plugin's own to lift (none here: a read, no
// write), through the same client as the others.
func TestCordonChecksAtStart(t *testing.T) {
	kubeconfig, calls := fakeAPIServer(t)
	cfg := testConfig(t)
	cfg.Remediation.Enabled, cfg.Remediation.Cordon = true, true
	cfg.Kubeconfig, cfg.NodeName = kubeconfig, "n1"
	lib := nvmltest.NewDGXA100()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, nil) }()
	waitFor(t, calls, "the cordon's read of the Node", func(c apiCall) bool { return c.method == "GET" && c.path == "/api/v1/nodes/n1" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for range len(calls) {
		if c := <-calls; c.method != "GET" {
			t.Errorf("%s %s with no cordon of ours on the Node", c.method, c.path)
		}
	}
}

// remediation.cordon without API access fails the start, naming the
// setting; with the remediation off it needs none.
func TestCordonNeedsAPIAccess(t *testing.T) {
	cfg := testConfig(t)
	cfg.Remediation.Enabled, cfg.Remediation.Cordon = true, true
	cfg.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	err := Run(context.Background(), cfg, func(string) (nvml.Library, error) { return nil, nvml.ErrNoDriver }, nil)
	if err == nil || !strings.Contains(err.Error(), "remediation.cordon need API access") {
		t.Fatalf("err = %v", err)
	}
	cfg.Remediation.Enabled = false
	if users := apiUsers(cfg); len(users) != 0 {
		t.Errorf("API users %v with the remediation off", users)
	}
}

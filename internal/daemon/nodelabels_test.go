package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// With nodeLabels: node the GPUs' labels reach the Node in one merge
// patch, through the same API client as reporting, which is off here.
func TestNodeLabelsOnTheNode(t *testing.T) {
	kubeconfig, calls := fakeAPIServer(t)
	cfg := testConfig(t)
	cfg.NodeLabels, cfg.Kubeconfig, cfg.NodeName = config.NodeLabelsNode, kubeconfig, "n1"
	lib := nvmltest.NewDGXA100()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return lib, nil }, nil) }()

	c := waitFor(t, calls, "labels patch", func(c apiCall) bool { return c.method == "PATCH" })
	if c.path != "/api/v1/nodes/n1" {
		t.Fatalf("PATCH %s, want the Node", c.path)
	}
	md, _ := c.body["metadata"].(map[string]any)
	l, _ := md["labels"].(map[string]any)
	a, _ := md["annotations"].(map[string]any)
	if l["nvidia.com/gpu.count"] != "8" || !strings.Contains(l["nvidia.com/gpu.product"].(string), "A100") {
		t.Errorf("labels %v", l)
	}
	list, _ := a[nodelabels.Annotation].(string)
	if n := len(strings.Split(list, ",")); n != len(l) || len(c.body) != 1 || len(md) != 2 {
		t.Errorf("annotation lists %d keys for %d labels; body %v", n, len(l), c.body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// nodeLabels: node without API access fails the start, naming the setting.
func TestNodeLabelsNeedAPIAccess(t *testing.T) {
	cfg := testConfig(t)
	cfg.NodeLabels = config.NodeLabelsNode
	cfg.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	err := Run(context.Background(), cfg, func(string) (nvml.Library, error) { return nil, nvml.ErrNoDriver }, nil)
	if err == nil || !strings.Contains(err.Error(), "nodeLabels: node need API access") || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("err = %v", err)
	}
}

package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestNoKubernetesClientCode keeps the device-plugin executable lean: Go
// runs every linked package's init, and the Kubernetes API types and
// client alone took its peak RSS from 26 to 61 MiB. DRA mode, which needs
// them, is gpu-device-plugin-dra. Nor Prometheus's client libraries
// (issue 44): the binary is all resident, and /metrics is written by
// internal/observe/metrics/exposition.
func TestNoKubernetesClientCode(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery", "k8s.io/dynamic-resource-allocation", "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra",
			"github.com/prometheus"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("gpu-device-plugin links %s", p)
			}
		}
	}
}

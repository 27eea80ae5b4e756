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
// internal/observe/metrics/exposition. Nor grpc-go and protobuf's runtime:
// internal/grpcwire speaks the kubelet's gRPC over net/http.
func TestNoKubernetesClientCode(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery", "k8s.io/dynamic-resource-allocation", "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra",
			"github.com/prometheus", "google.golang.org/grpc", "k8s.io/kubelet"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("gpu-device-plugin links %s", p)
			}
		}
		// protowire alone encodes the kubelet's messages (internal/grpcwire);
		// protobuf's runtime is reflection and registries, megabytes resident.
		if rest, ok := strings.CutPrefix(p, "google.golang.org/protobuf/"); ok && rest != "encoding/protowire" && rest != "internal/errors" && rest != "internal/detrand" {
			t.Errorf("gpu-device-plugin links %s; only protowire is needed", p)
		}
	}
}

package kubelet

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestNoHeavyDependencies keeps the package to what the DRA executable
// needs of the kubelet's side: client-go's clientset, grpc-go, protobuf's
// runtime and k8s.io/kubelet's generated code are what made it 36 MB.
func TestNoHeavyDependencies(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go", "google.golang.org/grpc", "k8s.io/kubelet",
			"k8s.io/dynamic-resource-allocation/kubeletplugin", "k8s.io/dynamic-resource-allocation/resourceslice"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("the package links %s", p)
			}
		}
		// protowire alone encodes the messages; protobuf's runtime is
		// reflection and registries.
		if rest, ok := strings.CutPrefix(p, "google.golang.org/protobuf/"); ok && rest != "encoding/protowire" && rest != "internal/errors" && rest != "internal/detrand" {
			t.Errorf("the package links %s; only protowire is needed", p)
		}
	}
}

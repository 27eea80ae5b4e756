package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestNoKubernetesClientCode keeps device-plugin mode lean, in this
// executable and in gpu-device-plugin, which serves in its own process
// when this one is not beside it. Go runs every linked package's init,
// and the Kubernetes API types and client alone took peak RSS from 26 to
// 61 MiB; DRA mode, which needs them, is gpu-device-plugin-dra. Nor
// Prometheus's client libraries (issue 44): the executable is all
// resident, and /metrics is written by internal/observe/metrics/exposition.
// Nor grpc-go and protobuf's runtime: internal/grpcwire speaks the
// kubelet's gRPC.
func TestNoKubernetesClientCode(t *testing.T) {
	for _, dir := range []string{".", "../gpu-device-plugin"} {
		for _, p := range deps(t, dir) {
			for _, banned := range []string{"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery", "k8s.io/dynamic-resource-allocation", "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra",
				"github.com/prometheus", "google.golang.org/grpc", "k8s.io/kubelet"} {
				if p == banned || strings.HasPrefix(p, banned+"/") {
					t.Errorf("%s links %s", dir, p)
				}
			}
			// protowire alone encodes the kubelet's messages (internal/grpcwire);
			// protobuf's runtime is reflection and registries, megabytes resident.
			if rest, ok := strings.CutPrefix(p, "google.golang.org/protobuf/"); ok && rest != "encoding/protowire" && rest != "internal/errors" && rest != "internal/detrand" {
				t.Errorf("%s links %s; only protowire is needed", dir, p)
			}
		}
	}
}

// TestNoCLI keeps the CLI out of the daemon, the reason it is a program of
// its own: urfave/cli's help printer runs text/template, whose run-time
// method lookup (reflect.Value.MethodByName) makes Go's linker keep every
// exported method of every type put in an interface, 2 MB of the 14.9 MB
// the daemon was, all of it resident (docs/architecture.md).
func TestNoCLI(t *testing.T) {
	for _, p := range deps(t, ".") {
		if strings.HasPrefix(p, "github.com/urfave/cli") {
			t.Errorf("gpu-device-plugin-dp links %s", p)
		}
	}
}

// TestNoTemplates keeps text/template and html/template out of both
// daemons as the Makefile builds them, for the reason above. In DRA mode,
// with every Kubernetes API type linked, they were 21 MB of a 57 MB
// executable: grpc-go's request tracing brought them, and the build tag
// grpcnotrace in GOTAGS leaves it out.
func TestNoTemplates(t *testing.T) {
	if tags := makefileTags(t); !strings.Contains(tags, "grpcnotrace") {
		t.Errorf("the Makefile's GOTAGS (%q) lacks grpcnotrace", tags)
	}
	for _, dir := range []string{".", "../gpu-device-plugin-dra"} {
		for _, p := range deps(t, dir) {
			if p == "text/template" || p == "html/template" {
				t.Errorf("%s built with the Makefile's GOTAGS links %s", dir, p)
			}
		}
	}
}

// deps are the packages the main package in dir links, built with the
// Makefile's GOTAGS.
func deps(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", "-tags", makefileTags(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", dir, err, out)
	}
	return strings.Fields(string(out))
}

// makefileTags is the Makefile's GOTAGS.
func makefileTags(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "GOTAGS = "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("the Makefile sets no GOTAGS")
	return ""
}

// TestDRANoClientGo keeps gpu-device-plugin-dra to the API types it
// needs: client-go's clientset registers every API group (55 group
// versions), which made the DRA daemon 36 MB of loaded segments, all
// resident (issue 44). The kubelet's side is internal/serve/dra/kubelet
// over internal/grpcwire, the API server's draapi and slicepub over
// internal/kubeapi, and the ComputeDomain controller, which needs
// informers and leader election, is gpu-device-plugin-controller.
func TestDRANoClientGo(t *testing.T) {
	dir := "../gpu-device-plugin-dra"
	for _, p := range deps(t, dir) {
		for _, banned := range []string{"k8s.io/client-go", "google.golang.org/grpc", "k8s.io/kubelet", "github.com/prometheus",
			"k8s.io/dynamic-resource-allocation/kubeletplugin", "k8s.io/dynamic-resource-allocation/resourceslice",
			"github.com/gpu-device-plugin/gpu-device-plugin/internal/control", "github.com/urfave/cli"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("%s links %s", dir, p)
			}
		}
		if rest, ok := strings.CutPrefix(p, "google.golang.org/protobuf/"); ok && rest != "encoding/protowire" && rest != "internal/errors" && rest != "internal/detrand" {
			t.Errorf("%s links %s; only protowire is needed", dir, p)
		}
		// Of the API groups, resource.k8s.io/v1 and what it uses.
		if rest, ok := strings.CutPrefix(p, "k8s.io/api/"); ok && rest != "resource/v1" && rest != "core/v1" {
			t.Errorf("%s links %s", dir, p)
		}
	}
}

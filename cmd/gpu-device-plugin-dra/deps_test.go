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

// TestNoTemplates keeps text/template and html/template out of the DRA
// executable as the Makefile builds it. Their run-time method lookup
// (reflect.Value.MethodByName) makes Go's linker keep every exported
// method of every type put in an interface, and with every Kubernetes API
// type linked that was 21 MB of a 57 MB executable, all of it resident
// (docs/architecture.md, "DRA mode"). grpc-go's request tracing brought
// them; the build tag grpcnotrace in GOTAGS leaves it out.
func TestNoTemplates(t *testing.T) {
	tags := makefileTags(t)
	if !strings.Contains(tags, "grpcnotrace") {
		t.Errorf("the Makefile's GOTAGS (%q) lacks grpcnotrace", tags)
	}
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", "-tags", tags, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "text/template" || p == "html/template" {
			t.Errorf("gpu-device-plugin-dra built with GOTAGS %q links %s", tags, p)
		}
	}
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

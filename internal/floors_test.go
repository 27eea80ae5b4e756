// Package internal_test pins the floor plan of docs/architecture.md: which
// floor may import which. Go already refuses cycles; this refuses the
// imports that would blur a floor's job even without a cycle.
package internal_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gpu-device-plugin/gpu-device-plugin/"

// floor is the first one or two elements of a package path under internal:
// "hw", "model", "serve", "node", "observe", "config", or a leaf package.
func floor(pkg string) string {
	first, _, _ := strings.Cut(pkg, "/")
	return first
}

// leaves hold no knowledge of devices and import nothing of ours, so any
// floor may use them.
var leaves = []string{"atomicfile", "grpcwire", "jsonkeep", "kubeapi", "logtest", "resname"}

// allowed names, per floor, the floors its product code may import besides
// itself and the leaves.
var allowed = map[string][]string{
	"hw":      {},
	"config":  {"hw"},
	"model":   {"hw", "config"},
	"node":    {"hw", "config", "model"},
	"observe": {"hw", "config", "model"},
	"serve":   {"hw", "config", "model", "node"},
	"state":   {},
	"ocihook": {},
	"daemon":  {"hw", "config", "model", "node", "observe", "serve", "state"},
	// control is the cluster-wide controllers (ComputeDomains): the
	// model's values, no node's hardware.
	"control": {"config", "model"},
}

// banned modules are kubelet, gRPC and Kubernetes code: the model and the
// inputs describe devices in terms of no kubelet API.
var banned = map[string][]string{
	"hw":     {"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/dynamic-resource-allocation"},
	"config": {"k8s.io/", "google.golang.org/grpc"},
	"model":  {"k8s.io/", "google.golang.org/grpc"},
}

// bannedEverywhere are modules no floor's product code imports:
// Prometheus's client library, about 1 MiB of each executable and all of
// it resident (issue 44); internal/observe/metrics/exposition writes
// /metrics instead.
var bannedEverywhere = []string{"github.com/prometheus/client_golang"}

func TestFloors(t *testing.T) {
	imports := map[string]map[string]bool{} // package under internal -> its imports
	var wholeConfig []string                // files below daemon that name config.Config
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(p))
		if fl := floor(pkg); fl != "config" && fl != "daemon" && !isTestSupport(pkg) && namesWholeConfig(f) {
			wholeConfig = append(wholeConfig, p)
		}
		if imports[pkg] == nil {
			imports[pkg] = map[string]bool{}
		}
		for _, is := range f.Imports {
			ip, _ := strconv.Unquote(is.Path.Value)
			imports[pkg][ip] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(imports) < 20 {
		t.Fatalf("found %d packages under internal; the walk is broken", len(imports))
	}
	// Settings reach the floors below daemon as small option types, or as
	// config's plain value types (a NIC resource entry), never whole.
	for _, p := range wholeConfig {
		t.Errorf("internal/%s names config.Config: take an option type that daemon builds (internal/daemon/options.go)", p)
	}
	for pkg, ims := range imports {
		from := floor(pkg)
		if isTestSupport(pkg) {
			continue
		}
		for ip := range ims {
			if rest, ok := strings.CutPrefix(ip, module+"internal/"); ok {
				to := floor(rest)
				if to == from || slices.Contains(leaves, rest) {
					continue
				}
				if !slices.Contains(allowed[from], to) {
					t.Errorf("internal/%s imports internal/%s: floor %q may import only %v and the leaves %v", pkg, rest, from, allowed[from], leaves)
				}
				continue
			}
			for _, b := range bannedEverywhere {
				if ip == b || strings.HasPrefix(ip, b+"/") {
					t.Errorf("internal/%s imports %s", pkg, ip)
				}
			}
			for _, b := range banned[from] {
				if ip == strings.TrimSuffix(b, "/") || strings.HasPrefix(ip, strings.TrimSuffix(b, "/")+"/") {
					t.Errorf("internal/%s imports %s: floor %q names no kubelet, gRPC or Kubernetes code", pkg, ip, from)
				}
			}
		}
	}
	// The front-ends never import each other.
	for pkg, ims := range imports {
		if !strings.HasPrefix(pkg, "serve/") {
			continue
		}
		for ip := range ims {
			rest, ok := strings.CutPrefix(ip, module+"internal/serve/")
			if !ok {
				continue
			}
			if frontEnd(pkg) != frontEnd("serve/"+rest) {
				t.Errorf("internal/%s imports internal/serve/%s: the two kubelet front-ends stay apart", pkg, rest)
			}
		}
	}
}

// namesWholeConfig reports whether f mentions config.Config.
func namesWholeConfig(f *ast.File) bool {
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Config" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "config" {
				found = true
			}
		}
		return !found
	})
	return found
}

// frontEnd groups the device-plugin packages (deviceplugin, dpnode) apart
// from DRA's.
func frontEnd(pkg string) string {
	if strings.HasPrefix(pkg, "serve/dra") {
		return "dra"
	}
	return "deviceplugin"
}

// isTestSupport reports mock and fixture packages, which exist for tests
// and may reach across floors.
func isTestSupport(pkg string) bool {
	base := path.Base(pkg)
	return strings.HasSuffix(base, "test") || pkg == "logtest" || strings.Contains(pkg, "/mpstest")
}

package release

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A fake release: the real chart, nfpm.yaml, imagebuild, pkgbuild and
// Assemble, on small static stand-ins for the binaries (one module with
// a cmd/ package for each of Binaries, stamped as make stamps them, and
// the dp and DRA executables and the controller stripped as make strips
// them; one dependency
// module so the SBOM has one), for linux/amd64 and linux/arm64. Built
// once per test run; tests that spoil it work on a copy.
const fakeVersion = "v9.8.7-fake"

var fakePlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// fakeCreated is the SOURCE_DATE_EPOCH of the fake release.
var fakeCreated = time.Unix(1700000000, 0).UTC()

type fakeRelease struct {
	dir   string // the release folder
	work  string // per-platform binaries and image.tar
	tools string // imagebuild, pkgbuild
}

var (
	fakeOnce sync.Once
	fake     fakeRelease
	fakeErr  error
	// shared is removed when the tests end.
	shared string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "release-test-")
	if err != nil {
		panic(err)
	}
	shared = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// theFakeRelease builds the fake release once.
func theFakeRelease(t *testing.T) fakeRelease {
	t.Helper()
	fakeOnce.Do(func() { fake, fakeErr = buildFake(shared) })
	if fakeErr != nil {
		t.Fatalf("building the fake release: %v", fakeErr)
	}
	return fake
}

// run runs a command, its output in the error.
func run(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// yamlSum is go.yaml.in/yaml/v3's go.sum lines, from the tools' own
// go.sum: the module is in the module cache, as the tests import it.
func yamlSum() (string, error) {
	f, err := os.Open("../go.sum")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var out strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "go.yaml.in/yaml/v3 v3.0.4 ") {
			out.WriteString(sc.Text() + "\n")
		}
	}
	return out.String(), sc.Err()
}

func buildFake(root string) (fakeRelease, error) {
	f := fakeRelease{dir: filepath.Join(root, "release"), work: filepath.Join(root, "work"), tools: filepath.Join(root, "tools")}
	src := filepath.Join(root, "src")
	sum, err := yamlSum()
	if err != nil {
		return f, err
	}
	files := map[string]string{
		"go.mod": "module github.com/gpu-device-plugin/gpu-device-plugin\n\ngo 1.21\n\nrequire go.yaml.in/yaml/v3 v3.0.4\n",
		"go.sum": sum,
	}
	for _, b := range Binaries() {
		files["cmd/"+b+"/main.go"] = "package main\n\nimport \"go.yaml.in/yaml/v3\"\n\nvar version = \"dev\"\n\nfunc main() { _, _ = yaml.Marshal(version) }\n"
	}
	for name, content := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return f, err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return f, err
		}
	}
	// The module cache only: no network in a unit test.
	goenv := []string{"CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off"}
	for _, p := range fakePlatforms {
		out := PlatformDir(f.work, p)
		env := append(goenv, "GOOS="+p.OS, "GOARCH="+p.Arch)
		ldflags := "-X main.version=" + fakeVersion + " -X main.commit=abc1234"
		if err := run(src, env, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out+"/", "./cmd/..."); err != nil {
			return f, err
		}
		// Stripped, as make builds them: the executables serve runs and the
		// controller.
		if err := run(src, env, "go", "build", "-trimpath", "-ldflags", "-s -w "+ldflags, "-o", out+"/", "./cmd/gpu-device-plugin-dp", "./cmd/gpu-device-plugin-dra", "./cmd/gpu-device-plugin-controller"); err != nil {
			return f, err
		}
	}
	if err := run("..", []string{"GOWORK=off"}, "go", "build", "-o", f.tools+"/", "./imagebuild", "./pkgbuild"); err != nil {
		return f, err
	}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return f, err
	}
	for _, p := range fakePlatforms {
		if err := f.image(p, fakeVersion, filepath.Join(PlatformDir(f.work, p), "image.tar")); err != nil {
			return f, err
		}
		if err := f.packages(p, fakeVersion, f.dir); err != nil {
			return f, err
		}
	}
	return f, Assemble(f.options(f.dir))
}

// image runs imagebuild as make release does.
func (f fakeRelease) image(p Platform, version, out string) error {
	pd := PlatformDir(f.work, p)
	return run("", nil, filepath.Join(f.tools, "imagebuild"),
		"-binary", filepath.Join(pd, "gpu-device-plugin"), "-dp", filepath.Join(pd, "gpu-device-plugin-dp"),
		"-dra", filepath.Join(pd, "gpu-device-plugin-dra"), "-controller", filepath.Join(pd, "gpu-device-plugin-controller"),
		"-hook", filepath.Join(pd, HookBinary), "-pci-ids", "none", "-version", version, "-commit", "abc1234",
		"-created", fmt.Sprint(fakeCreated.Unix()), "-repository", "example.com/gpu-device-plugin", "-o", out)
}

// packages runs pkgbuild as make release does.
func (f fakeRelease) packages(p Platform, version, out string) error {
	pd := PlatformDir(f.work, p)
	return run("", []string{fmt.Sprintf("SOURCE_DATE_EPOCH=%d", fakeCreated.Unix())}, filepath.Join(f.tools, "pkgbuild"),
		"-root", root, "-config", filepath.Join(root, "packaging/nfpm.yaml"),
		"-binary", filepath.Join(pd, "gpu-device-plugin"), "-dp", filepath.Join(pd, "gpu-device-plugin-dp"),
		"-dra", filepath.Join(pd, "gpu-device-plugin-dra"), "-controller", filepath.Join(pd, "gpu-device-plugin-controller"),
		"-hook", filepath.Join(pd, HookBinary), "-version", version, "-o", out)
}

func (f fakeRelease) options(dir string) AssembleOptions {
	return AssembleOptions{
		Dir: dir, Version: fakeVersion, Work: f.work, Platforms: fakePlatforms,
		ChartDir: filepath.Join(root, "deploy/helm/gpu-device-plugin"), Repository: "example.com/gpu-device-plugin", Created: fakeCreated,
	}
}

// copyRelease copies the fake release's folder to spoil it.
func copyRelease(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// restamp rewrites the version a binary reports, in place (the same
// length, so main.version's string header stays right).
func restamp(t *testing.T, content []byte, from, to string) []byte {
	t.Helper()
	if len(from) != len(to) {
		t.Fatalf("restamp %s → %s: lengths differ", from, to)
	}
	if !bytes.Contains(content, []byte(from)) {
		t.Fatalf("no %s in the binary", from)
	}
	return bytes.ReplaceAll(content, []byte(from), []byte(to))
}

func writeBytes(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

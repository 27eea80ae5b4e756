package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func archOf(t *testing.T, binary string) string {
	t.Helper()
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return elfArch[f.Machine].goarch
}

func withPlatform(t *testing.T, img v1.Image, arch string) *v1.ConfigFile {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	return cf
}

// tarDir packs a directory into a tarball, as `tar -C dir -cf out .` would.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			defer src.Close()
			_, err = io.Copy(tw, src)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

var (
	shared     string // removed when the tests end
	staticOnce sync.Once
	staticBin  string
	staticErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		panic(err)
	}
	shared = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// staticBinary is a tiny Go program built with CGO_ENABLED=0, standing in
// for the CDI hook; built once per test run.
func staticBinary(t *testing.T) string {
	t.Helper()
	staticOnce.Do(func() {
		dir := filepath.Join(shared, "static")
		if staticErr = os.MkdirAll(dir, 0o755); staticErr != nil {
			return
		}
		for name, content := range map[string]string{
			"main.go": "package main\n\nfunc main() { println(\"hook\") }\n",
			"go.mod":  "module example.com/hook\n\ngo 1.21\n",
		} {
			if staticErr = os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); staticErr != nil {
				return
			}
		}
		staticBin = filepath.Join(dir, "hook")
		cmd := exec.Command("go", "build", "-o", staticBin, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if staticErr != nil {
		t.Fatalf("building a static stand-in for the hook: %v", staticErr)
	}
	return staticBin
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hasInterp(t *testing.T, binary string) bool {
	t.Helper()
	f, err := elf.Open(binary)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// newestLayerFiles reads the image's last layer, the one imagebuild adds.
func newestLayerFiles(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("layers: %v (%d)", err, len(layers))
	}
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = entry{mode: h.Mode, typ: h.Typeflag, content: b}
	}
}

// draStandIn is a copy of binary with bytes appended, so that its content
// tells it apart in the image; ELF readers ignore the tail.
func draStandIn(t *testing.T, binary string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gpu-device-plugin-dra")
	if err := os.WriteFile(p, append(mustRead(t, binary), "dra stand-in"...), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

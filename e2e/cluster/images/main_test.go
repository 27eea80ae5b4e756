package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTestImage writes exe as a binary, images it at path under ref with
// writeImage, and returns the archive's files, checking that its manifest
// names ref and one layer.
func writeTestImage(t *testing.T, dir, ref, path string, exe []byte) (tarball, bin string, files map[string][]byte, configName, layerName string) {
	t.Helper()
	bin = filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	tarball = filepath.Join(dir, filepath.Base(path)+".tar")
	if err := writeImage(tarball, ref, bin, path); err != nil {
		t.Fatal(err)
	}
	files = readTar(t, tarball)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || !slices.Equal(manifest[0].RepoTags, []string{ref}) || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json = %s", files["manifest.json"])
	}
	return tarball, bin, files, manifest[0].Config, manifest[0].Layers[0]
}

// TestWriteImage pins the docker-archive layout ctr and kind read: a
// manifest.json naming the tag, the config and the layer, and a layer
// holding the entrypoint.
func TestWriteImage(t *testing.T) {
	dir := t.TempDir()
	tarball, bin, files, configName, layerName := writeTestImage(t, dir, "localhost/e2e/probe:v1", "/probe", []byte("\x7fELF not really"))
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[configName], &config); err != nil {
		t.Fatal(err)
	}
	if len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/probe" {
		t.Errorf("entrypoint %v, want [/probe]", config.Config.Entrypoint)
	}
	layer := files[layerName]
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != "sha256:"+digest(layer) {
		t.Errorf("diff_ids %v do not match the layer's digest %s", config.RootFS.DiffIDs, digest(layer))
	}
	f, err := os.CreateTemp(dir, "layer")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(layer)
	f.Close()
	entries := readTar(t, f.Name())
	if string(entries["probe"]) != "\x7fELF not really" {
		t.Errorf("layer lacks the entrypoint; has %v", keys(entries))
	}

	// The same input gives the same image.
	again := filepath.Join(dir, "again.tar")
	if err := writeImage(again, "localhost/e2e/probe:v1", bin, "/probe"); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(tarball)
	b, _ := os.ReadFile(again)
	if digest(a) != digest(b) {
		t.Error("two builds of the same binary differ")
	}
}

// TestWriteImageBin pins what -bin writes for kind's node image: the
// binary at /usr/local/bin/NAME as the entrypoint, PATH=/usr/local/bin, and
// the directories leading to it in the layer ahead of the file.
func TestWriteImageBin(t *testing.T) {
	dir := t.TempDir()
	const ref = "registry.k8s.io/kube-apiserver:v1.37.0"
	exe := []byte("\x7fELF a kube-apiserver, not really")
	_, _, files, configName, layerName := writeTestImage(t, dir, ref, "/usr/local/bin/kube-apiserver", exe)
	var config struct {
		Config struct{ Entrypoint, Env []string }
	}
	if err := json.Unmarshal(files[configName], &config); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/usr/local/bin/kube-apiserver"}; !slices.Equal(config.Config.Entrypoint, want) {
		t.Errorf("entrypoint %v, want %v", config.Config.Entrypoint, want)
	}
	if !slices.Contains(config.Config.Env, "PATH=/usr/local/bin") {
		t.Errorf("env %v lacks PATH=/usr/local/bin", config.Config.Env)
	}

	// The layer, in order: each parent directory an entry before the file.
	layer, ok := files[layerName]
	if !ok {
		t.Fatalf("archive lacks the layer %s; has %v", layerName, keys(files))
	}
	at := map[string]int{}
	var file *tar.Header
	var content []byte
	tr := tar.NewReader(bytes.NewReader(layer))
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := at[h.Name]; dup {
			t.Errorf("layer has %s twice", h.Name)
		}
		at[h.Name] = i
		if h.Name == "usr/local/bin/kube-apiserver" {
			file = h
			if content, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if file == nil {
		t.Fatalf("layer lacks usr/local/bin/kube-apiserver; has %v", at)
	}
	if file.Typeflag != tar.TypeReg || file.Mode != 0o755 {
		t.Errorf("usr/local/bin/kube-apiserver: type %q mode %o, want a regular file, 0755", file.Typeflag, file.Mode)
	}
	if !bytes.Equal(content, exe) {
		t.Errorf("usr/local/bin/kube-apiserver holds %q, want %q", content, exe)
	}
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		i, ok := at[d]
		if !ok {
			t.Errorf("layer lacks the directory %s; has %v", d, at)
		} else if i > at[file.Name] {
			t.Errorf("directory %s comes after %s", d, file.Name)
		}
	}
}

// TestBinFlags pins -bin's REF=PATH parsing: each good value appends, a
// bad one is an error that says what is wanted and appends nothing.
func TestBinFlags(t *testing.T) {
	for _, c := range []struct {
		in, ref, path string
		ok            bool
	}{
		{"registry.k8s.io/kube-apiserver:v1.37.0=/x/kube-apiserver", "registry.k8s.io/kube-apiserver:v1.37.0", "/x/kube-apiserver", true},
		{"r=/a=b", "r", "/a=b", true}, // the first = splits
		{"registry.k8s.io/kube-apiserver:v1.37.0", "", "", false},
		{"=/x/kube-apiserver", "", "", false},
		{"registry.k8s.io/kube-apiserver:v1.37.0=", "", "", false},
		{"=", "", "", false},
		{"", "", "", false},
	} {
		var b binFlags
		err := b.Set(c.in)
		if !c.ok {
			if err == nil || !strings.Contains(err.Error(), "REF=PATH") {
				t.Errorf("Set(%q) = %v, want an error saying REF=PATH", c.in, err)
			}
			if len(b) != 0 {
				t.Errorf("Set(%q) failed yet appended %v", c.in, b)
			}
			continue
		}
		if err != nil {
			t.Errorf("Set(%q) = %v", c.in, err)
			continue
		}
		if len(b) != 1 || b[0].ref != c.ref || b[0].path != c.path {
			t.Errorf("Set(%q) gave %v, want ref %q path %q", c.in, b, c.ref, c.path)
		}
	}

	// Repeated, as the flag is, it keeps every value in order.
	var b binFlags
	for _, v := range []string{"a:1=/bin/a", "b:2=/bin/b"} {
		if err := b.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if len(b) != 2 || b[0].ref != "a:1" || b[1].path != "/bin/b" {
		t.Errorf("two Sets gave %v", b)
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func keys(m map[string][]byte) []string {
	var k []string
	for name := range m {
		k = append(k, name)
	}
	return k
}

// TestRuntimeFiles: a dynamically linked binary brings its loader, at the
// path it names, and every library it needs; a static one brings nothing.
func TestRuntimeFiles(t *testing.T) {
	dyn := "/bin/sh"
	if _, err := os.Stat(dyn); err != nil {
		t.Skip("no /bin/sh")
	}
	files, err := runtimeFiles(dyn)
	if err != nil {
		t.Skipf("%s: %v (not a glibc machine?)", dyn, err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.path)
		if _, err := os.Stat(f.from); err != nil {
			t.Errorf("%s from %s: %v", f.path, f.from, err)
		}
	}
	if len(files) == 0 || !strings.Contains(files[0].path, "ld-") {
		t.Fatalf("%s: first file %v, want its loader", dyn, paths)
	}
	if !slices.ContainsFunc(paths, func(p string) bool { return strings.HasSuffix(p, "/libc.so.6") }) {
		t.Errorf("%s: %v has no libc.so.6", dyn, paths)
	}
	static := filepath.Join(t.TempDir(), "pause")
	src, err := sourceDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := build(filepath.Join(src, "pause"), static); err != nil {
		t.Fatal(err)
	}
	if files, err := runtimeFiles(static); err != nil || len(files) != 0 {
		t.Errorf("static binary: %v, %v; want nothing", files, err)
	}
}

package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteImage pins the docker-archive layout ctr and kind read: a
// manifest.json naming the tag, the config and the layer, and a layer
// holding the entrypoint.
func TestWriteImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "probe")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, "probe.tar")
	if err := writeImage(tarball, "localhost/e2e/probe:v1", bin, "/probe"); err != nil {
		t.Fatal(err)
	}
	files := readTar(t, tarball)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "localhost/e2e/probe:v1" || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json = %s", files["manifest.json"])
	}
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[manifest[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	if len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/probe" {
		t.Errorf("entrypoint %v, want [/probe]", config.Config.Entrypoint)
	}
	layer := files[manifest[0].Layers[0]]
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

package unpack

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, entries ...*tar.Header) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := tar.NewWriter(f)
	for _, h := range entries {
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			w.Write([]byte(strings.Repeat("x", int(h.Size))))
		}
	}
	w.Close()
	f.Close()
	return p
}

func TestTarball(t *testing.T) {
	dir := t.TempDir()
	p := write(t,
		&tar.Header{Name: "blobs/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "blobs/sha256/abc", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644},
		&tar.Header{Name: "index.json", Typeflag: tar.TypeReg, Size: 2, Mode: 0o644})
	if err := Tarball(p, dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", "abc")); err != nil || string(b) != "xxx" {
		t.Fatalf("blob: %q, %v", b, err)
	}
}

func TestTarballRefuses(t *testing.T) {
	for name, h := range map[string]*tar.Header{
		"a name outside":   {Name: "../escape", Typeflag: tar.TypeReg, Size: 1},
		"an absolute name": {Name: "/etc/passwd", Typeflag: tar.TypeReg, Size: 1},
		"a symlink":        {Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Tarball(write(t, h), dir); err == nil {
				t.Fatal("extracted")
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("wrote %d entries", len(entries))
			}
		})
	}
}

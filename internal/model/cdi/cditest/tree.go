// Package cditest materialises fake driver-root trees for tests of CDI
// spec generation, here and in the e2e module.
package cditest

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Tree materialises a manifest (see internal/model/cdi/testdata/driver-root/manifest.txt:
// file, dir, link and char lines) in a new temporary directory and returns
// its root. Character devices are real where mknod is allowed (root) and
// FIFOs elsewhere; chars says which.
func Tree(t testing.TB, manifest string) (root string, chars bool) {
	t.Helper()
	root = t.TempDir()
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	chars = true
	// parent creates the parent of rel, refusing to go through a link that
	// leaves the tree (an absolute link resolves on the real host here).
	parent := func(rel string) string {
		dir := filepath.Join(root, filepath.Dir(rel))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("manifest: %s: %v", rel, err)
		}
		if real, err := filepath.EvalSymlinks(dir); err != nil || !strings.HasPrefix(real+"/", realRoot+"/") {
			t.Fatalf("manifest: %s: parent %s leaves the tree (%s, %v)", rel, dir, real, err)
		}
		return filepath.Join(root, rel)
	}
	sc := bufio.NewScanner(strings.NewReader(manifest))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		bad := func(err error) {
			if err != nil {
				t.Fatalf("manifest line %d %q: %v", n, sc.Text(), err)
			}
		}
		switch {
		case f[0] == "file" && len(f) == 2:
			bad(os.WriteFile(parent(f[1]), nil, 0o644))
		case f[0] == "dir" && len(f) == 2:
			bad(os.MkdirAll(parent(f[1]), 0o755))
		case f[0] == "link" && len(f) == 3:
			bad(os.Symlink(f[2], parent(f[1])))
		case f[0] == "char" && len(f) == 4:
			major, err := strconv.ParseUint(f[2], 10, 32)
			bad(err)
			minor, err := strconv.ParseUint(f[3], 10, 32)
			bad(err)
			p := parent(f[1])
			if chars {
				if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor)))); err != nil {
					chars = false
				}
			}
			if !chars {
				bad(unix.Mkfifo(p, 0o666))
			}
		default:
			t.Fatalf("manifest line %d %q: want file, dir, link or char", n, sc.Text())
		}
	}
	return root, chars
}

// Manifest returns the fake driver root kept in internal/model/cdi/testdata: driver
// 550.54.15 on Ubuntu x86_64 with leftovers, and the /dev of a DGX A100.
func Manifest(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cditest: cannot locate its own source")
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "testdata", "driver-root", "manifest.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

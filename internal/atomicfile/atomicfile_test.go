package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "spec.json")
	if changed, err := Write(p, []byte("one"), Options{}); err != nil || !changed {
		t.Fatalf("first write: %v, %v", changed, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644", fi.Mode(), err)
	}
	before := inode(t, p)
	t.Run("same bytes leave the file alone", func(t *testing.T) {
		if changed, err := Write(p, []byte("one"), Options{}); err != nil || changed || inode(t, p) != before {
			t.Fatalf("changed %v, err %v, inode %d → %d", changed, err, before, inode(t, p))
		}
	})
	t.Run("new bytes replace it, not rewrite it in place", func(t *testing.T) {
		if changed, err := Write(p, []byte("two"), Options{Sync: true, Mode: 0o600}); err != nil || !changed {
			t.Fatal(changed, err)
		}
		if b, _ := os.ReadFile(p); string(b) != "two" || inode(t, p) == before {
			t.Fatalf("content %q, inode unchanged: %v", b, inode(t, p) == before)
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", fi.Mode())
		}
	})
	t.Run("a failed check keeps the old file and no temporary", func(t *testing.T) {
		refuse := errors.New("refused")
		var seen string
		_, err := Write(p, []byte("three"), Options{Check: func(tmp string) error {
			b, _ := os.ReadFile(tmp)
			seen = string(b)
			return refuse
		}})
		if !errors.Is(err, refuse) || seen != "three" {
			t.Fatalf("err %v, check saw %q", err, seen)
		}
		if b, _ := os.ReadFile(p); string(b) != "two" {
			t.Fatalf("content %q after a refused write", b)
		}
		entries, _ := os.ReadDir(filepath.Dir(p))
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp") {
				t.Errorf("temporary %s left", e.Name())
			}
		}
	})
	t.Run("an unwritable place is an error naming the path", func(t *testing.T) {
		blocker := filepath.Join(dir, "file")
		if err := os.WriteFile(blocker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Write(filepath.Join(blocker, "x.json"), []byte("x"), Options{}); err == nil || !strings.Contains(err.Error(), blocker) {
			t.Fatalf("err %v", err)
		}
	})
}

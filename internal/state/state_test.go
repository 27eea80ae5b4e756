package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type cond struct {
	Device string    `json:"device"`
	XID    uint64    `json:"xid"`
	Since  time.Time `json:"since"`
}

func store(t *testing.T, boot string) Store {
	t.Helper()
	dir := t.TempDir()
	bootPath := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(bootPath, []byte(boot+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Store{Path: filepath.Join(dir, "state", "health.json"), BootIDPath: bootPath}
}

func TestRoundTripOnOneBoot(t *testing.T) {
	s := store(t, "boot-1")
	in := []cond{{Device: "GPU-a", XID: 79, Since: time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC)}}
	if err := s.Save(in); err != nil {
		t.Fatal(err)
	}
	var out []cond
	if found, err := s.Load(&out); err != nil || !found {
		t.Fatalf("Load = %v, %v", found, err)
	}
	if len(out) != 1 || out[0] != in[0] {
		t.Fatalf("loaded %+v, want %+v", out, in)
	}
	b, err := os.ReadFile(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"bootID": "boot-1"`, `"state"`, `"device": "GPU-a"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("state file lacks %s:\n%s", key, b)
		}
	}
}

func TestAnotherBootStartsClean(t *testing.T) {
	s := store(t, "boot-1")
	if err := s.Save([]cond{{Device: "GPU-a", XID: 79}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.BootIDPath, []byte("boot-2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out []cond
	if found, err := s.Load(&out); err != nil || found || len(out) != 0 {
		t.Fatalf("after a reboot Load = %v, %v, %v; want nothing", found, out, err)
	}
}

func TestLoadErrors(t *testing.T) {
	s := store(t, "boot-1")
	var out []cond
	if found, err := s.Load(&out); err != nil || found {
		t.Errorf("no file: %v, %v", found, err)
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(&out); err == nil || !strings.Contains(err.Error(), s.Path) {
		t.Errorf("corrupt file: %v, want an error naming it", err)
	}
	if err := s.Save([]cond{{Device: "GPU-a", XID: 79}}); err != nil {
		t.Fatal(err)
	}
	s.BootIDPath = filepath.Join(t.TempDir(), "missing")
	if _, err := s.Load(&out); err == nil || !strings.Contains(err.Error(), "boot ID") {
		t.Errorf("no boot ID: %v", err)
	}
	// Without a file, no boot ID is no error: nothing was kept.
	if err := os.Remove(s.Path); err != nil {
		t.Fatal(err)
	}
	if found, err := s.Load(&out); err != nil || found {
		t.Errorf("no file and no boot ID: %v, %v; want nothing and no error", found, err)
	}
}

func TestWritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing", "state")
	if err := (Store{Path: filepath.Join(dir, "health.json")}).Writable(); err != nil {
		t.Fatalf("a missing directory should be created: %v", err)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("probe left %v (%v)", entries, err)
	}
	// A regular file where the directory should be: what a read-only or
	// wrong mount looks like to root, whom permissions do not stop.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := (Store{Path: filepath.Join(file, "health.json")}).Writable(); err == nil {
		t.Error("no error for a state directory that cannot be made")
	}
}

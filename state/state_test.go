package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
	since := time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC)
	in := Conditions{"GPU-a": {{Kind: "xid", Reason: "xid=79", Since: since}}, "GPU-b": nil}
	if err := s.Save(in); err != nil {
		t.Fatal(err)
	}
	out, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || len(out["GPU-a"]) != 1 || out["GPU-a"][0] != in["GPU-a"][0] {
		t.Fatalf("loaded %+v, want GPU-a's condition only", out)
	}
	b, err := os.ReadFile(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"bootID": "boot-1"`, `"devices"`, `"kind": "xid"`, `"reason": "xid=79"`, `"since"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("state file lacks %s:\n%s", key, b)
		}
	}
}

func TestAnotherBootStartsClean(t *testing.T) {
	s := store(t, "boot-1")
	if err := s.Save(Conditions{"GPU-a": {{Kind: "xid", Reason: "xid=79"}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.BootIDPath, []byte("boot-2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := s.Load()
	if err != nil || len(out) != 0 {
		t.Fatalf("after a reboot Load = %v, %v; want nothing", out, err)
	}
}

func TestLoadErrors(t *testing.T) {
	s := store(t, "boot-1")
	if out, err := s.Load(); err != nil || len(out) != 0 {
		t.Errorf("no file: %v, %v", out, err)
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), s.Path) {
		t.Errorf("corrupt file: %v, want an error naming it", err)
	}
	s.BootIDPath = filepath.Join(t.TempDir(), "missing")
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), "boot ID") {
		t.Errorf("no boot ID: %v", err)
	}
}

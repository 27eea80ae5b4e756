package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// bootOfTestdata is the boot ID testdata/c596a2d/health.json was written on.
const bootOfTestdata = "8d1f5c2e-4b7a-4f0e-9a3c-2e6b1d7f9a10"

func storeWith(t *testing.T, boot, content string) Store {
	t.Helper()
	s := store(t, boot)
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

func generic(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	return m
}

// testdata/c596a2d/health.json was written by the release this one follows
// (commit c596a2d: state.Store.Save of the health watcher's conditions). It
// is read as it stands; written back, it differs only by the version this
// release adds, a key that release's reader ignores.
func TestStateOfThePreviousRelease(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "c596a2d", "health.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := storeWith(t, bootOfTestdata, string(old))
	var conds []health.StickyCondition
	if found, err := s.Load(&conds); err != nil || !found {
		t.Fatalf("Load = %v, %v", found, err)
	}
	since := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	if len(conds) != 2 ||
		conds[0].Device != "GPU-01b2c3d4-5e6f-7a8b-9c0d-e1f2a3b4c5d0" || conds[0].Kind != health.StickyXID || conds[0].XID != 79 || !conds[0].Since.Equal(since) || conds[0].ActionSeen ||
		conds[1].Kind != health.StickyECC || !conds[1].ActionSeen || !conds[1].Since.Equal(since.Add(time.Minute)) {
		t.Fatalf("read %+v", conds)
	}
	if err := s.Save(conds); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(string(old), "{\n", "{\n  \"version\": 1,\n", 1)
	if string(got) != want {
		t.Errorf("written back as\n%s\nwant\n%s", got, want)
	}
}

// newer is a file a later release might write: a higher version, keys
// this release does not know in the envelope and in a condition, and a
// condition of a kind it does not know.
const newer = `{
  "version": 3,
  "bootID": "boot-1",
  "writtenBy": {"release": "v9.0.0"},
  "state": [
    {"device": "GPU-a", "kind": "xid", "xid": 79, "since": "2026-11-27T06:00:00Z", "pid": 4242, "pages": [1, 2]},
    {"device": "GPU-b", "kind": "rowRemapFailure", "since": "2026-11-27T06:01:00Z", "banks": 3}
  ]
}
`

// A newer release's file is read for what this release knows, and Save
// writes back everything it did not: the version, the envelope's keys,
// each condition's keys, the condition of an unknown kind.
func TestStateOfANewerReleaseRoundTrips(t *testing.T) {
	s := storeWith(t, "boot-1", newer)
	var conds []health.StickyCondition
	if found, err := s.Load(&conds); err != nil || !found {
		t.Fatalf("Load = %v, %v", found, err)
	}
	if len(conds) != 2 || conds[0].XID != 79 || conds[1].Kind != "rowRemapFailure" {
		t.Fatalf("read %+v", conds)
	}
	if err := s.Save(conds); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := generic(t, got), generic(t, []byte(newer)); !reflect.DeepEqual(g, w) {
		t.Errorf("written back as\n%s\nwant what the newer release wrote\n%s", got, newer)
	}
}

// Keys of another boot's file are as stale as its value: not carried on.
func TestAnotherBootsEnvelopeIsNotKept(t *testing.T) {
	s := storeWith(t, "boot-2", newer)
	if err := s.Save([]health.StickyCondition{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"version\": 1,\n  \"bootID\": \"boot-2\",\n  \"state\": []\n}\n"; string(got) != want {
		t.Errorf("wrote\n%s\nwant\n%s", got, want)
	}
}

// A file without a version (the previous release's) reads as version 1,
// and one that does not parse is still an error naming it.
func TestStateVersions(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"bootID":"boot-1","state":[]}`, `"version": 1`},
		{`{"version":7,"bootID":"boot-1","state":[]}`, `"version": 7`},
	} {
		s := storeWith(t, "boot-1", c.body)
		if err := s.Save([]health.StickyCondition{}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(s.Path); !strings.Contains(string(got), c.want) {
			t.Errorf("%s saved as %s, want %s", c.body, got, c.want)
		}
	}
	s := storeWith(t, "boot-1", `{"version":"two","bootID":"boot-1"}`)
	var conds []health.StickyCondition
	if _, err := s.Load(&conds); err == nil || !strings.Contains(err.Error(), s.Path) {
		t.Errorf("a version that is not a number: %v", err)
	}
}

package dra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A checkpoint a newer release wrote: a higher version and fields this one
// does not know, at every level. It is read for what this release knows,
// and written back with the rest intact, so a rollback and a roll forward
// lose nothing.
func TestCheckpointFromANewerRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	newer := `{"version":3,"bootID":"b-1","claims":{"u":{"namespace":"ns","name":"c","generation":7,` +
		`"devices":[{"requests":["r"],"pool":"p","device":"gpu-0","cdiDeviceIDs":["k=v"],"sharing":{"mps":true}}]}}}`
	if err := os.WriteFile(path, []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := loadCheckpoint(path)
	if err != nil {
		t.Fatalf("a newer release's checkpoint was refused: %v", err)
	}
	c, ok := cp.Claims["u"]
	if !ok || c.Name != "c" || len(c.Devices) != 1 || c.Devices[0].Device != "gpu-0" || c.Devices[0].CDIDeviceIDs[0] != "k=v" {
		t.Fatalf("claims read: %+v", cp.Claims)
	}
	if _, err := os.Stat(path + ".corrupt"); err == nil {
		t.Error("the newer file was set aside")
	}
	// This release prepares another claim and saves.
	cp.Claims["v"] = preparedClaim{Namespace: "ns", Name: "d", Devices: []preparedDevice{{Requests: []string{"r"}, Pool: "p", Device: "gpu-1", CDIDeviceIDs: []string{"k=w"}}}}
	if err := cp.save(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["version"] != float64(3) || back["bootID"] != "b-1" {
		t.Errorf("top level lost what the newer release wrote: %s", b)
	}
	u := back["claims"].(map[string]any)["u"].(map[string]any)
	if u["generation"] != float64(7) {
		t.Errorf("the claim lost its unknown field: %s", b)
	}
	dev := u["devices"].([]any)[0].(map[string]any)
	if s, _ := dev["sharing"].(map[string]any); s["mps"] != true {
		t.Errorf("the device lost its unknown field: %s", b)
	}
	if strings.Count(string(b), `"gpu-1"`) != 1 {
		t.Errorf("this release's claim was not written: %s", b)
	}
}

// An older file (no version: before the number was written) is migrated,
// not set aside; this release writes its own version.
func TestCheckpointFromAnOlderRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, []byte(`{"claims":{"u":{"namespace":"ns","name":"c","devices":[]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := loadCheckpoint(path)
	if err != nil || len(cp.Claims) != 1 || cp.Version != checkpointVersion {
		t.Fatalf("older file: %+v, %v", cp, err)
	}
	if err := cp.save(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), `{"version":1,`) {
		t.Errorf("saved as %s", b)
	}
}

func TestJSONKeys(t *testing.T) {
	type x struct {
		A      int `json:"a,omitempty"`
		B      int
		C      int `json:"-"`
		hidden int
	}
	_ = x{}.hidden
	if got := strings.Join(jsonKeys(reflect.TypeOf(x{})), ","); got != "a,B" {
		t.Errorf("keys %q", got)
	}
}

package dra

import (
	"encoding/json"
	"os"
	"path/filepath"
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

// testdata/c596a2d/checkpoint.json was written by the release this one
// follows (commit c596a2d's checkpoint.save): it is read as it stands,
// and written back byte for byte, so that release reads this one's file.
func TestCheckpointOfThePreviousRelease(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("testdata", "c596a2d", "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := loadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	train, dcgm := cp.Claims["2f6c1a0e-7d3b-4c5a-9e8f-1b2c3d4e5f60"], cp.Claims["5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c10"]
	if len(cp.Claims) != 2 || train.Name != "train-gpu" || len(train.Devices) != 1 || train.Devices[0].Device != "gpu-0" ||
		train.Devices[0].AdminAccess || len(dcgm.Devices) != 1 || !dcgm.Devices[0].AdminAccess {
		t.Fatalf("claims read: %+v", cp.Claims)
	}
	if err := cp.save(path); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("written back as\n%s\nwant the previous release's bytes\n%s", got, want)
	}
}

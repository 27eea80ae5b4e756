// Package state keeps what the plugin must remember across its own
// restarts on one boot of the node: the health conditions that only the
// driver or an operator can clear (a fatal XID, a GPU the driver says needs
// a reset). A ConfigMap roll, an image update or an OOM kill must not
// silently re-admit a GPU that is still broken; a reboot resets the GPUs,
// so a file written on another boot is ignored.
//
// The file is JSON with lowerCamelCase keys: the boot it was written on and
// the caller's value (the health watcher's sticky conditions):
//
//	{"bootID": "6c1b…", "state": [{"device": "GPU-…", "kind": "xid", "xid": 79, "since": "2026-…"}]}
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

// DefaultBootIDPath is where Linux says which boot this is.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// file is the envelope: the boot it was written on, and the value.
type file struct {
	BootID string          `json:"bootID"`
	State  json.RawMessage `json:"state"`
}

// Store reads and writes the state file.
type Store struct {
	// Path is the state file.
	Path string
	// BootIDPath is read for the boot ID; empty means DefaultBootIDPath.
	BootIDPath string
}

func (s Store) bootID() (string, error) {
	p := s.BootIDPath
	if p == "" {
		p = DefaultBootIDPath
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("reading the boot ID: %s is empty", p)
	}
	return id, nil
}

// Load decodes the value saved on this boot into v and reports whether
// there was one. A missing file, or one from another boot, is no value and
// no error; a file that cannot be parsed is an error (the caller logs it
// and starts clean).
func (s Store) Load(v any) (bool, error) {
	boot, err := s.bootID()
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	if f.BootID != boot || len(f.State) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(f.State, v); err != nil {
		return false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	return true, nil
}

// Save replaces the file atomically with v, for this boot.
func (s Store) Save(v any) error {
	boot, err := s.bootID()
	if err != nil {
		return err
	}
	state, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	b, err := json.MarshalIndent(file{BootID: boot, State: state}, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	if _, err := atomicfile.Write(s.Path, append(b, '\n'), atomicfile.Options{Sync: true}); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return nil
}

// Writable checks, at start, that Save will be able to write: the
// directory is created if missing, and a file is made and removed in it. A
// read-only or missing state directory is then reported when the plugin
// starts, not first when a fatal XID needs keeping.
func (s Store) Writable() error {
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("state directory %s is not writable: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

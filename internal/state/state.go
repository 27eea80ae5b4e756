// Package state keeps what the plugin must remember across its own
// restarts on one boot of the node: the health conditions that only the
// driver or an operator can clear (a fatal XID, a GPU the driver says needs
// a reset). A ConfigMap roll, an image update or an OOM kill must not
// silently re-admit a GPU that is still broken; a reboot resets the GPUs,
// so a file written on another boot is ignored.
//
// The file is JSON with lowerCamelCase keys: its format version, the boot
// it was written on and the caller's value (the health watcher's sticky
// conditions):
//
//	{"version": 1, "bootID": "6c1b…", "state": [{"device": "GPU-…", "kind": "xid", "xid": 79, "since": "2026-…"}]}
//
// The previous and the next release read each other's file: keys are only
// ever added, a file without a version (before it was written) is version
// 1, a newer version is read for what this release knows and keeps its
// number, and keys of the envelope this release does not know are written
// back by Save (the caller's value keeps its own, see health.StickyCondition).
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
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
)

// DefaultBootIDPath is where Linux says which boot this is.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// version is the newest format this release writes. Releases before it
// wrote none, and read a file that has one.
const version = 1

// file is the envelope: its format, the boot it was written on, and the
// value.
type file struct {
	Version int             `json:"version"`
	BootID  string          `json:"bootID"`
	State   json.RawMessage `json:"state"`
	// extra are the keys a newer release wrote that this one has no
	// field for.
	extra jsonkeep.Fields
}

func (f *file) UnmarshalJSON(b []byte) error {
	type plain file
	return jsonkeep.Unmarshal[plain](b, f, &f.extra)
}

func (f file) MarshalJSON() ([]byte, error) {
	type plain file
	return jsonkeep.Marshal[plain](f, f.extra)
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
	// No file is nothing kept, whatever the boot: read it first, so a
	// node whose boot ID cannot be read says so only when it matters.
	f, found, err := s.read()
	if err != nil || !found {
		return false, err
	}
	boot, err := s.bootID()
	if err != nil {
		return false, err
	}
	if f.BootID != boot || len(f.State) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(f.State, v); err != nil {
		return false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	return true, nil
}

// read decodes the envelope; a missing file is not found and no error.
func (s Store) read() (file, bool, error) {
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return file{}, false, nil
	}
	if err != nil {
		return file{}, false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return file{}, false, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	return f, true, nil
}

// Save replaces the file atomically with v, for this boot. What a newer
// release wrote in the envelope of this boot's file (keys this release does
// not know, a higher version) is written back: the file on disk is read
// again rather than remembered, so Store stays a plain value.
func (s Store) Save(v any) error {
	boot, err := s.bootID()
	if err != nil {
		return err
	}
	state, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	f := file{Version: version, BootID: boot, State: state}
	// An unreadable file or another boot's has nothing worth keeping.
	if old, found, err := s.read(); err == nil && found && old.BootID == boot {
		f.Version, f.extra = max(old.Version, version), old.extra
	}
	b, err := json.MarshalIndent(f, "", "  ")
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

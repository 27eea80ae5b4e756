// Package state keeps what the plugin must remember across its own
// restarts on one boot of the node: the health conditions that only the
// driver or an operator can clear (a fatal XID, a GPU the driver says needs
// a reset). A ConfigMap roll, an image update or an OOM kill must not
// silently re-admit a GPU that is still broken; a reboot resets the GPUs,
// so a file written on another boot is ignored.
//
// The file is JSON with lowerCamelCase keys:
//
//	{"bootID": "6c1b…", "devices": {"GPU-…": [{"kind": "xid", "reason": "xid=79", "since": "2026-…"}]}}
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultBootIDPath is where Linux says which boot this is.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// Condition is one remembered condition of a device.
type Condition struct {
	// Kind names the check that raised it ("xid", "recovery-action").
	Kind string `json:"kind"`
	// Reason is the reason the device was reported Unhealthy with.
	Reason string `json:"reason"`
	// Since is when it was first seen.
	Since time.Time `json:"since"`
}

// Conditions are the remembered conditions by device ID.
type Conditions map[string][]Condition

type file struct {
	BootID  string     `json:"bootID"`
	Devices Conditions `json:"devices"`
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

// Load returns the conditions saved on this boot. A missing file, or one
// from another boot, is no conditions and no error; a file that cannot be
// parsed is an error (the caller logs it and starts clean).
func (s Store) Load() (Conditions, error) {
	boot, err := s.bootID()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Conditions{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("reading state %s: %w", s.Path, err)
	}
	if f.BootID != boot || f.Devices == nil {
		return Conditions{}, nil
	}
	return f.Devices, nil
}

// Save replaces the file atomically with c, for this boot. Devices with
// no conditions are left out.
func (s Store) Save(c Conditions) error {
	boot, err := s.bootID()
	if err != nil {
		return err
	}
	f := file{BootID: boot, Devices: Conditions{}}
	for id, conds := range c {
		if len(conds) > 0 {
			f.Devices[id] = conds
		}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.Path)+".tmp")
	if err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing state %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing state %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing state %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), s.Path); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return nil
}

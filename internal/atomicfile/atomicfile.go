// Package atomicfile replaces files whole: a reader sees the old content
// or the new, never part of either. The plugin's CDI specs, CNI
// device-information files and saved health all go through it.
package atomicfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// Options shape Write.
type Options struct {
	// Mode is the file's permission; zero means 0644 (runtimes and CNI
	// plugins may read it as another user).
	Mode os.FileMode
	// Sync makes the write durable: the file and its directory are
	// synced. Files on tmpfs (/var/run) need not be.
	Sync bool
	// Check, when set, vets the complete temporary file before it
	// replaces path; an error leaves path as it was.
	Check func(tmp string) error
}

// Write replaces path with data, creating its directory. The temporary
// file is ".<name>.tmp<random>" beside it, so readers that skip dot files
// or want a suffix ignore it. A file already holding data is left alone,
// so watchers see no change; changed says whether the file was written.
func Write(path string, data []byte, o Options) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if o.Mode == 0 {
		o.Mode = 0o644
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp")
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	// CreateTemp makes the file 0600.
	if err := tmp.Chmod(o.Mode); err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if o.Sync {
		if err := tmp.Sync(); err != nil {
			return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
		}
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if o.Check != nil {
		if err := o.Check(tmp.Name()); err != nil {
			return false, err
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	tmp = nil
	if o.Sync {
		// The rename is durable only once the directory is synced.
		if err := syncDir(dir); err != nil {
			return true, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

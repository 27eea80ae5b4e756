package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Defaults of Writer.
const (
	// DefaultDir is the directory for specs generated at run time; runtimes
	// read it after /etc/cdi, and it is emptied on reboot.
	DefaultDir = "/var/run/cdi"
	// DefaultOwner prefixes the names of the spec files this plugin writes.
	DefaultOwner = "gpu-device-plugin"
)

// Writer writes spec files into Dir, one file per kind, named
// <Owner>_<vendor>-<class>.json (gpu-device-plugin_gpu-device-plugin.github.io-gpu.json).
// It only ever removes files whose names start with Owner and "_", so other
// vendors' specs in the same directory are safe.
//
// A Writer's methods must not run concurrently on the same Dir and Owner:
// RemoveStale would remove another Write's temporary file. One goroutine
// owning the spec files is enough.
type Writer struct {
	// Dir is the spec directory; empty means DefaultDir.
	Dir string
	// Owner is the file name prefix: letters, digits, '.' and '-', starting
	// with a letter or digit; empty means DefaultOwner.
	Owner string
}

func (w Writer) dir() string {
	if w.Dir == "" {
		return DefaultDir
	}
	return w.Dir
}

func (w Writer) owner() (string, error) {
	o := w.Owner
	if o == "" {
		return DefaultOwner, nil
	}
	for i, c := range o {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '-' || c == '.')
		if !ok {
			return "", fmt.Errorf("CDI spec owner %q: use letters, digits, '.' and '-', starting with a letter or digit (example: %q)", o, DefaultOwner)
		}
	}
	return o, nil
}

// Path returns the file a spec of kind is written to.
func (w Writer) Path(kind string) (string, error) {
	owner, err := w.owner()
	if err != nil {
		return "", err
	}
	// The library's own per-kind name: vendor "-" class.
	name, err := cdiapi.GenerateNameForSpec(&specs.Spec{Kind: kind})
	if err != nil {
		return "", fmt.Errorf("CDI spec file name: %w", err)
	}
	return filepath.Join(w.dir(), owner+"_"+name+".json"), nil
}

// Write validates spec and replaces its kind's file atomically: a reader
// sees the old file or the new one, never part of one. A spec that fails
// validation is never written and the error says why. It is checked twice:
// with Validate before any file is created, then by the CDI library's own
// loader (cdi.ReadSpec, what a runtime's cache runs) on the encoded bytes in
// a temporary file, which becomes the spec file only if the loader accepts
// it. The temporary file's name ends in neither .json nor .yaml, so caches
// watching Dir ignore it. A file already holding the same bytes is left as
// it is, so runtimes watching Dir see no change. It returns the file's path.
func (w Writer) Write(spec *specs.Spec) (string, error) {
	if err := Validate(spec); err != nil {
		return "", err
	}
	final, err := w.Path(spec.Kind)
	if err != nil {
		return "", err
	}
	data, err := Marshal(spec)
	if err != nil {
		return "", err
	}
	check := func(tmp string) error {
		if _, err := cdiapi.ReadSpec(tmp, 0); err != nil {
			return fmt.Errorf("CDI spec %s refused by the CDI library: %w", spec.Kind, err)
		}
		return nil
	}
	if _, err := atomicfile.Write(final, data, atomicfile.Options{Sync: true, Check: check}); err != nil {
		return "", fmt.Errorf("writing CDI spec %s: %w", spec.Kind, err)
	}
	return final, nil
}

// RemoveStale removes this owner's spec files that are not in keep (paths
// as Write returned them, or bare file names), and temporary files a
// crashed Write left behind. Other files in Dir are never touched. A
// missing Dir is not an error.
func (w Writer) RemoveStale(keep []string) error {
	kept := make([]string, len(keep))
	for i, k := range keep {
		kept[i] = filepath.Base(k)
	}
	return w.remove(func(name string) bool { return !slices.Contains(kept, name) })
}

// RemoveAll removes every spec file of this owner, for uninstalling or for
// a configuration that no longer uses CDI. The plugin never calls it on
// shutdown: the kubelet restarts containers with the CDI names it kept.
func (w Writer) RemoveAll() error {
	return w.remove(func(string) bool { return true })
}

func (w Writer) remove(stale func(name string) bool) error {
	owner, err := w.owner()
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(w.dir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing CDI specs: %w", err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !w.owns(owner, name) || !stale(name) {
			continue
		}
		if err := os.Remove(filepath.Join(w.dir(), name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing CDI spec: %w", err))
		}
	}
	return errors.Join(errs...)
}

// owns reports whether name is one of owner's spec files or a temporary
// file of one.
func (w Writer) owns(owner, name string) bool {
	prefix := owner + "_"
	switch {
	case strings.HasPrefix(name, prefix):
		ext := filepath.Ext(name)
		return ext == ".json" || ext == ".yaml"
	case strings.HasPrefix(name, "."+prefix):
		return strings.Contains(name, ".json.tmp")
	}
	return false
}

// Conflicts returns the spec files in dirs, other than this owner's own,
// that define kind: a CDI cache drops every device name two specs of the
// same priority both define, so each such file breaks our names. Missing
// dirs and unreadable files are skipped; this is a diagnosis, not a gate.
func (w Writer) Conflicts(kind string, dirs ...string) []string {
	owner, err := w.owner()
	if err != nil {
		return nil
	}
	var out []string
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			ext := filepath.Ext(name)
			if e.IsDir() || (ext != ".json" && ext != ".yaml") || w.owns(owner, name) {
				continue
			}
			p := filepath.Join(dir, name)
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			var head struct {
				Kind string `json:"kind"`
			}
			if yaml.Unmarshal(data, &head) == nil && head.Kind == kind {
				out = append(out, p)
			}
		}
	}
	return out
}

package runtimes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// CRI-O's config and its drop-in folder, read in lexical order after it.
const (
	crioConfig = "/etc/crio/crio.conf"
	crioDropIn = "/etc/crio/crio.conf.d"
)

// crioFindings reads CRI-O's config and drop-ins and says which of its
// runtimes are NVIDIA's.
func crioFindings(root string) []finding {
	files, err := loadCRIO(root)
	if err != nil {
		return []finding{{runtime: CRIO, path: err.path, err: err.err}}
	}
	var merged table
	for _, f := range files {
		merged = merge(merged, f.t)
	}
	defaultKeys := []string{"crio", "runtime", "default_runtime"}
	defaultName := str(merged, defaultKeys...)
	runtimes, _ := lookup(merged, "crio", "runtime", "runtimes").(table)
	var out []finding
	for name := range runtimes {
		pathKeys := []string{"crio", "runtime", "runtimes", name, "runtime_path"}
		bin := str(merged, pathKeys...)
		if bin == "" {
			bin = name // CRI-O looks the runtime's name up in $PATH
		}
		if !isNVIDIARuntime(bin) {
			continue
		}
		// Unset, the default is runc (crun from CRI-O 1.31).
		every := name == defaultName || (defaultName == "" && (name == "runc" || name == "crun"))
		f := finding{runtime: CRIO, binary: bin, every: every, key: dotted(pathKeys...), path: lastSetting(files, pathKeys...)}
		if every && defaultName != "" {
			f.key, f.path = dotted(defaultKeys...), lastSetting(files, defaultKeys...)
		}
		if f.path == "" {
			f.path = crioConfig
		}
		out = append(out, f)
	}
	sortFindings(out)
	return out
}

// fileError is an error with the host path of the file it is about.
type fileError struct {
	path string
	err  error
}

// loadCRIO reads crio.conf and the drop-ins that are there.
func loadCRIO(root string) ([]tomlFile, *fileError) {
	paths := []string{crioConfig}
	entries, err := os.ReadDir(under(root, crioDropIn))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, &fileError{crioDropIn, fmt.Errorf("listing %s: %w", crioDropIn, err)}
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		paths = append(paths, path.Join(crioDropIn, n))
	}
	var files []tomlFile
	for _, p := range paths {
		t, err := readTOML(root, p)
		if err != nil {
			return nil, &fileError{p, err}
		}
		if t != nil {
			files = append(files, tomlFile{path: p, t: t})
		}
	}
	return files, nil
}

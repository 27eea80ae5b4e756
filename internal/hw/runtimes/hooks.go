package runtimes

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// hookDirs are the OCI hooks folders CRI-O and Podman read by default; a
// file in a later one replaces one of the same name in an earlier one.
var hookDirs = []string{
	"/usr/share/containers/oci/hooks.d",
	"/etc/containers/oci/hooks.d",
}

// hookFile is an OCI hooks.d file, version 1.0.0 or the older 0.1.0.
type hookFile struct {
	Hook json.RawMessage `json:"hook"` // 1.0.0: {"path": ...}; 0.1.0: the path
	When struct {
		Always        *bool             `json:"always"`
		Commands      []string          `json:"commands"`
		Annotations   map[string]string `json:"annotations"`
		HasBindMounts *bool             `json:"hasBindMounts"`
	} `json:"when"`
	// 0.1.0's conditions.
	Cmds          []string `json:"cmds"`
	Annotation    []string `json:"annotation"`
	HasBindMounts *bool    `json:"hasbindmounts"`
}

// hookFindings reads the hooks folders and says which hooks are NVIDIA's.
func hookFindings(root string) []finding {
	files := map[string]string{} // name: host path
	for _, dir := range hookDirs {
		entries, err := os.ReadDir(under(root, dir))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return []finding{{runtime: OCIHook, path: dir, err: fmt.Errorf("listing %s: %w", dir, err)}}
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".json") && !e.IsDir() {
				files[e.Name()] = path.Join(dir, e.Name())
			}
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []finding
	for _, n := range names {
		if f, ok := readHook(root, files[n]); ok {
			out = append(out, f)
		}
	}
	return out
}

// readHook reads one hooks.d file; false when it is not NVIDIA's. A file
// that cannot be parsed counts only if it names NVIDIA at all.
func readHook(root, p string) (finding, bool) {
	data, err := os.ReadFile(under(root, p))
	if err != nil {
		return finding{runtime: OCIHook, path: p, err: fmt.Errorf("reading %s: %w", p, err)}, true
	}
	var h hookFile
	var bin string
	if err = json.Unmarshal(data, &h); err == nil {
		bin, err = h.path()
	}
	if err != nil {
		return finding{runtime: OCIHook, path: p, err: fmt.Errorf("parsing %s: %w", p, err)}, strings.Contains(string(data), "nvidia")
	}
	if !isNVIDIAHook(bin) {
		return finding{}, false
	}
	f := finding{runtime: OCIHook, path: p, binary: bin, key: "when.always", every: h.always()}
	if !f.every {
		f.key = "when"
	}
	return f, true
}

// path is the hook's program, in either version's form.
func (h hookFile) path() (string, error) {
	var p string
	if err := json.Unmarshal(h.Hook, &p); err == nil {
		return p, nil
	}
	var obj struct {
		Path string `json:"path"`
	}
	if err := json.Unmarshal(h.Hook, &obj); err != nil {
		return "", fmt.Errorf("hook is neither a path nor {\"path\": ...}: %w", err)
	}
	return obj.Path, nil
}

// always says whether the hook runs for every container: when.always, a
// command pattern matching anything, or a 0.1.0 hook without conditions.
func (h hookFile) always() bool {
	if h.When.Always != nil && *h.When.Always {
		return true
	}
	if slices.Contains(h.When.Commands, ".*") || slices.Contains(h.Cmds, ".*") {
		return true
	}
	var p string
	legacy := json.Unmarshal(h.Hook, &p) == nil
	return legacy && len(h.Cmds) == 0 && len(h.Annotation) == 0 && h.HasBindMounts == nil
}

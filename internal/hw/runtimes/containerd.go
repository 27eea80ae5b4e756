package runtimes

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// containerdConfigs are where containerd's config is found: its own
// default, and k3s's and RKE2's generated ones.
var containerdConfigs = []string{
	"/etc/containerd/config.toml",
	"/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
	"/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
}

// criPlugin is the CRI plugin's table, by config version: its runtimes
// moved to io.containerd.cri.v1.runtime in version 3 (containerd 2.0).
func criPlugin(version int64) string {
	switch {
	case version >= 3:
		return "io.containerd.cri.v1.runtime"
	case version == 2:
		return "io.containerd.grpc.v1.cri"
	}
	return "cri"
}

// containerdFindings reads each containerd config with its imports and
// says which of its runtimes are NVIDIA's.
func containerdFindings(root string) []finding {
	var out []finding
	for _, main := range containerdConfigs {
		files, err := loadContainerd(root, main)
		if err != nil {
			out = append(out, finding{runtime: Containerd, path: main, err: err})
			continue
		}
		if files == nil {
			continue
		}
		out = append(out, containerdRuntimes(files)...)
	}
	return out
}

// loadContainerd reads the config at host path main and the files it
// imports, in containerd's order: the main file first, then each import,
// later ones overriding. nil when main is missing.
func loadContainerd(root, main string) ([]tomlFile, error) {
	var files []tomlFile
	seen := map[string]bool{}
	pending := []string{main}
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		t, err := readTOML(root, p)
		if err != nil {
			return nil, err
		}
		if t == nil {
			if p == main {
				return nil, nil
			}
			continue // containerd skips an import that matches nothing
		}
		files = append(files, tomlFile{path: p, t: t})
		imports, _ := lookup(t, "imports").([]any)
		for _, v := range imports {
			pattern, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s: imports holds %v, not a path", p, v)
			}
			if !path.IsAbs(pattern) {
				pattern = path.Join(path.Dir(p), pattern)
			}
			matches, err := filepath.Glob(under(root, pattern))
			if err != nil {
				return nil, fmt.Errorf("%s: import %q: %w", p, pattern, err)
			}
			for _, m := range matches {
				rel, err := filepath.Rel(root, m)
				if err != nil {
					return nil, err
				}
				pending = append(pending, "/"+filepath.ToSlash(rel))
			}
		}
	}
	return files, nil
}

// containerdRuntimes finds NVIDIA's runtimes in one merged config.
func containerdRuntimes(files []tomlFile) []finding {
	var merged table
	for _, f := range files {
		merged = merge(merged, f.t)
	}
	version, _ := lookup(merged, "version").(int64)
	cri := []string{"plugins", criPlugin(version), "containerd"}
	at := func(keys ...string) []string { return append(append([]string{}, cri...), keys...) }
	defaultName := str(merged, at("default_runtime_name")...)
	var out []finding
	runtimes, _ := lookup(merged, at("runtimes")...).(table)
	for name := range runtimes {
		bin, key := runtimeBinary(merged, at("runtimes", name, "options"))
		if !isNVIDIARuntime(bin) {
			continue
		}
		f := finding{runtime: Containerd, binary: bin, every: name == defaultName || (defaultName == "" && name == "runc")}
		if f.every {
			f.key = dotted(at("default_runtime_name")...)
			if f.path = lastSetting(files, at("default_runtime_name")...); f.path == "" {
				f.key, f.path = dotted(at("runtimes", name, "options", key)...), lastSetting(files, at("runtimes", name, "options", key)...)
			}
		} else {
			f.key = dotted(at("runtimes", name, "options", key)...)
			f.path = lastSetting(files, at("runtimes", name, "options", key)...)
		}
		out = append(out, f)
	}
	// Version 1's unnamed default runtime.
	if bin, key := runtimeBinary(merged, at("default_runtime", "options")); isNVIDIARuntime(bin) && defaultName == "" {
		keys := at("default_runtime", "options", key)
		out = append(out, finding{runtime: Containerd, binary: bin, every: true, key: dotted(keys...), path: lastSetting(files, keys...)})
	}
	sortFindings(out)
	return out
}

// runtimeBinary is the binary a runc-shim runtime's options run, and the
// option that names it.
func runtimeBinary(t table, options []string) (string, string) {
	for _, key := range []string{"BinaryName", "Runtime"} {
		if s := str(t, append(options, key)...); s != "" {
			return s, key
		}
	}
	return "", ""
}

// sortFindings orders findings by key, so that a map's order never picks
// which one is reported.
func sortFindings(fs []finding) {
	slices.SortFunc(fs, func(a, b finding) int { return strings.Compare(a.key, b.key) })
}

package config

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite "+ReferencePath)

// TestReference: the settings reference is what Settings says.
func TestReference(t *testing.T) {
	path := filepath.Join("..", "..", ReferencePath)
	got := Reference()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/config -run TestReference -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s is out of date: run go test ./internal/config -run TestReference -update", ReferencePath)
	}
	for _, s := range Settings() {
		if s.Category == "" || !slices.Contains(Categories(), s.Category) {
			t.Errorf("%s has no known category, so the reference leaves it out", s.Key)
		}
	}
}

// TestDocsNameRealFlags: every --flag the README and docs/ quote is one the
// binaries have (or another program's, listed here), so docs cannot drift
// from the binary again.
func TestDocsNameRealFlags(t *testing.T) {
	ours := []string{"--config", "--help",
		// list, allocate, cdi generate
		"--output", "--dra", "--size", "--resource", "--available", "--must-include",
		// migrate
		"--from", "--env", "--compute-domains",
		// gpu-device-plugin-controller
		"--namespace", "--lease-name", "--identity", "--node-timeout", "--resync", "--lease-duration",
		// gpu-device-plugin-cdi-hook
		"--dir", "--link", "--folder"}
	for _, s := range Settings() {
		ours = append(ours, "--"+s.Flag)
	}
	others := []string{"--root-dir", "--device", "--set-timeslice", "--field-selector", "--show-labels", "--kube-version", "--create-all"} // the kubelet's, podman's, nvidia-smi's, kubectl's (2), helm's, nvidia-ctk's
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "..", "README.md"), filepath.Join("..", "..", "CHANGELOG.md"))
	quoted := regexp.MustCompile("`[^`\n]*`")
	flagRE := regexp.MustCompile(`(^|[^\w-])(--[a-z][a-z0-9-]*)`)
	for _, f := range files {
		if strings.HasSuffix(f, filepath.Base(MigrationGuide)) {
			continue // quotes NVIDIA's flags on purpose
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range quoted.FindAllString(string(data), -1) {
			for _, m := range flagRE.FindAllStringSubmatch(q, -1) {
				if !slices.Contains(ours, m[2]) && !slices.Contains(others, m[2]) {
					t.Errorf("%s quotes %s, which no command has (in %s)", f, m[2], q)
				}
			}
		}
	}
}

// TestDocsNameRealKeys: every key the README's settings mentions in
// "key: value" form in its YAML examples is a key Load takes.
func TestDocsNameRealKeys(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Top-level keys of ```yaml blocks that are config files (not manifests).
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1)
	known := keys()
	for _, b := range blocks {
		if strings.Contains(b[1], "apiVersion:") || strings.Contains(b[1], "kind:") {
			continue
		}
		for _, line := range strings.Split(b[1], "\n") {
			k, _, ok := strings.Cut(line, ":")
			if !ok || k == "" || k[0] == ' ' || k[0] == '#' || k[0] == '-' {
				continue
			}
			if !slices.Contains(known, k) {
				t.Errorf("README's config example sets %q, which is no key", k)
			}
		}
	}
}

// TestMPSKeysAreReal: the reference explains only keys sharing.mps takes.
func TestMPSKeysAreReal(t *testing.T) {
	for _, k := range mpsKeys() {
		if !slices.Contains(jsonKeys(MPS{}), k.key) {
			t.Errorf("the reference explains sharing.mps.%s, which is no key of sharing.mps", k.key)
		}
	}
}

package sysfstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMaterialize(t *testing.T) {
	root := t.TempDir()
	err := Materialize(root, strings.NewReader(`
# comment
dir  a/empty
file a/value 0x15b3
file a/spaced 4: ACTIVE
file a/empty-file
file a/bytes "\xff\x00"
link a/link ../target/name
file a/doc <<EOF
line	one
  line two
EOF
file gone/x 1
rm   gone
`))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a/value": "0x15b3\n", "a/spaced": "4: ACTIVE\n", "a/empty-file": "", "a/bytes": "\xff\x00",
		"a/doc": "line\tone\n  line two\n",
	}
	for p, want := range files {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "a/empty")); err != nil || !fi.IsDir() {
		t.Errorf("a/empty: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(root, "a/link")); err != nil || target != "../target/name" {
		t.Errorf("a/link -> %q, %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(root, "gone")); !os.IsNotExist(err) {
		t.Errorf("rm left gone: %v", err)
	}
}

func TestMaterializeErrors(t *testing.T) {
	for name, text := range map[string]string{
		"unknown directive":    "touch a\n",
		"escaping path":        "file ../a 1\n",
		"absolute path":        "file /etc/a 1\n",
		"link without target":  "link a\n",
		"unterminated heredoc": "file a <<EOF\nx\n",
		"bad go string":        `file a "\q"` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			if err := Materialize(t.TempDir(), strings.NewReader(text)); err == nil || !strings.Contains(err.Error(), "line ") {
				t.Errorf("Materialize(%q) = %v, want an error naming the line", text, err)
			}
		})
	}
}

func TestEveryFixtureLoads(t *testing.T) {
	matches, err := filepath.Glob(filepath.Join(Dir(), "*.tree"))
	if err != nil || len(matches) == 0 {
		t.Fatalf("no fixtures in %s: %v", Dir(), err)
	}
	for _, m := range matches {
		name := strings.TrimSuffix(filepath.Base(m), ".tree")
		t.Run(name, func(t *testing.T) {
			root := Load(t, name)
			if _, err := os.Stat(filepath.Join(root, "sys", "bus", "pci", "devices")); err != nil {
				t.Errorf("fixture has no PCI devices: %v", err)
			}
		})
	}
}

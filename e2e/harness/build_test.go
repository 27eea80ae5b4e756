package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildTagsAreTheMakefiles: the harness builds the plugin as make does,
// or the scenario's memory figures would be another executable's.
func TestBuildTagsAreTheMakefiles(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "GOTAGS = "); ok {
			if v = strings.TrimSpace(v); v != BuildTags {
				t.Errorf("BuildTags is %q, the Makefile's GOTAGS %q", BuildTags, v)
			}
			return
		}
	}
	t.Fatal("the Makefile sets no GOTAGS")
}

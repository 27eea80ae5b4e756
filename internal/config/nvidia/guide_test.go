package nvidia

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

var update = flag.Bool("update", false, "rewrite the table in "+config.MigrationGuide)

const (
	tableStart = "<!-- Generated from nvidia.Keys by `go test ./internal/config/nvidia -run TestGuideTable -update`; do not edit. -->\n\n"
	tableEnd   = "\n<!-- End of the generated table. -->"
)

// TestGuideTable: the migration guide's table is Keys, so the guide and
// migrate cannot disagree.
func TestGuideTable(t *testing.T) {
	path := filepath.Join("..", "..", "..", config.MigrationGuide)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, tableStart), strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated table between %q and %q", config.MigrationGuide, tableStart, tableEnd)
	}
	want := doc[:i+len(tableStart)] + Table() + doc[j:]
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc != want {
		t.Errorf("%s's table is out of date: run go test ./internal/config/nvidia -run TestGuideTable -update", config.MigrationGuide)
	}
}

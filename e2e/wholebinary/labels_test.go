package wholebinary

import (
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

var updateLabels = flag.Bool("update-labels", false, "rewrite profiles/testdata/<profile>.labels from what list prints now")

// The node labels (GPU Feature Discovery's names) of every mock machine,
// as `list -o json` shows what the plugin delivers, against golden files:
// a change to any label's name or value on any machine shows here.
func TestLabelsPerProfile(t *testing.T) {
	profiles, err := filepath.Glob("../profiles/*.profile")
	if err != nil || len(profiles) == 0 {
		t.Fatalf("no profiles: %v", err)
	}
	for _, path := range profiles {
		name := strings.TrimSuffix(filepath.Base(path), ".profile")
		t.Run(name, func(t *testing.T) {
			args := []string{"--output", "json", "--pod-resources-socket", ""}
			if strings.HasSuffix(name, "-mig") {
				args = append([]string{"--mig-strategy", "mixed"}, args...)
			}
			stdout, _, err := harness.RunCommand(ctx(t), binary, library, path, "list", args...)
			if err != nil {
				t.Fatal(err)
			}
			var out struct {
				Labels map[string]string `json:"labels"`
			}
			if err := json.Unmarshal([]byte(stdout), &out); err != nil {
				t.Fatalf("list -o json: %v", err)
			}
			var b strings.Builder
			for _, k := range slices.Sorted(maps.Keys(out.Labels)) {
				b.WriteString(k + "=" + out.Labels[k] + "\n")
			}
			golden := filepath.Join("..", "profiles", "testdata", name+".labels")
			if *updateLabels {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (write it with go test ./wholebinary -run TestLabelsPerProfile -update-labels)", err)
			}
			if b.String() != string(want) {
				t.Errorf("labels of %s changed; got\n%s\nwant\n%s", name, b.String(), want)
			}
		})
	}
}

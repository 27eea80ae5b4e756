package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// readDoc is a file of the repository with its whitespace runs made one
// space, so a phrase matches across the line wraps of Markdown.
func readDoc(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{"..", ".."}, parts...)...))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// settingDefault is the default of the setting key.
func settingDefault(t *testing.T, key string) string {
	t.Helper()
	for _, s := range Settings() {
		if s.Key == key {
			return s.Default
		}
	}
	t.Fatalf("no setting %s", key)
	return ""
}

// The README's claims about what the plugin does, checked against the code
// that decides it, so that one paragraph cannot say the opposite of
// another: with node labels written by default (the nodeLabels setting),
// the README says so and says GFD is replaced, and nowhere says the plugin
// writes no labels or that GFD should keep running beside it (two writers
// of the same nvidia.com/* keys fight, docs/node-labels.md).
func TestReadmeClaims(t *testing.T) {
	readme := readDoc(t, "README.md")
	writes := settingDefault(t, "nodeLabels") != NodeLabelsNone
	for _, c := range []struct {
		claim string
		re    string
		want  bool
	}{
		{"the plugin writes GFD's node labels", `(?i)\bwrites the node labels GPU Feature Discovery sets\b`, writes},
		{"it replaces GFD", `(?i)\breplaces GFD\b`, writes},
		{"it writes no node labels", `(?i)\bno (node )?labels\b|\bdoes not (write|set) (the )?(node )?labels\b`, !writes},
		{"GFD should keep running beside it", `(?i)\b(keep|run|leave) (GFD|GPU Feature Discovery)\b|\b(GFD|GPU Feature Discovery) (running )?(alongside|beside|as well|too)\b`, !writes},
		{"it does not do GFD's job", `(?i)does not do (GPU Feature Discovery|GFD)'s job`, !writes},
	} {
		if got := regexp.MustCompile(c.re).MatchString(readme); got != c.want {
			verb := "says"
			if !c.want {
				verb = "must not say"
			}
			t.Errorf("README.md %s that %s (nodeLabels defaults to %q): /%s/ matches: %v", verb, c.claim, settingDefault(t, "nodeLabels"), c.re, got)
		}
	}
	// The DaemonSet's node labels, as the chart's values.yaml holds them: the
	// README and the install page name each one, so a node can be labelled
	// from what they say.
	var values struct {
		Terms []struct {
			MatchExpressions []struct {
				Key    string   `json:"key"`
				Values []string `json:"values"`
			} `json:"matchExpressions"`
		} `json:"gpuNodeSelectorTerms"`
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "helm", "gpu-device-plugin", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	if len(values.Terms) == 0 {
		t.Fatal("values.yaml has no gpuNodeSelectorTerms")
	}
	install := readDoc(t, "docs", "install.md")
	for _, term := range values.Terms {
		for _, e := range term.MatchExpressions {
			label := e.Key + "=" + strings.Join(e.Values, ",")
			for name, doc := range map[string]string{"README.md": readme, "docs/install.md": install} {
				if !strings.Contains(doc, "`"+label+"`") {
					t.Errorf("%s does not name the GPU node label `%s` the chart's DaemonSets select", name, label)
				}
			}
		}
	}
}

// Every page in docs/ opens, under its title, with a paragraph that says
// what the page is for, before any heading, table, list or code.
func TestDocsOpenWithPurpose(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if !strings.HasPrefix(lines[0], "# ") {
			t.Errorf("%s does not start with a # title", f)
			continue
		}
		first := ""
		for _, l := range lines[1:] {
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "<!--") {
				continue
			}
			first = l
			break
		}
		if first == "" || strings.HasPrefix(first, "```") || strings.ContainsAny(first[:1], "#|-*>!<") {
			t.Errorf("%s opens with %q, not a paragraph saying what the page is for", f, first)
		}
	}
}

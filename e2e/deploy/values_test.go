package deploy

import (
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
)

// Every key of values.yaml has a comment of its own (above it or on its
// line), or is named in "key:" form by the comment of a key it sits under
// (as alerts' comment names enabled, for and severity for each alert).
// Values that are Kubernetes' own fields (resources, securityContext, an
// updateStrategy, a probe's timing) are described by their key's comment
// and the Kubernetes API reference, not key by key; lists are described by
// their key.
func TestHelmValuesCommented(t *testing.T) {
	kubernetesFields := []string{"resources", "mpsLauncher.resources", "computeDomains.controller.resources", "securityContext", "cdiHook.securityContext",
		"updateStrategy", "dra.updateStrategy", "affinity", "nodeSelector", "podAnnotations", "podLabels",
		"health.livenessProbe", "health.readinessProbe",
		// The plugin's settings by name (config.map), each a config.
		"config.map"}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(mustRead(t, filepath.Join(chartDir(t), "values.yaml")), &doc); err != nil {
		t.Fatal(err)
	}
	var missing []string
	// covered: the keys named by the comments of the keys above.
	var walk func(path string, n *yamlv3.Node, covered []string)
	walk = func(path string, n *yamlv3.Node, covered []string) {
		if n.Kind != yamlv3.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := path + k.Value
			// yaml.v3 gives the document a comment block that opens the
			// file and ends in a blank line; the first key's own follows.
			own := strings.TrimSpace(k.HeadComment + k.LineComment)
			if own == "" && !slices.Contains(covered, k.Value) {
				missing = append(missing, p)
			}
			if slices.Contains(kubernetesFields, p) {
				continue
			}
			named := slices.Clone(covered)
			for _, m := range regexp.MustCompile(`(?m)(?:^|[\s(])([a-zA-Z_]+):`).FindAllStringSubmatch(k.HeadComment, -1) {
				named = append(named, m[1])
			}
			walk(p+".", v, named)
		}
	}
	walk("", doc.Content[0], nil)
	sort.Strings(missing)
	for _, p := range missing {
		t.Errorf("values.yaml: %s has no comment: say above it what it does and the values it takes", p)
	}
}

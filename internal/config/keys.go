package config

import (
	"fmt"
	"strings"

	// The same v3 parser the CDI library links: two copies of it would
	// cost 0.3 MB of an executable that is resident whole.
	yamlv3 "gopkg.in/yaml.v3"
)

// duplicateKey finds a key given twice in one map of the file, at any depth,
// and names it with both lines. YAML forbids it, and the decoder's own
// message takes two lines and names only the second.
func duplicateKey(data []byte) error {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		return nil // a syntax error: the strict decoder reports it
	}
	return duplicateIn(&doc, "")
}

func duplicateIn(n *yamlv3.Node, path string) error {
	switch n.Kind {
	case yamlv3.DocumentNode, yamlv3.SequenceNode:
		for i, c := range n.Content {
			p := path
			if n.Kind == yamlv3.SequenceNode {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			if err := duplicateIn(c, p); err != nil {
				return err
			}
		}
	case yamlv3.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := k.Value
			if path != "" {
				key = path + "." + k.Value
			}
			if line, ok := first[k.Value]; ok {
				return fmt.Errorf("key %q is set twice, on lines %d and %d; keep one", key, line, k.Line)
			}
			first[k.Value] = k.Line
			if err := duplicateIn(v, key); err != nil {
				return err
			}
		}
	}
	return nil
}

// nvidiaFormat says whether the top-level keys are those of NVIDIA
// k8s-device-plugin's config file (version: v1, flags: ...), which a user
// switching over may hand us unchanged.
func nvidiaFormat(top []string) bool {
	var version, flags bool
	for _, k := range top {
		version = version || k == "version"
		flags = flags || k == "flags"
	}
	return flags || version && len(top) <= 3
}

// MigrationGuide is the document that maps NVIDIA's settings onto ours.
const MigrationGuide = "docs/migrating-from-nvidia.md"

// unknownKey says a key is unknown, and which known key it may mean: one
// that differs only in case, or else the nearest by edit distance when it
// is near enough to be a typo.
func unknownKey(key string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Sprintf("unknown key %q; keys are case-sensitive: did you mean %q?", key, k)
		}
	}
	best, bestDist := "", -1
	for _, k := range known {
		if d := editDistance(strings.ToLower(key), strings.ToLower(k)); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist >= 0 && bestDist <= max(2, len(key)/4) {
		return fmt.Sprintf("unknown key %q; did you mean %q?", key, best)
	}
	return fmt.Sprintf("unknown key %q; known keys: %s", key, strings.Join(known, ", "))
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

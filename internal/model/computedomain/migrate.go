package computedomain

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"

	"sigs.k8s.io/yaml"
)

// Migrate rewrites the ComputeDomains of NVIDIA's API in a YAML stream
// (documents separated by "---") to ours: only their apiVersion line
// changes, so comments, order and every other object stay as they were.
// The spec schemas are the same; a spec key we do not know is an error
// naming the document and the key, since the API server would refuse it.
// Converted counts the objects rewritten.
func Migrate(stream []byte) (out []byte, converted int, err error) {
	docs := docSplit.Split(string(stream), -1)
	seps := docSplit.FindAllString(string(stream), -1)
	var b bytes.Buffer
	for i, doc := range docs {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct{ Name string }
			Spec       map[string]any `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, 0, fmt.Errorf("document %d: %w", i+1, err)
		}
		if head.Kind == Kind && head.APIVersion == NVIDIAAPIVersion {
			for k := range head.Spec {
				if !slices.Contains([]string{"numNodes", "channel"}, k) {
					return nil, 0, fmt.Errorf("document %d (ComputeDomain %s): spec.%s is not in %s; remove it, or keep this domain on NVIDIA's driver", i+1, head.Metadata.Name, k, APIVersion)
				}
			}
			rewritten := apiVersionLine.ReplaceAllString(doc, "${1}"+APIVersion)
			if rewritten == doc {
				return nil, 0, fmt.Errorf("document %d (ComputeDomain %s): apiVersion is not on a line of its own (apiVersion: %s); write it so and run again", i+1, head.Metadata.Name, NVIDIAAPIVersion)
			}
			doc = rewritten
			converted++
		}
		b.WriteString(doc)
		if i < len(seps) {
			b.WriteString(seps[i])
		}
	}
	return b.Bytes(), converted, nil
}

var (
	docSplit       = regexp.MustCompile(`(?m)^---[ \t]*\n`)
	apiVersionLine = regexp.MustCompile(`(?m)^(apiVersion:[ \t]*)["']?` + regexp.QuoteMeta(NVIDIAAPIVersion) + `["']?[ \t]*$`)
)

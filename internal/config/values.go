package config

import (
	"encoding/json"
	"strings"
)

// Keys lists every key, those with a flag first (in Settings' order),
// then the file-only ones.
func Keys() []string { return keys() }

// Values is each key's value as text: a string as it is, a list
// comma-separated as a flag takes it, a nested value (sharing,
// nicResources) as compact JSON. A key the configuration leaves out
// (an empty nicResources) is absent.
func (c Config) Values() map[string]string {
	data, err := json.Marshal(c)
	if err != nil {
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		var section map[string]json.RawMessage
		if sectionKeys[k] && json.Unmarshal(v, &section) == nil {
			// A section's keys are settings of their own: remediation.reset.
			for sub, sv := range section {
				out[k+"."+sub] = text(sv)
			}
			continue
		}
		out[k] = text(v)
	}
	return out
}

// sectionKeys are the top-level keys whose keys are settings of their own.
var sectionKeys = map[string]bool{"remediation": true, "imex": true}

func text(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	var list []any
	if json.Unmarshal(v, &list) == nil {
		parts := make([]string, 0, len(list))
		for _, x := range list {
			switch x.(type) {
			case map[string]any, []any:
				return string(v) // a list of objects: JSON
			}
			b, _ := json.Marshal(x)
			parts = append(parts, strings.Trim(string(b), `"`))
		}
		return strings.Join(parts, ",")
	}
	if string(v) == "null" {
		return ""
	}
	return string(v)
}

// Package jsonkeep decodes a JSON object into a struct while keeping the
// keys the struct has no field for, and encodes it with them added back.
// Files the plugin keeps on disk (the DRA checkpoint, the state file) are
// read by the previous and the next release: a key a newer release wrote
// must survive an older one's rewrite, so a rollback followed by a roll
// forward loses nothing.
//
// A type keeps its unknown keys in a Fields value of its own and calls
// Decode and Encode from its JSON methods, through a local type without
// those methods:
//
//	func (c *claim) UnmarshalJSON(b []byte) error {
//		type plain claim
//		var p plain
//		x, err := jsonkeep.Decode(b, &p)
//		*c, c.extra = claim(p), x
//		return err
//	}
package jsonkeep

import (
	"encoding/json"
	"reflect"
	"strings"
)

// Fields are the keys of a JSON object that the decoding type has no
// field for, with their values as written.
type Fields map[string]json.RawMessage

// Decode decodes data into v, a pointer to a struct whose type has no JSON
// methods of its own, and returns the keys v has no field for (nil when
// there are none).
func Decode(data []byte, v any) (Fields, error) {
	if err := json.Unmarshal(data, v); err != nil {
		return nil, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	for _, k := range keys(reflect.TypeOf(v).Elem()) {
		delete(all, k)
	}
	if len(all) == 0 {
		return nil, nil
	}
	return all, nil
}

// Encode encodes v, a struct whose type has no JSON methods of its own,
// with the extra keys added back; a key v itself writes wins. Without
// extra keys the output is exactly json.Marshal's, field order included.
func Encode(v any, extra Fields) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil || len(extra) == 0 {
		return b, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	for k, raw := range extra {
		if _, known := all[k]; !known {
			all[k] = raw
		}
	}
	return json.Marshal(all)
}

// keys are the keys encoding/json uses for t's exported fields.
func keys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

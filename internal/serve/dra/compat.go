package dra

import (
	"encoding/json"
	"reflect"
	"strings"
)

// unknownFields are the keys of a JSON object that this release has no
// field for: a newer release wrote them. They are kept and written back, so
// a rollback followed by a roll forward loses nothing.
type unknownFields map[string]json.RawMessage

// decodeKeeping decodes data into v, a pointer to a struct whose type has no
// JSON methods of its own, and returns the keys v has no field for.
func decodeKeeping(data []byte, v any) (unknownFields, error) {
	if err := json.Unmarshal(data, v); err != nil {
		return nil, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	for _, k := range jsonKeys(reflect.TypeOf(v).Elem()) {
		delete(all, k)
	}
	if len(all) == 0 {
		return nil, nil
	}
	return all, nil
}

// encodeKeeping encodes v with the unknown keys added back; without any,
// the output is exactly json.Marshal's, field order included.
func encodeKeeping(v any, extra unknownFields) ([]byte, error) {
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

// jsonKeys are the keys encoding/json uses for t's exported fields.
func jsonKeys(t reflect.Type) []string {
	var keys []string
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
		keys = append(keys, name)
	}
	return keys
}

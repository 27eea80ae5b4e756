// Package jsonkeep decodes a JSON object into a struct while keeping the
// keys the struct has no field for, and encodes it with them added back.
// Files the plugin keeps on disk (the DRA checkpoint, the state file) are
// read by the previous and the next release: a key a newer release wrote
// must survive an older one's rewrite, so a rollback followed by a roll
// forward loses nothing.
//
// A type keeps its unknown keys in a Fields value of its own, and its JSON
// methods hand Unmarshal and Marshal a local type without those methods
// (decoding into the type itself would call its method again):
//
//	func (c *claim) UnmarshalJSON(b []byte) error {
//		type plain claim
//		return jsonkeep.Unmarshal[plain](b, c, &c.extra)
//	}
//
//	func (c claim) MarshalJSON() ([]byte, error) {
//		type plain claim
//		return jsonkeep.Marshal[plain](c, c.extra)
//	}
package jsonkeep

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Fields are the keys of a JSON object that the decoding type has no
// field for, with their values as written.
type Fields map[string]json.RawMessage

// Unmarshal decodes data into *v, from v's zero value, and sets *extra to
// the keys v's type has no field for (nil when there are none). P is T
// without its JSON methods (type plain T). On an error *v holds what was
// decoded, as after json.Unmarshal.
func Unmarshal[P, T any](data []byte, v *T, extra *Fields) error {
	if err := plainOf[P, T](); err != nil {
		return err
	}
	var p P
	x, err := decode(data, &p)
	*v = reflect.ValueOf(p).Convert(reflect.TypeFor[T]()).Interface().(T)
	*extra = x
	return err
}

// Marshal encodes v with the extra keys added back; a key v itself writes
// wins. Without extra keys the output is exactly json.Marshal's, field
// order included. P is T without its JSON methods, as for Unmarshal.
func Marshal[P, T any](v T, extra Fields) ([]byte, error) {
	if err := plainOf[P, T](); err != nil {
		return nil, err
	}
	return encode(reflect.ValueOf(v).Convert(reflect.TypeFor[P]()).Interface(), extra)
}

var (
	marshaler   = reflect.TypeFor[json.Marshaler]()
	unmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// plainOf says why P cannot stand for T: it must be a struct of T's
// fields, with no JSON methods of its own.
func plainOf[P, T any]() error {
	p, t := reflect.TypeFor[P](), reflect.TypeFor[T]()
	switch {
	case p.Kind() != reflect.Struct || !p.ConvertibleTo(t):
		return fmt.Errorf("jsonkeep: %v is not a struct of %v's fields", p, t)
	case p.Implements(marshaler) || reflect.PointerTo(p).Implements(unmarshaler):
		return fmt.Errorf("jsonkeep: %v has JSON methods; declare it as type plain %v", p, t)
	}
	return nil
}

// decode decodes data into v, a pointer to a struct whose type has no JSON
// methods of its own, and returns the keys v has no field for (nil when
// there are none).
func decode(data []byte, v any) (Fields, error) {
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

// encode encodes v, a struct whose type has no JSON methods of its own,
// with the extra keys added back.
func encode(v any, extra Fields) ([]byte, error) {
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

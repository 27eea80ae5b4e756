package jsonkeep

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

type thing struct {
	Name  string `json:"name"`
	Count int    `json:"count,omitempty"`
	extra Fields
}

func (t *thing) UnmarshalJSON(b []byte) error {
	type plain thing
	return Unmarshal[plain](b, t, &t.extra)
}

func (t thing) MarshalJSON() ([]byte, error) {
	type plain thing
	return Marshal[plain](t, t.extra)
}

// Keys the type does not know come back, values untouched, whatever their
// kind; the ones it knows are its own.
func TestRoundTripKeepsUnknownKeys(t *testing.T) {
	in := `{"name":"a","count":2,"since":"2026-11-27T06:00:00Z","nested":{"x":[1,2]},"flag":true}`
	var v thing
	if err := json.Unmarshal([]byte(in), &v); err != nil {
		t.Fatal(err)
	}
	if v.Name != "a" || v.Count != 2 || len(v.extra) != 3 {
		t.Fatalf("decoded %+v", v)
	}
	v.Name = "b"
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(strings.Replace(in, `"a"`, `"b"`, 1)), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wrote %s, want %v", out, want)
	}
}

// Without unknown keys the bytes are json.Marshal's own, so a file of
// this release alone reads as before.
func TestNoUnknownKeysIsPlainJSON(t *testing.T) {
	var v thing
	if err := json.Unmarshal([]byte(`{"name":"a"}`), &v); err != nil {
		t.Fatal(err)
	}
	if v.extra != nil {
		t.Errorf("extra %v, want nil", v.extra)
	}
	out, err := json.Marshal(v)
	if err != nil || string(out) != `{"name":"a"}` {
		t.Errorf("wrote %s, %v", out, err)
	}
}

// A key the type writes itself is not overwritten by a kept one.
func TestKnownKeyWins(t *testing.T) {
	out, err := encode(struct {
		Name string `json:"name"`
	}{"mine"}, Fields{"name": json.RawMessage(`"theirs"`), "other": json.RawMessage(`1`)})
	if err != nil || string(out) != `{"name":"mine","other":1}` {
		t.Errorf("wrote %s, %v", out, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	var v thing
	for _, in := range []string{`{not json`, `[1,2]`, `{"name":3}`} {
		if err := json.Unmarshal([]byte(in), &v); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
}

func TestKeys(t *testing.T) {
	type x struct {
		A      int `json:"a,omitempty"`
		B      int
		C      int `json:"-"`
		hidden int
	}
	_ = x{}.hidden
	if got := strings.Join(keys(reflect.TypeOf(x{})), ","); got != "a,B" {
		t.Errorf("keys %q", got)
	}
}

// holder nests kept types in a slice, a map and a pointer, as the DRA
// checkpoint does: each level keeps its own unknown keys.
type holder struct {
	Things []thing          `json:"things"`
	ByName map[string]thing `json:"byName,omitempty"`
	One    *thing           `json:"one,omitempty"`
	extra  Fields
}

func (h *holder) UnmarshalJSON(b []byte) error {
	type plain holder
	return Unmarshal[plain](b, h, &h.extra)
}

func (h holder) MarshalJSON() ([]byte, error) {
	type plain holder
	return Marshal[plain](h, h.extra)
}

// handThing and handHolder are thing and holder with the pair each type
// used to write by hand: decode into a local plain type, encode of it.
type handThing struct {
	Name  string `json:"name"`
	Count int    `json:"count,omitempty"`
	extra Fields
}

func (t *handThing) UnmarshalJSON(b []byte) error {
	type plain handThing
	var p plain
	x, err := decode(b, &p)
	*t, t.extra = handThing(p), x
	return err
}

func (t handThing) MarshalJSON() ([]byte, error) {
	type plain handThing
	return encode(plain(t), t.extra)
}

type handHolder struct {
	Things []handThing          `json:"things"`
	ByName map[string]handThing `json:"byName,omitempty"`
	One    *handThing           `json:"one,omitempty"`
	extra  Fields
}

func (h *handHolder) UnmarshalJSON(b []byte) error {
	type plain handHolder
	var p plain
	x, err := decode(b, &p)
	*h, h.extra = handHolder(p), x
	return err
}

func (h handHolder) MarshalJSON() ([]byte, error) {
	type plain handHolder
	return encode(plain(h), h.extra)
}

// The bytes written are the hand-written pair's, with and without unknown
// keys, at every level.
func TestSameBytesAsTheHandWrittenPair(t *testing.T) {
	for _, in := range []string{
		`{"things":[{"name":"a"}]}`,
		`{"things":[{"name":"a","count":1,"z":true}],"byName":{"b":{"name":"b","a":[1]}},"one":{"name":"c"},"newer":{"k":"v"}}`,
		`{"things":null,"a":1,"b":2}`,
		`{"byName":{"x":{"count":3,"name":"x"}},"things":[]}`,
	} {
		t.Run(in, func(t *testing.T) {
			var h holder
			var hh handHolder
			if err := json.Unmarshal([]byte(in), &h); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(in), &hh); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(hh)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("wrote\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// Unmarshal starts from the zero value, as decoding into a fresh plain
// value did: what the old value held and data does not name is gone,
// kept keys included.
func TestUnmarshalStartsFromZero(t *testing.T) {
	v := thing{Name: "old", Count: 7, extra: Fields{"x": json.RawMessage(`1`)}}
	if err := json.Unmarshal([]byte(`{"name":"new"}`), &v); err != nil {
		t.Fatal(err)
	}
	if v.Name != "new" || v.Count != 0 || v.extra != nil {
		t.Errorf("decoded %+v", v)
	}
}

// A plain type that is not T's fields without methods is refused, not
// recursed into or converted.
func TestPlainTypeChecked(t *testing.T) {
	type other struct{ Name string }
	var v thing
	var x Fields
	for name, err := range map[string]error{
		"T itself":       Unmarshal[thing](nil, &v, &x),
		"other fields":   Unmarshal[other]([]byte(`{}`), &v, &x),
		"marshal itself": func() error { _, err := Marshal[thing](v, nil); return err }(),
		"marshal other":  func() error { _, err := Marshal[other](v, nil); return err }(),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "jsonkeep: ") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

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
	var p plain
	x, err := Decode(b, &p)
	*t, t.extra = thing(p), x
	return err
}

func (t thing) MarshalJSON() ([]byte, error) {
	type plain thing
	return Encode(plain(t), t.extra)
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
	out, err := Encode(struct {
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

package health

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// savedByANewerRelease is what a later release might have saved before a
// rollback: keys this release does not know on a condition it knows, and
// a condition of a kind it does not know.
const savedByANewerRelease = `[
  {"device": "GPU-1", "kind": "xid", "xid": 79, "since": "2026-11-27T06:00:00Z", "pid": 4242, "pages": [1, 2]},
  {"device": "GPU-2", "kind": "rowRemapFailure", "since": "2026-11-27T06:01:00Z", "banks": 3}
]`

func jsonValue(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return v
}

// A rolled-back plugin restores what it knows, leaves the device of the
// unknown kind's condition healthy, and exports everything again as it
// was, so the roll forward finds it.
func TestStickyOfANewerRelease(t *testing.T) {
	var saved []StickyCondition
	if err := json.Unmarshal([]byte(savedByANewerRelease), &saved); err != nil {
		t.Fatal(err)
	}
	var hooked [][]StickyCondition
	ids := []string{"GPU-0", "GPU-1", "GPU-2"}
	s, r := newSampler(3), &recorder{}
	w, err := NewWatcher(policy.Default(), ids, s, r, nil, nil, WithSticky(saved), OnStickyChange(func(c []StickyCondition) { hooked = append(hooked, c) }))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, r.take(), change{"GPU-1", false, "xid=79"})
	w.Poll()
	if len(r.take()) != 0 || len(hooked) != 0 {
		t.Fatalf("a poll with nothing new changed health or the saved conditions (%v)", hooked)
	}
	out, err := json.Marshal(w.Sticky())
	if err != nil {
		t.Fatal(err)
	}
	if g, want := jsonValue(t, out), jsonValue(t, []byte(savedByANewerRelease)); !reflect.DeepEqual(g, want) {
		t.Errorf("exported %s, want what was saved:\n%s", out, savedByANewerRelease)
	}

	// GPU-1 recovers: its condition and the keys kept on it go; the
	// unknown kind's stays for the release that knows it.
	s.set(1, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryReset })
	w.Poll()
	r.take()
	s.set(1, func(x *nvml.Sample) { x.RecoveryAction = nvml.RecoveryNone })
	w.Poll()
	expect(t, r.take(), change{"GPU-1", true, ""})
	if len(hooked) == 0 {
		t.Fatal("no change exported")
	}
	out, err = json.Marshal(hooked[len(hooked)-1])
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"device":"GPU-2","kind":"rowRemapFailure","since":"2026-11-27T06:01:00Z","banks":3}]`
	if !reflect.DeepEqual(jsonValue(t, out), jsonValue(t, []byte(want))) {
		t.Errorf("after recovery exported %s, want %s", out, want)
	}
}

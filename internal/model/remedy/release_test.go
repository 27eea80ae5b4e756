package remedy

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// Only a GPU out for a human or a reboot, on the node or kept from before
// a restart, is released by a human; the others say their state.
func TestReleasable(t *testing.T) {
	var s Saved
	if err := json.Unmarshal([]byte(`{"gpus": [{"uuid": "GPU-lost", "state": "needsReboot", "reason": "xid=79"}]}`), &s); err != nil {
		t.Fatal(err)
	}
	m, _, err := New(DefaultPolicy(), plainNode(), s, t0)
	if err != nil {
		t.Fatal(err)
	}
	m.Fault(gpuA, Facts{RowRemapFailure: true}, t0)
	m.Fault(gpuB, Facts{XIDs: []uint64{48}}, t0)
	for _, tc := range []struct {
		name, gpu string
		state     State // the state it says, for a refusal too
		unknown   bool
	}{
		{"out for a human", gpuA, StateNeedsHuman, false},
		{"absent, out for a reboot", "GPU-lost", StateNeedsReboot, false},
		{"draining: refused, with its state", gpuB, StateDraining, false},
		{"serving: refused, with its state", gpuC, StateServing, false},
		{"not on the node", "GPU-nope", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := m.Releasable(tc.gpu)
			var nt *NotTerminalError
			switch {
			case tc.unknown:
				if !errors.Is(err, ErrUnknownGPU) {
					t.Fatalf("err %v, want ErrUnknownGPU", err)
				}
				return
			case tc.state.IsTerminal():
				if err != nil {
					t.Fatal(err)
				}
			case !errors.As(err, &nt) || nt.State != tc.state || nt.GPU != tc.gpu:
				t.Fatalf("err %v, want a NotTerminalError saying %s", err, tc.state)
			}
			if st.GPU != tc.gpu || st.State != tc.state {
				t.Errorf("status %+v, want %s", st, tc.state)
			}
		})
	}
}

// The file read without a Machine says what the Machine said when it was
// written, less what it does not keep; resets leave the count with the
// window.
func TestSavedStatus(t *testing.T) {
	m := goldenMachine(t)
	now := t0.Add(time.Hour + time.Second)
	want := m.Status()
	for i := range want {
		want[i].Waiting = ""
	}
	var kept []Status
	for _, st := range want {
		if st.State != StateServing || st.Resets > 0 {
			kept = append(kept, st)
		}
	}
	b, err := json.Marshal(m.Save())
	if err != nil {
		t.Fatal(err)
	}
	var s Saved
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	p := DefaultPolicy()
	if got := s.Status(p.Window, now); !reflect.DeepEqual(got, kept) {
		t.Errorf("from the file\n%+v\nwant\n%+v", got, kept)
	}
	later := s.Status(p.Window, now.Add(p.Window))
	for _, st := range later {
		if st.Resets != 0 {
			t.Errorf("%s counts %d resets a window later", st.GPU, st.Resets)
		}
	}
}

package remedy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

var update = flag.Bool("update", false, "rewrite testdata/saved.json")

func TestRestart(t *testing.T) {
	peersOn := func(p *Policy) { p.ResetPeers = true }
	volta := pairNode("volta", "7.0", true, FabricManagerRunning)
	for _, c := range []machineCase{
		{
			name:  "found resetting: probed, never reset again nor counted twice",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "resetting", "decision": "reset", "reason": "xid=48", "started": "2026-11-27T05:50:00Z", "resets": ["2026-11-27T05:59:00Z"]}]}`,
			start: []string{"withhold GPU-a", "note GPU-a", "GPU-a resetting->probing", "probe GPU-a"},
			steps: []step{
				{probeDone(time.Minute, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			name:  "found resetting with a reboot owed: the reboot",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "resetting", "decision": "reset", "then": "reboot", "thenReason": "xid=79", "resets": ["2026-11-27T05:59:00Z"]}]}`,
			start: []string{"withhold GPU-a", "GPU-a resetting->needsReboot", "nodeReboot GPU-a"},
			end:   map[string]want{gpuA: {StateNeedsReboot, "xid=79", 1}},
		},
		{
			name:   "a group found resetting: each probed",
			policy: peersOn,
			node:   &volta,
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "resetting", "decision": "reset", "resetGroup": ["GPU-a", "GPU-b"], "resets": ["2026-11-27T05:59:00Z"]},
				{"uuid": "GPU-b", "state": "resetting", "decision": "withPeer", "heldFor": "GPU-a", "resetGroup": ["GPU-a", "GPU-b"]}]}`,
			start: []string{"withhold GPU-a", "note GPU-a", "GPU-a resetting->probing", "probe GPU-a", "withhold GPU-b", "note GPU-b", "GPU-b resetting->probing", "probe GPU-b"},
			end:   map[string]want{gpuA: {StateProbing, "", 1}, gpuB: {StateProbing, "", 0}},
		},
		{
			name:  "found draining: withheld, and waits for a fresh usage report",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "draining", "decision": "reset", "reason": "xid=48", "started": "2026-11-27T05:00:00Z"}]}`,
			start: []string{"withhold GPU-a"},
			steps: []step{
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "xid=48", 1}},
		},
		{
			name:  "found draining for a drain the driver still asks for",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "waitingIdle", "decision": "drain", "recoveryAction": 3, "started": "2026-11-27T05:00:00Z"}]}`,
			start: []string{"withhold GPU-a", "GPU-a waitingIdle->draining"},
			steps: []step{
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->waitingIdle"}},
			},
			end: map[string]want{gpuA: {StateWaitingIdle, "the driver still asks for a drain", 0}},
		},
		{
			name:  "found out for a human or a reboot: said again",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "needsHuman", "reason": "probe failed"}, {"uuid": "GPU-b", "state": "needsReboot", "reason": "gpu-lost"}]}`,
			start: []string{"withhold GPU-a", "needsHuman GPU-a", "withhold GPU-b", "nodeReboot GPU-b"},
			end:   map[string]want{gpuA: {StateNeedsHuman, "probe failed", 0}, gpuB: {StateNeedsReboot, "gpu-lost", 0}},
		},
		{
			name:  "a state this release does not know: out for a human",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "quarantined", "reason": "burn-in"}]}`,
			start: []string{"withhold GPU-a", "needsHuman GPU-a"},
			end:   map[string]want{gpuA: {StateNeedsHuman, `saved in state "quarantined"`, 0}},
		},
		{
			name:  "watching is forgotten: health says again what it sees",
			saved: `{"gpus": [{"uuid": "GPU-a", "state": "watching", "reason": "thermal", "resets": ["2026-11-27T05:00:00Z", "2026-11-26T05:00:00Z"]}]}`,
			start: []string{},
			end:   map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			name: "a GPU gone or renamed is dropped; one owed a reboot is kept",
			saved: `{"gpus": [{"uuid": "GPU-gone", "state": "draining", "decision": "reset"},
				{"uuid": "GPU-lost", "state": "needsReboot", "reason": "xid=79"}]}`,
			start: []string{"note GPU-gone", "note GPU-lost", "nodeReboot GPU-lost"},
			steps: []step{
				{release(time.Hour, "GPU-lost"), []string{"note GPU-lost"}},
			},
		},
		{
			// Killed in its reset after the removal: the GPU may be left
			// removed, out of NVML's view. Not reset, not probed, not
			// forgotten: out for a human, saying why.
			name:  "found resetting and not on the node: out for a human, kept though absent",
			saved: `{"gpus": [{"uuid": "GPU-gone", "state": "resetting", "decision": "reset", "reason": "xid=48", "resets": ["2026-11-27T05:59:00Z"]}]}`,
			start: []string{"GPU-gone resetting->needsHuman", "needsHuman GPU-gone", "note GPU-gone"},
			steps: []step{
				{probeDone(time.Minute, "GPU-gone", nil), []string{"note GPU-gone"}},
				{release(time.Hour, "GPU-gone"), []string{"note GPU-gone"}},
			},
		},
		{
			name:  "a peer held for a leader no longer leading is given back",
			saved: `{"gpus": [{"uuid": "GPU-b", "state": "draining", "decision": "withPeer", "heldFor": "GPU-a", "started": "2026-11-27T05:00:00Z"}]}`,
			start: []string{"withhold GPU-b", "giveBack GPU-b", "GPU-b draining->serving"},
			end:   map[string]want{gpuB: {StateServing, "", 0}},
		},
	} {
		t.Run(c.name, c.run)
	}
}

// The absent GPU stays listed until released.
func TestAbsentIsListed(t *testing.T) {
	var s Saved
	if err := json.Unmarshal([]byte(`{"gpus": [{"uuid": "GPU-lost", "state": "needsReboot", "reason": "xid=79"}]}`), &s); err != nil {
		t.Fatal(err)
	}
	m, _, err := New(DefaultPolicy(), plainNode(), s, t0)
	if err != nil {
		t.Fatal(err)
	}
	st := m.Status()
	if last := st[len(st)-1]; len(st) != 5 || last.GPU != "GPU-lost" || !last.Absent || last.State != StateNeedsReboot {
		t.Fatalf("status %+v", st)
	}
	if got := m.Save().GPUs; len(got) != 1 || got[0].UUID != "GPU-lost" {
		t.Errorf("saved %+v", got)
	}
	m.Release("GPU-lost", t0)
	if len(m.Status()) != 4 || len(m.Save().GPUs) != 0 {
		t.Errorf("after release: %+v", m.Status())
	}

	// One found resetting is kept too, out for a human, with why.
	if err := json.Unmarshal([]byte(`{"gpus": [{"uuid": "GPU-gone", "state": "resetting", "decision": "reset", "reason": "xid=48", "resets": ["2026-11-27T05:59:00Z"]}]}`), &s); err != nil {
		t.Fatal(err)
	}
	if m, _, err = New(DefaultPolicy(), plainNode(), s, t0); err != nil {
		t.Fatal(err)
	}
	st = m.Status()
	if last := st[len(st)-1]; len(st) != 5 || last.GPU != "GPU-gone" || !last.Absent || last.State != StateNeedsHuman || last.Resets != 1 ||
		!strings.Contains(last.Reason, "not on the node") || !strings.Contains(last.Reason, "xid=48") {
		t.Fatalf("status %+v", st)
	}
	if got := m.Save().GPUs; len(got) != 1 || got[0].UUID != "GPU-gone" || got[0].State != StateNeedsHuman {
		t.Errorf("saved %+v", got)
	}
}

// goldenMachine is a node in every kind of saved state: A resetting with
// B, its Volta NVLink peer; C out for a human; D serving with a reset in
// the window.
func goldenMachine(t *testing.T) *Machine {
	t.Helper()
	p := DefaultPolicy()
	p.ResetPeers = true
	node := pairNode("volta", "7.0", true, FabricManagerRunning)
	m, _, err := New(p, node, Saved{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	m.Fault(gpuD, Facts{Action: nvml.RecoveryReset}, at(0))
	m.Usage(gpuD, Usage{}, at(time.Second))
	m.ResetDone(gpuD, nil, at(2*time.Second))
	m.ProbeDone(gpuD, nil, at(3*time.Second))
	m.Fault(gpuC, Facts{RowRemapFailure: true}, at(time.Minute))
	m.Fault(gpuA, Facts{XIDs: []uint64{48}}, at(time.Hour))
	for _, id := range m.order {
		m.Usage(id, Usage{}, at(time.Hour+time.Second))
	}
	return m
}

// testdata/saved.json pins the format on disk: what this release writes,
// and what the next must read.
func TestSavedGolden(t *testing.T) {
	got, err := json.MarshalIndent(goldenMachine(t).Save(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "saved.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Save wrote\n%s\nwant (testdata/saved.json; -update rewrites it)\n%s", got, want)
	}
	// Read back, it is the same machine.
	var s Saved
	if err := json.Unmarshal(want, &s); err != nil {
		t.Fatal(err)
	}
	p := DefaultPolicy()
	p.ResetPeers = true
	m, cmds, err := New(p, pairNode("volta", "7.0", true, FabricManagerRunning), s, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"withhold GPU-a", "note GPU-a", "GPU-a resetting->probing", "probe GPU-a", "withhold GPU-b", "note GPU-b", "GPU-b resetting->probing", "probe GPU-b", "withhold GPU-c", "needsHuman GPU-c"}; !slices.Equal(brief(cmds), want) {
		t.Errorf("restored with %v, want %v", brief(cmds), want)
	}
	if st, _ := m.StatusOf(gpuD); st.State != StateServing || st.Resets != 1 {
		t.Errorf("D restored as %+v", st)
	}
}

// A file a newer release wrote: keys this release does not know, at the
// top and on a GPU, come back when it is written again.
func TestSavedKeepsUnknownKeys(t *testing.T) {
	newer := `{
  "gpus": [
    {"uuid": "GPU-c", "state": "needsHuman", "decision": "human", "reason": "row-remap-failure", "since": "2026-11-27T06:01:00Z", "ticket": {"id": "RMA-42"}, "rmaPending": true}
  ],
  "writtenBy": "v9.0.0",
  "nodeDrain": {"since": "2026-11-27T06:00:00Z"}
}`
	var s Saved
	if err := json.Unmarshal([]byte(newer), &s); err != nil {
		t.Fatal(err)
	}
	m, _, err := New(DefaultPolicy(), plainNode(), s, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(m.Save())
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(newer), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wrote back\n%s\nwant\n%s", out, newer)
	}
}

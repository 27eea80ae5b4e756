package remedy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

var t0 = time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)

const (
	gpuA = "GPU-a"
	gpuB = "GPU-b"
	gpuC = "GPU-c"
	// gpuD is in every test node and named by no event: nothing may
	// change for it.
	gpuD = "GPU-d"
)

// event is one call into the Machine at t0+at.
type event struct {
	at   time.Duration
	name string
	do   func(m *Machine, now time.Time) []Command
}

func fault(at time.Duration, gpu string, f Facts) event {
	return event{at, "fault " + gpu, func(m *Machine, now time.Time) []Command { return m.Fault(gpu, f, now) }}
}

func healthy(at time.Duration, gpu string) event {
	return event{at, "healthy " + gpu, func(m *Machine, now time.Time) []Command { return m.Healthy(gpu, now) }}
}

func usage(at time.Duration, gpu string, holders, procs int, mps bool) event {
	return event{at, fmt.Sprintf("usage %s %d/%d/%v", gpu, holders, procs, mps), func(m *Machine, now time.Time) []Command {
		return m.Usage(gpu, Usage{Holders: holders, Processes: procs, MPSRunning: mps}, now)
	}}
}

// idle reports every GPU of the test node idle.
func idle(at time.Duration) event {
	return event{at, "all idle", func(m *Machine, now time.Time) []Command {
		var out []Command
		for _, id := range m.order {
			out = append(out, m.Usage(id, Usage{}, now)...)
		}
		return out
	}}
}

func resetDone(at time.Duration, gpu string, err error) event {
	return event{at, "resetDone " + gpu, func(m *Machine, now time.Time) []Command { return m.ResetDone(gpu, err, now) }}
}

func probeDone(at time.Duration, gpu string, err error) event {
	return event{at, "probeDone " + gpu, func(m *Machine, now time.Time) []Command { return m.ProbeDone(gpu, err, now) }}
}

func tick(at time.Duration) event {
	return event{at, "tick", func(m *Machine, now time.Time) []Command { return m.Tick(now) }}
}

func release(at time.Duration, gpu string) event {
	return event{at, "release " + gpu, func(m *Machine, now time.Time) []Command { return m.Release(gpu, now) }}
}

// step is an event and the commands it must return, in brief; nil wants
// any.
type step struct {
	ev   event
	want []string
}

// brief is a command as the tests compare it: its kind, GPUs and, for a
// transition, its states.
func brief(cs []Command) []string {
	out := []string{}
	for _, c := range cs {
		switch c.Kind {
		case CmdTransition:
			out = append(out, fmt.Sprintf("%s %s->%s", c.GPU, c.From, c.To))
		case CmdReset:
			out = append(out, "reset "+strings.Join(c.GPUs, ","))
		default:
			out = append(out, string(c.Kind)+" "+c.GPU)
		}
	}
	return out
}

func hopper(uuid string) GPU {
	return GPU{UUID: uuid, Architecture: "hopper", ComputeCapability: "9.0"}
}

// plainNode is four Hopper GPUs without NVLinks.
func plainNode() Node {
	return Node{GPUs: []GPU{hopper(gpuA), hopper(gpuB), hopper(gpuC), hopper(gpuD)}}
}

// pairNode joins A and B by NVLink, of arch (compute capability cc), on
// NVSwitch or not; C and D stand apart.
func pairNode(arch, cc string, nvswitch bool, fm FabricManager) Node {
	a := GPU{UUID: gpuA, Architecture: arch, ComputeCapability: cc, NVLinkPeers: []string{gpuB}, NVSwitch: nvswitch}
	b := GPU{UUID: gpuB, Architecture: arch, ComputeCapability: cc, NVLinkPeers: []string{gpuA}, NVSwitch: nvswitch}
	return Node{GPUs: []GPU{a, b, hopper(gpuC), hopper(gpuD)}, FabricManager: fm}
}

type want struct {
	state  State
	reason string // a part of Reason or Waiting
	resets int
}

type machineCase struct {
	name   string
	policy func(*Policy)
	node   *Node
	saved  string
	// start is what New must return, in brief; nil wants any.
	start []string
	steps []step
	end   map[string]want
}

func (c machineCase) run(t *testing.T) {
	t.Helper()
	p := DefaultPolicy()
	if c.policy != nil {
		c.policy(&p)
	}
	node := plainNode()
	if c.node != nil {
		node = *c.node
	}
	var saved Saved
	if c.saved != "" {
		if err := json.Unmarshal([]byte(c.saved), &saved); err != nil {
			t.Fatal(err)
		}
	}
	m, cmds, err := New(p, node, saved, t0)
	if err != nil {
		t.Fatal(err)
	}
	var all []Command
	check := func(what string, got []Command, want []string) {
		t.Helper()
		all = append(all, got...)
		if want != nil && !slices.Equal(brief(got), want) {
			t.Errorf("%s returned\n  %s\nwant\n  %s\n(in full: %v)", what, strings.Join(brief(got), "\n  "), strings.Join(want, "\n  "), got)
		}
	}
	check("New", cmds, c.start)
	for _, s := range c.steps {
		check(s.ev.name+fmt.Sprintf(" at +%s", s.ev.at), s.ev.do(m, t0.Add(s.ev.at)), s.want)
	}
	for gpu, w := range c.end {
		st, ok := m.StatusOf(gpu)
		if !ok {
			t.Errorf("%s: no status", gpu)
			continue
		}
		if st.State != w.state || st.Resets != w.resets || !strings.Contains(st.Reason+" | "+st.Waiting, w.reason) {
			t.Errorf("%s ends %s with %d resets, reason %q, waiting %q; want %s, %d resets, a reason with %q", gpu, st.State, st.Resets, st.Reason, st.Waiting, w.state, w.resets, w.reason)
		}
		if st.State.IsWithheld() != m.Withheld(gpu) {
			t.Errorf("%s: Withheld disagrees with its state %s", gpu, st.State)
		}
	}
	// Nothing about a GPU that no event named, and that is no peer of
	// one, ever changes.
	for _, c := range all {
		if c.GPU == gpuD || slices.Contains(c.GPUs, gpuD) {
			t.Errorf("a command about %s, which nothing concerns: %v", gpuD, c)
		}
	}
	if st, _ := m.StatusOf(gpuD); st.State != StateServing || st.Reason != "" {
		t.Errorf("%s changed: %+v", gpuD, st)
	}
}

var (
	resetFacts = Facts{Action: nvml.RecoveryReset}
	xid48      = Facts{XIDs: []uint64{48}}
)

// cycle is a whole healthy remediation of gpu from its fault at at.
func cycle(at time.Duration, gpu string) []step {
	return []step{
		{fault(at, gpu, resetFacts), []string{"withhold " + gpu, gpu + " serving->draining"}},
		{usage(at+time.Second, gpu, 0, 0, false), []string{gpu + " draining->resetting", "reset " + gpu}},
		{resetDone(at+2*time.Second, gpu, nil), []string{gpu + " resetting->probing", "probe " + gpu}},
		{probeDone(at+3*time.Second, gpu, nil), []string{"giveBack " + gpu, gpu + " probing->serving"}},
	}
}

func TestDecisions(t *testing.T) {
	for _, c := range []machineCase{
		{
			name:  "recovery action reset: drained, reset when idle, probed, given back",
			steps: cycle(0, gpuA),
			end:   map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			name: "recovery action drain-and-reset is a reset",
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryDrainAndReset}), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "drain the GPU's peer-to-peer traffic and reset", 1}},
		},
		{
			name: "recovery action drain: withheld until the driver is done, probed, given back, never reset",
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryDrainP2P}), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->waitingIdle"}},
				{fault(time.Minute, gpuA, Facts{}), []string{"GPU-a waitingIdle->probing", "probe GPU-a"}},
				{probeDone(2*time.Minute, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 0}},
		},
		{
			name: "recovery action reboot: the node needs one",
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryReboot}), []string{"withhold GPU-a", "GPU-a serving->needsReboot", "nodeReboot GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsReboot, "the driver asks for a node reboot", 0}},
		},
		{
			name:   "reboot with cordon allowed",
			policy: func(p *Policy) { p.Cordon = true },
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryReboot}), []string{"withhold GPU-a", "GPU-a serving->needsReboot", "nodeReboot GPU-a", "cordon GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsReboot, "reboot", 0}},
		},
		{
			name: "recovery action IMEX domain: for a human",
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryIMEXDomain}), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsHuman, "IMEX", 0}},
		},
		{
			name: "recovery action none: watched while health holds it, then serving",
			steps: []step{
				{fault(0, gpuA, Facts{Health: "thermal=91C>=slowdown 90C"}), []string{"GPU-a serving->watching"}},
				{healthy(time.Minute, gpuA), []string{"GPU-a watching->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 0}},
		},
		{
			name:  "xid 48 (double-bit ECC) is cleared by a reset",
			steps: []step{{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}}},
			end:   map[string]want{gpuA: {StateDraining, "xid=48: double-bit ECC", 0}},
		},
		{
			name:  "xid 79 (fallen off the bus) needs a reboot",
			steps: []step{{fault(0, gpuA, Facts{XIDs: []uint64{79}}), []string{"withhold GPU-a", "GPU-a serving->needsReboot", "nodeReboot GPU-a"}}},
			end:   map[string]want{gpuA: {StateNeedsReboot, "xid=79: fallen off the bus", 0}},
		},
		{
			name:  "xid 64 (remap not recorded) is for a human",
			steps: []step{{fault(0, gpuA, Facts{XIDs: []uint64{64}}), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}}},
			end:   map[string]want{gpuA: {StateNeedsHuman, "xid=64", 0}},
		},
		{
			name:  "an XID not in the table is left to health",
			steps: []step{{fault(0, gpuA, Facts{XIDs: []uint64{13}, Health: "xid=13"}), []string{"GPU-a serving->watching"}}},
			end:   map[string]want{gpuA: {StateWatching, "xid=13", 0}},
		},
		{
			name:  "the worst fact wins and every reason is named",
			steps: []step{{fault(0, gpuA, Facts{XIDs: []uint64{48, 79}, RowRemapPending: true}), nil}},
			end:   map[string]want{gpuA: {StateNeedsReboot, "xid=79: fallen off the bus: NVML cannot reach the GPU to reset it; row-remap-pending", 0}},
		},
		{
			name:  "row remap pending: a reset applies it",
			steps: []step{{fault(0, gpuA, Facts{RowRemapPending: true}), []string{"withhold GPU-a", "GPU-a serving->draining"}}},
			end:   map[string]want{gpuA: {StateDraining, "row-remap-pending", 0}},
		},
		{
			name:  "row remap failure: for a human",
			steps: []step{{fault(0, gpuA, Facts{RowRemapFailure: true, RowRemapPending: true}), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}}},
			end:   map[string]want{gpuA: {StateNeedsHuman, "row-remap-failure", 0}},
		},
		{
			name:  "a GPU lost from NVML needs a reboot",
			steps: []step{{fault(0, gpuA, Facts{Lost: true}), []string{"withhold GPU-a", "GPU-a serving->needsReboot", "nodeReboot GPU-a"}}},
			end:   map[string]want{gpuA: {StateNeedsReboot, "gpu-lost", 0}},
		},
		{
			name:   "resets off: a GPU that needs one is only watched",
			policy: func(p *Policy) { p.Reset = false },
			steps:  []step{{fault(0, gpuA, resetFacts), []string{"GPU-a serving->watching"}}},
			end:    map[string]want{gpuA: {StateWatching, "automatic resets are off", 0}},
		},
	} {
		t.Run(c.name, c.run)
	}
}

func TestLifecycle(t *testing.T) {
	errReset := errors.New("NVML: in use by another client")
	errProbe := errors.New("CUDA probe: vector add mismatch")
	budget := func(p *Policy) { p.MaxResets = 2 }
	for _, c := range []machineCase{
		{
			name:   "a spent budget is for a human",
			policy: budget,
			steps: append(append(cycle(0, gpuA), cycle(time.Hour, gpuA)...),
				step{fault(2*time.Hour, gpuA, resetFacts), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}}),
			end: map[string]want{gpuA: {StateNeedsHuman, "reset budget is spent: 2 resets in the last 24h0m0s", 2}},
		},
		{
			name:   "resets leave the budget after the window",
			policy: budget,
			steps: append(append(append(cycle(0, gpuA), cycle(time.Hour, gpuA)...),
				step{tick(25 * time.Hour), []string{}}),
				cycle(25*time.Hour, gpuA)...),
			end: map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			name: "a failed reset is for a human",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1],
				{resetDone(time.Minute, gpuA, errReset), []string{"GPU-a resetting->needsHuman", "needsHuman GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsHuman, "the reset failed: NVML: in use by another client", 1}},
		},
		{
			name: "a failed probe is for a human",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1], cycle(0, gpuA)[2],
				{probeDone(time.Minute, gpuA, errProbe), []string{"GPU-a probing->needsHuman", "needsHuman GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsHuman, "the probe failed: CUDA probe", 1}},
		},
		{
			name: "a human's release gives it back and clears the budget",
			steps: []step{
				{fault(0, gpuA, Facts{RowRemapFailure: true}), nil},
				{release(time.Hour, gpuA), []string{"giveBack GPU-a", "GPU-a needsHuman->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 0}},
		},
		{
			name: "an XID while resetting: no second reset, the probe judges",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1],
				{fault(1500*time.Millisecond, gpuA, xid48), []string{"note GPU-a"}},
				{resetDone(2*time.Second, gpuA, nil), []string{"GPU-a resetting->probing", "probe GPU-a"}},
				{probeDone(3*time.Second, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			// The health watcher tells the Facts again whenever they change
			// (here the recovery action the reset cleared), with no new XID:
			// the XID the reset addressed is no fault while probing.
			name: "an XID held from before the reset, facts changing while probing: no second reset",
			steps: []step{
				{fault(0, gpuA, Facts{Action: nvml.RecoveryReset, XIDs: []uint64{94}}), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
				{fault(1500*time.Millisecond, gpuA, Facts{Action: nvml.RecoveryDrainAndReset, XIDs: []uint64{48}}), []string{"note GPU-a"}},
				{resetDone(2*time.Second, gpuA, nil), []string{"GPU-a resetting->probing", "probe GPU-a"}},
				{fault(2500*time.Millisecond, gpuA, Facts{Health: "xid=48, xid=94"}), []string{"note GPU-a"}},
				{probeDone(3*time.Second, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			// NVML answers GPU_IS_LOST for the GPU the reset removed, until
			// it is rediscovered and looked up anew; health may read that
			// and tell it, even once the reset is done.
			name: "lost while resetting and probing, the reset's own doing: the probe judges, no reboot",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1],
				{fault(1500*time.Millisecond, gpuA, Facts{Action: nvml.RecoveryReset, Lost: true}), []string{"note GPU-a"}},
				{resetDone(2*time.Second, gpuA, nil), []string{"GPU-a resetting->probing", "probe GPU-a"}},
				{fault(2500*time.Millisecond, gpuA, Facts{Lost: true}), []string{"note GPU-a"}},
				{probeDone(3*time.Second, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 1}},
		},
		{
			name: "xid 79 while resetting: a reboot once the reset ends",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1],
				{fault(1500*time.Millisecond, gpuA, Facts{XIDs: []uint64{79}}), []string{"note GPU-a"}},
				{resetDone(2*time.Second, gpuA, nil), []string{"GPU-a resetting->needsReboot", "nodeReboot GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsReboot, "xid=79", 1}},
		},
		{
			name: "a fault while probing: reset again, not given back",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1], cycle(0, gpuA)[2],
				{fault(2500*time.Millisecond, gpuA, xid48), []string{"note GPU-a"}},
				{probeDone(3*time.Second, gpuA, nil), []string{"GPU-a probing->draining", "GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 2}},
		},
		{
			name: "healthy mid-remediation does not give the GPU back early",
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{usage(time.Second, gpuA, 1, 1, false), []string{}},
				{healthy(time.Minute, gpuA), []string{}},
				{usage(time.Hour, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "xid=48", 1}},
		},
		{
			name: "eviction off: holders are waited for",
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{usage(time.Second, gpuA, 2, 2, false), []string{}},
				{tick(48 * time.Hour), []string{}},
			},
			end: map[string]want{gpuA: {StateDraining, "2 holder(s) on GPU-a; eviction is off", 0}},
		},
		{
			name:   "eviction on: only after the grace period, once",
			policy: func(p *Policy) { p.Evict, p.GracePeriod = true, 10*time.Minute },
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{usage(time.Second, gpuA, 1, 1, false), []string{}},
				{tick(5 * time.Minute), []string{}},
				{tick(10 * time.Minute), []string{"evict GPU-a"}},
				{tick(20 * time.Minute), []string{}},
				{usage(21*time.Minute, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}},
		},
		{
			name: "MPS is stopped before the reset",
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{usage(time.Second, gpuA, 0, 1, true), []string{"stopMPS GPU-a", "GPU-a draining->waitingIdle"}},
				{usage(2*time.Second, gpuA, 0, 0, true), []string{}},
				{usage(3*time.Second, gpuA, 0, 0, false), []string{"GPU-a waitingIdle->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}},
		},
		{
			name: "processes with no pod are waited for",
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{usage(time.Second, gpuA, 0, 3, false), []string{"GPU-a draining->waitingIdle"}},
			},
			end: map[string]want{gpuA: {StateWaitingIdle, "3 process(es) on GPU-a with no pod holding it", 0}},
		},
		{
			name: "a release is refused while resetting",
			steps: []step{
				cycle(0, gpuA)[0], cycle(0, gpuA)[1],
				{release(time.Minute, gpuA), []string{"note GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}},
		},
		{
			name: "two GPUs heal apart",
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{fault(0, gpuB, Facts{Lost: true}), []string{"withhold GPU-b", "GPU-b serving->needsReboot", "nodeReboot GPU-b"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}, gpuB: {StateNeedsReboot, "gpu-lost", 0}, gpuC: {StateServing, "", 0}},
		},
	} {
		t.Run(c.name, c.run)
	}
}

func TestPeers(t *testing.T) {
	peersOn := func(p *Policy) { p.ResetPeers = true }
	volta := pairNode("volta", "7.0", true, FabricManagerRunning)
	ampereFM := pairNode("ampere", "8.0", true, FabricManagerRunning)
	ampereNoFM := pairNode("ampere", "8.0", true, FabricManagerUnknown)
	ampereDirect := pairNode("ampere", "8.0", false, FabricManagerUnknown)
	hopperSwitch := pairNode("hopper", "9.0", true, FabricManagerNotRunning)
	// A Volta GPU whose NVLink peer is an Ampere: A's reset must include
	// B, B's need not include A.
	mixed := pairNode("volta", "7.0", false, FabricManagerUnknown)
	mixed.GPUs[1].Architecture, mixed.GPUs[1].ComputeCapability = "ampere", "8.0"
	alone := func(n Node, name string) machineCase {
		return machineCase{
			name: name,
			node: &n,
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{"GPU-a draining->resetting", "reset GPU-a"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}, gpuB: {StateServing, "", 0}},
		}
	}
	for _, c := range []machineCase{
		{
			name: "before Ampere, peers off: out for a human, the peer untouched",
			node: &volta,
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}},
				{idle(time.Second), []string{}},
			},
			end: map[string]want{gpuA: {StateNeedsHuman, "must include its NVLink peers GPU-b (GPU-a: volta (7.0) is older than Ampere", 0}, gpuB: {StateServing, "", 0}},
		},
		{
			name:   "before Ampere, peers on: drained and reset together, each probed and given back",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining", "withhold GPU-b", "GPU-b serving->draining"}},
				{usage(time.Second, gpuA, 0, 0, false), []string{}},
				{usage(time.Second, gpuB, 1, 1, false), []string{}},
				{usage(time.Second, gpuC, 0, 0, false), []string{}},
				{usage(time.Second, gpuD, 0, 0, false), nil},
				{usage(time.Minute, gpuB, 0, 0, false), []string{"GPU-a draining->resetting", "GPU-b draining->resetting", "reset GPU-a,GPU-b"}},
				{resetDone(2*time.Minute, gpuB, nil), []string{"GPU-a resetting->probing", "probe GPU-a", "GPU-b resetting->probing", "probe GPU-b"}},
				{probeDone(3*time.Minute, gpuB, nil), []string{"giveBack GPU-b", "GPU-b probing->serving"}},
				{probeDone(3*time.Minute, gpuA, nil), []string{"giveBack GPU-a", "GPU-a probing->serving"}},
			},
			end: map[string]want{gpuA: {StateServing, "", 1}, gpuB: {StateServing, "", 0}},
		},
		{
			name:   "a group reset waits until no GPU of the node runs a compute process",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{usage(time.Second, gpuA, 0, 0, false), []string{}},
				{usage(time.Second, gpuB, 0, 0, false), []string{"GPU-a draining->waitingIdle", "GPU-b draining->waitingIdle"}},
				{usage(time.Second, gpuC, 1, 2, false), []string{}},
			},
			end: map[string]want{gpuA: {StateWaitingIdle, "no GPU of the node runs a compute process: 2 process(es) on GPU-c, no usage report since GPU-a was withheld for GPU-d", 0}, gpuC: {StateServing, "", 0}},
		},
		{
			name:   "a peer's own fault joins the group reset and counts for it",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{fault(time.Second, gpuB, Facts{XIDs: []uint64{74}}), []string{}},
				{idle(time.Minute), []string{"GPU-a draining->waitingIdle", "GPU-b draining->waitingIdle", "GPU-a waitingIdle->resetting", "GPU-b waitingIdle->resetting", "reset GPU-a,GPU-b"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}, gpuB: {StateResetting, "xid=74", 1}},
		},
		{
			name:   "a peer out for a human blocks the group reset",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuB, Facts{RowRemapFailure: true}), nil},
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{idle(time.Minute), []string{}},
			},
			end: map[string]want{gpuA: {StateDraining, "waiting: NVLink peer GPU-b is needsHuman", 0}, gpuB: {StateNeedsHuman, "row-remap-failure", 0}},
		},
		{
			name:   "a peer held for a reset that ends early is given back",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{fault(time.Minute, gpuA, Facts{Lost: true}), []string{"GPU-a draining->needsReboot", "nodeReboot GPU-a", "giveBack GPU-b", "GPU-b draining->serving"}},
			},
			end: map[string]want{gpuA: {StateNeedsReboot, "gpu-lost", 0}, gpuB: {StateServing, "", 0}},
		},
		{
			name:   "a group takes in a peer already draining alone",
			policy: peersOn,
			node:   &mixed,
			steps: []step{
				{fault(0, gpuB, xid48), []string{"withhold GPU-b", "GPU-b serving->draining"}},
				{usage(time.Second, gpuB, 1, 1, false), []string{}},
				{fault(time.Minute, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->draining"}},
				{idle(2 * time.Minute), []string{"GPU-a draining->waitingIdle", "GPU-b draining->waitingIdle", "GPU-a waitingIdle->resetting", "GPU-b waitingIdle->resetting", "reset GPU-a,GPU-b"}},
			},
			end: map[string]want{gpuA: {StateResetting, "", 1}, gpuB: {StateResetting, "", 1}},
		},
		{
			name:   "a peer with a drain of its own, held for a reset that ends early, drains alone",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{fault(time.Second, gpuB, Facts{Action: nvml.RecoveryDrainP2P}), []string{}},
				{fault(time.Minute, gpuA, Facts{Lost: true}), []string{"GPU-a draining->needsReboot", "nodeReboot GPU-a"}},
				{usage(2*time.Minute, gpuB, 0, 0, false), []string{"GPU-b draining->waitingIdle"}},
				{fault(3*time.Minute, gpuB, Facts{}), []string{"GPU-b waitingIdle->probing", "probe GPU-b"}},
			},
			end: map[string]want{gpuA: {StateNeedsReboot, "gpu-lost", 0}, gpuB: {StateProbing, "drain", 0}},
		},
		{
			name:   "a peer held for a reset cannot be released alone",
			policy: peersOn,
			node:   &volta,
			steps: []step{
				{fault(0, gpuA, xid48), nil},
				{release(time.Minute, gpuB), []string{"note GPU-b"}},
			},
			end: map[string]want{gpuB: {StateDraining, "held for the reset of its NVLink peer GPU-a", 0}},
		},
		alone(ampereFM, "Ampere on NVSwitch with Fabric Manager: reset alone"),
		alone(ampereDirect, "Ampere with direct NVLinks: reset alone"),
		alone(hopperSwitch, "Hopper on NVSwitch without Fabric Manager: reset alone"),
		{
			name: "Ampere on NVSwitch, Fabric Manager unknown: taken as not running",
			node: &ampereNoFM,
			steps: []step{
				{fault(0, gpuA, xid48), []string{"withhold GPU-a", "GPU-a serving->needsHuman", "needsHuman GPU-a"}},
			},
			end: map[string]want{gpuA: {StateNeedsHuman, "Fabric Manager's state unknown", 0}, gpuB: {StateServing, "", 0}},
		},
	} {
		t.Run(c.name, c.run)
	}
}

func TestResetAlone(t *testing.T) {
	peer := []string{"GPU-x"}
	for _, c := range []struct {
		name  string
		g     GPU
		fm    FabricManager
		alone bool
	}{
		{"no NVLink", GPU{ComputeCapability: "7.0"}, FabricManagerUnknown, true},
		{"volta, direct", GPU{Architecture: "volta", NVLinkPeers: peer}, FabricManagerUnknown, false},
		{"volta, NVSwitch, FM running", GPU{ComputeCapability: "7.0", NVLinkPeers: peer, NVSwitch: true}, FabricManagerRunning, false},
		{"unknown architecture", GPU{NVLinkPeers: peer}, FabricManagerRunning, false},
		{"ampere, direct", GPU{ComputeCapability: "8.0", NVLinkPeers: peer}, FabricManagerNotRunning, true},
		{"ampere, NVSwitch, FM running", GPU{ComputeCapability: "8.0", NVLinkPeers: peer, NVSwitch: true}, FabricManagerRunning, true},
		{"ampere, NVSwitch, FM not running", GPU{ComputeCapability: "8.0", NVLinkPeers: peer, NVSwitch: true}, FabricManagerNotRunning, false},
		{"ampere, NVSwitch, FM unknown", GPU{Architecture: "ampere", NVLinkPeers: peer, NVSwitch: true}, FabricManagerUnknown, false},
		{"hopper, NVSwitch, FM not running", GPU{ComputeCapability: "9.0", NVLinkPeers: peer, NVSwitch: true}, FabricManagerNotRunning, true},
		{"blackwell, NVSwitch", GPU{Architecture: "blackwell", NVLinkPeers: peer, NVSwitch: true}, FabricManagerUnknown, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			alone, why := ResetAlone(c.g, c.fm)
			if alone != c.alone || why == "" {
				t.Errorf("ResetAlone = %v, %q; want %v with a reason", alone, why, c.alone)
			}
		})
	}
}

// A chain A-B-C of Volta GPUs resets as one group: the rule holds for each
// GPU being reset.
func TestResetGroupIsClosed(t *testing.T) {
	v := func(id string, peers ...string) GPU {
		return GPU{UUID: id, ComputeCapability: "7.0", NVLinkPeers: peers}
	}
	p := DefaultPolicy()
	p.ResetPeers = true
	m, _, err := New(p, Node{GPUs: []GPU{v(gpuA, gpuB), v(gpuB, gpuA, gpuC), v(gpuC, gpuB), hopper(gpuD)}}, Saved{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	group, why := m.resetGroup(gpuA)
	if !slices.Equal(group, []string{gpuA, gpuB, gpuC}) || !strings.Contains(why, "GPU-b: ") {
		t.Errorf("group %v (%s)", group, why)
	}
}

func TestPolicy(t *testing.T) {
	if errs := DefaultPolicy().Validate(); errs != nil {
		t.Fatalf("the default policy: %v", errs)
	}
	p := Policy{GracePeriod: -time.Second, ResetPeers: true}
	var fields []string
	for _, err := range p.Validate() {
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("%v is not a *FieldError", err)
		}
		fields = append(fields, fe.Field)
	}
	if want := []string{"gracePeriod", "maxResets", "window", "resetPeers"}; !slices.Equal(fields, want) {
		t.Errorf("mistakes in %v, want one each in %v", fields, want)
	}
	if _, _, err := New(p, plainNode(), Saved{}, t0); err == nil || !strings.Contains(err.Error(), "maxResets: 0 must be at least 1") {
		t.Errorf("New with a bad policy: %v", err)
	}
}

func TestDiagramNamesEveryState(t *testing.T) {
	for _, s := range []State{StateServing, StateWatching, StateDraining, StateWaitingIdle, StateResetting, StateProbing, StateNeedsHuman, StateNeedsReboot} {
		if !strings.Contains(Diagram(), " "+string(s)+":") && !strings.Contains(Diagram(), "--> "+string(s)) {
			t.Errorf("the diagram does not name %s", s)
		}
	}
}

// Every row of the table is what Decide does with that fact alone.
func TestRulesAreDecide(t *testing.T) {
	for _, r := range Rules() {
		var f Facts
		if strings.HasPrefix(r.Fact, "any other") {
			if v := Decide(f); v.Decision != r.Decision {
				t.Errorf("%s: Decide says %s, the table %s", r.Fact, v.Decision, r.Decision)
			}
			continue
		}
		switch {
		case strings.HasPrefix(r.Fact, "xid="):
			var x uint64
			fmt.Sscanf(r.Fact, "xid=%d", &x)
			f.XIDs = []uint64{x}
		case r.Fact == "gpu-lost":
			f.Lost = true
		case r.Fact == "row-remap-failure":
			f.RowRemapFailure = true
		case r.Fact == "row-remap-pending":
			f.RowRemapPending = true
		case strings.HasPrefix(r.Fact, "recovery-action="):
			for _, a := range []nvml.RecoveryAction{nvml.RecoveryReset, nvml.RecoveryDrainAndReset, nvml.RecoveryDrainP2P, nvml.RecoveryReboot, nvml.RecoveryIMEXDomain} {
				if "recovery-action="+a.String() == r.Fact {
					f.Action = a
				}
			}
		}
		if v := Decide(f); v.Decision != r.Decision || !strings.Contains(v.Reason, r.Why) {
			t.Errorf("%s: Decide says %s (%s), the table %s (%s)", r.Fact, v.Decision, v.Reason, r.Decision, r.Why)
		}
	}
}

// The catalog's remedies are decisions this package knows, and Decide
// takes each XID's from the catalog: 63, which the catalog ignores, calls
// for nothing; 109, which it resets, for a reset.
func TestXIDsFromTheCatalog(t *testing.T) {
	known := []Decision{DecisionWatch, DecisionReset, DecisionHuman, DecisionReboot}
	for _, e := range xid.Catalog() {
		if !slices.Contains(known, Decision(e.Remedy)) {
			t.Errorf("XID %d: remedy %q is no decision", e.XID, e.Remedy)
		}
		if v := Decide(Facts{XIDs: []uint64{e.XID}}); v.Decision != Decision(e.Remedy) {
			t.Errorf("XID %d (%s): Decide = %s (%s), catalog %s", e.XID, e.Bucket, v.Decision, v.Reason, e.Remedy)
		}
	}
	for x, want := range map[uint64]Decision{63: DecisionWatch, 109: DecisionReset, 79: DecisionReboot, 64: DecisionHuman, 13: DecisionWatch, 9999: DecisionWatch} {
		if v := Decide(Facts{XIDs: []uint64{x}}); v.Decision != want {
			t.Errorf("xid=%d: %s (%s), want %s", x, v.Decision, v.Reason, want)
		}
	}
}

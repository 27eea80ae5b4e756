package remedy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
)

// State is where a GPU is in its remediation. Its values are
// lowerCamelCase, for list, metrics and the saved file.
type State string

// The states; Diagram draws them.
const (
	// StateServing: nothing under way; the GPU is offered if health says
	// so.
	StateServing State = "serving"
	// StateWatching: a fault this package leaves to health's rules, or a
	// reset it may not do (Policy.Reset off).
	StateWatching State = "watching"
	// StateDraining: withheld; pods still hold it (or a peer in its reset
	// group), or its usage is not known yet.
	StateDraining State = "draining"
	// StateWaitingIdle: withheld, no holder left; waiting for its
	// processes to end and its MPS daemon to stop (or, for a group reset,
	// for every GPU of the node to run no compute process).
	StateWaitingIdle State = "waitingIdle"
	// StateResetting: a Reset command is out.
	StateResetting State = "resetting"
	// StateProbing: a Probe command is out.
	StateProbing State = "probing"
	// StateNeedsHuman: out until a human acts (Machine.Release).
	StateNeedsHuman State = "needsHuman"
	// StateNeedsReboot: out; the node needs a reboot.
	StateNeedsReboot State = "needsReboot"
)

// IsWithheld reports whether a GPU in s must not be offered, whatever
// health says.
func (s State) IsWithheld() bool {
	switch s {
	case StateServing, StateWatching:
		return false
	}
	return true
}

// IsTerminal reports whether a GPU in s stays out until a human releases
// it or the node reboots.
func (s State) IsTerminal() bool { return s == StateNeedsHuman || s == StateNeedsReboot }

func (s State) terminal() bool { return s.IsTerminal() }

func (s State) waiting() bool { return s == StateDraining || s == StateWaitingIdle }

// Kind is what a Command asks for.
type Kind string

// The commands a Machine returns.
const (
	// CmdWithhold: stop offering the GPU and its shares and MIG devices
	// until CmdGiveBack. Keep its MPS daemon down once CmdStopMPS asked.
	CmdWithhold Kind = "withhold"
	// CmdEvict: evict the pods holding the GPU or any unit of it.
	CmdEvict Kind = "evict"
	// CmdStopMPS: stop the GPU's MPS control daemon.
	CmdStopMPS Kind = "stopMPS"
	// CmdReset: reset GPUs, all in one call; report with ResetDone.
	CmdReset Kind = "reset"
	// CmdProbe: check NVML reads clean, restore and compare compute mode
	// and MIG layout, run the CUDA probe; report with ProbeDone.
	CmdProbe Kind = "probe"
	// CmdGiveBack: offer the GPU again (and start its MPS daemon); Took is
	// how long it was out, for an Event and a metric.
	CmdGiveBack Kind = "giveBack"
	// CmdNeedsHuman: the GPU is out until a human acts; tell them.
	CmdNeedsHuman Kind = "needsHuman"
	// CmdNodeReboot: the node needs a reboot (the Node condition).
	CmdNodeReboot Kind = "nodeReboot"
	// CmdCordon: cordon the node (Policy.Cordon, with CmdNodeReboot).
	CmdCordon Kind = "cordon"
	// CmdTransition: the GPU went From one state To another; log it and
	// make an Event.
	CmdTransition Kind = "transition"
	// CmdNote: a line for the log that changes nothing (a saved GPU
	// dropped, an event ignored).
	CmdNote Kind = "note"
)

// Command is one thing for the caller to do or say.
type Command struct {
	Kind Kind
	// GPU is the GPU it is about; for CmdReset, the one whose fault
	// called for it.
	GPU string
	// GPUs are, for CmdReset, every GPU to reset in the same call: GPU
	// and the NVLink peers nvidia-smi's rule requires.
	GPUs   []string
	Reason string
	// Took is, for CmdGiveBack, how long the GPU was withheld.
	Took time.Duration
	// From and To are the states of a CmdTransition.
	From, To State
}

func (c Command) String() string {
	var b strings.Builder
	b.WriteString(string(c.Kind))
	if len(c.GPUs) > 1 {
		b.WriteString(" " + strings.Join(c.GPUs, ","))
	} else if c.GPU != "" {
		b.WriteString(" " + c.GPU)
	}
	if c.Kind == CmdTransition {
		fmt.Fprintf(&b, " %s->%s", c.From, c.To)
	}
	if c.Kind == CmdGiveBack {
		fmt.Fprintf(&b, " after %s", c.Took)
	}
	if c.Reason != "" {
		b.WriteString(": " + c.Reason)
	}
	return b.String()
}

// Usage is who and what uses a GPU now.
type Usage struct {
	// Holders are the containers or claims holding the GPU or any of its
	// shares or MIG devices.
	Holders int
	// Processes are the compute processes NVML lists on it, the MPS
	// server's included.
	Processes int
	// MPSRunning is whether the GPU's MPS control daemon runs.
	MPSRunning bool
}

// reported is a Usage and when it was reported. Only a report made since
// a GPU was withheld counts: one from before may miss a pod allocated
// since.
type reported struct {
	Usage
	at time.Time
}

type record struct {
	uuid     string
	state    State
	decision Decision
	// reason says why the GPU is out (or watched); waiting what it waits
	// for now.
	reason, waiting string
	since, started  time.Time
	facts           Facts // the last polled facts, with every XID held
	// group is the reset group a leader (heldFor empty) drives, and every
	// member's while resetting. heldFor is the leader of the group that
	// holds this GPU.
	group    []string
	heldFor  string
	evicted  bool
	stopSent bool
	// resets are when this GPU's own faults caused a reset, in Window.
	resets []time.Time
	// then is a terminal verdict that arrived while a reset or probe was
	// out, applied when it ends; refault a fault calling for a reset that
	// arrived while probing.
	then    Verdict
	refault bool
	absent  bool
	kept    jsonkeep.Fields
}

// Machine holds the remediation of every GPU of a node. It is not safe for
// concurrent use: one goroutine owns it, as health's Watcher.
type Machine struct {
	p     Policy
	order []string
	node  map[string]GPU
	fm    FabricManager
	recs  map[string]*record
	usage map[string]reported
	// absent are saved GPUs out for a human or a reboot that are not on
	// the node since the restart: kept, so the node still says so.
	absent []*record
	kept   jsonkeep.Fields
	now    time.Time
	out    []Command
}

// New starts a Machine for node's GPUs under p, from what Save returned
// before a restart (the zero Saved for none). Its commands re-establish
// what the saved state asked for: withhold, probe, the Node condition.
func New(p Policy, node Node, saved Saved, now time.Time) (*Machine, []Command, error) {
	if errs := p.Validate(); len(errs) > 0 {
		return nil, nil, fmt.Errorf("remedy policy: %w", errors.Join(errs...))
	}
	m := &Machine{p: p, node: map[string]GPU{}, fm: node.FabricManager, recs: map[string]*record{}, usage: map[string]reported{}, kept: saved.extra}
	for _, g := range node.GPUs {
		if _, dup := m.node[g.UUID]; dup || g.UUID == "" {
			return nil, nil, fmt.Errorf("remedy: GPU %q is listed twice or has no UUID", g.UUID)
		}
		m.order = append(m.order, g.UUID)
		m.node[g.UUID] = g
		m.recs[g.UUID] = &record{uuid: g.UUID, state: StateServing, since: now}
	}
	m.begin(now)
	for _, s := range saved.GPUs {
		m.restore(s)
	}
	return m, m.end(), nil
}

func (m *Machine) begin(now time.Time) {
	m.now, m.out = now, nil
	for _, r := range m.recs {
		r.resets = slices.DeleteFunc(r.resets, func(t time.Time) bool { return now.Sub(t) >= m.p.Window })
	}
}

func (m *Machine) end() []Command {
	m.advance()
	out := m.out
	m.out = nil
	return out
}

func (m *Machine) emit(c Command) { m.out = append(m.out, c) }

func (m *Machine) note(gpu, format string, args ...any) {
	m.emit(Command{Kind: CmdNote, GPU: gpu, Reason: fmt.Sprintf(format, args...)})
}

// Fault tells the Machine what the driver says of gpu now: its polled
// facts, and the XIDs that arrived since the last Fault.
func (m *Machine) Fault(gpu string, f Facts, now time.Time) []Command {
	m.begin(now)
	r := m.recs[gpu]
	if r == nil {
		m.note(gpu, "fault of a GPU not on the node ignored")
		return m.end()
	}
	r.facts = f.merge(r.facts.XIDs)
	v := Decide(r.facts)
	switch {
	case r.state == StateServing || r.state == StateWatching:
		m.start(r, v)
	case r.state.waiting():
		switch {
		case v.Decision.rank() >= DecisionHuman.rank():
			m.terminal(r, v)
		case v.Decision == DecisionReset && r.decision != DecisionReset:
			m.toReset(r, v)
		case v.Decision == DecisionDrain && r.decision == DecisionWithPeer:
			// Its own, should the group's reset not come.
			r.decision, r.reason = DecisionDrain, v.Reason
		}
	case r.state == StateResetting || r.state == StateProbing:
		// Judged on what f says now: its polled facts and the XIDs new in
		// it. The XIDs held from before were what the reset is for; the
		// watcher tells the facts again whenever they change (the
		// recovery action the reset cleared), and a held XID is then no
		// fault of the GPU after its reset. Nor is lost: NVML answers
		// GPU_IS_LOST for the GPU the reset removed until it is
		// rediscovered and looked up anew; whether it came back, the
		// reset's result and the probe say (a GPU still lost fails both).
		now := f
		now.Lost = false
		v := Decide(now)
		switch {
		case v.Decision.rank() >= DecisionHuman.rank():
			r.then = v
			m.note(gpu, "a fault while %s; out for a human or a reboot once that ends: %s", r.state, v.Reason)
		case v.Decision == DecisionReset && r.state == StateProbing:
			r.refault = true
			m.note(gpu, "a fault while probing; resetting again after the probe: %s", v.Reason)
		default:
			m.note(gpu, "a fault while %s; the probe judges it: %s", r.state, v.Reason)
		}
	case r.state == StateNeedsHuman && v.Decision == DecisionReboot:
		m.terminal(r, v)
	}
	return m.end()
}

// Healthy tells the Machine that health has cleared gpu by itself. A GPU
// only watched goes back to serving; one withheld stays out until it has
// been proven and given back.
func (m *Machine) Healthy(gpu string, now time.Time) []Command {
	m.begin(now)
	if r := m.recs[gpu]; r != nil {
		r.facts = Facts{XIDs: r.facts.XIDs}
		if r.state == StateWatching {
			m.serve(r, "healthy again")
		}
	}
	return m.end()
}

// Usage tells the Machine who uses gpu now. Report it for every GPU at
// each poll: a reset of GPUs together needs every GPU of the node free of
// compute processes.
func (m *Machine) Usage(gpu string, u Usage, now time.Time) []Command {
	m.begin(now)
	if _, ok := m.recs[gpu]; ok {
		m.usage[gpu] = reported{u, now}
	}
	return m.end()
}

// ResetDone reports the outcome of a CmdReset, naming any GPU it reset.
func (m *Machine) ResetDone(gpu string, err error, now time.Time) []Command {
	m.begin(now)
	r := m.recs[gpu]
	if r == nil || r.state != StateResetting {
		m.note(gpu, "reset result ignored: the GPU is not resetting")
		return m.end()
	}
	group := r.group
	if len(group) == 0 {
		group = []string{gpu}
	}
	for _, id := range group {
		p := m.recs[id]
		if p == nil || p.state != StateResetting {
			continue
		}
		p.group, p.heldFor = nil, ""
		switch {
		case err != nil:
			m.human(p, "the reset failed: "+err.Error()+" (it was out because "+p.reason+")")
		case p.then.Decision != "":
			m.terminal(p, p.then)
		default:
			m.probe(p)
		}
	}
	return m.end()
}

// ProbeDone reports the outcome of a CmdProbe.
func (m *Machine) ProbeDone(gpu string, err error, now time.Time) []Command {
	m.begin(now)
	r := m.recs[gpu]
	switch {
	case r == nil || r.state != StateProbing:
		m.note(gpu, "probe result ignored: the GPU is not probing")
	case err != nil:
		m.human(r, "the probe failed: "+err.Error()+" (it was out because "+r.reason+")")
	case r.then.Decision != "":
		m.terminal(r, r.then)
	case r.refault:
		r.refault = false
		v := Decide(r.facts)
		if v.Decision != DecisionReset {
			v = Verdict{DecisionReset, r.reason}
		}
		m.toReset(r, v)
	default:
		m.serve(r, "proven by the probe")
	}
	return m.end()
}

// Tick lets time pass: eviction after the grace period, resets leaving
// the budget's window.
func (m *Machine) Tick(now time.Time) []Command {
	m.begin(now)
	return m.end()
}

// Release is a human's word that gpu may serve again: it ends any
// remediation but a reset in flight, clears the GPU's reset budget and
// gives it back. It is the one way out of needsHuman and needsReboot
// short of a reboot. A GPU held only for its peer's reset is released with
// that peer.
func (m *Machine) Release(gpu string, now time.Time) []Command {
	m.begin(now)
	r := m.recs[gpu]
	if r == nil {
		if i := slices.IndexFunc(m.absent, func(a *record) bool { return a.uuid == gpu }); i >= 0 {
			m.absent = slices.Delete(m.absent, i, i+1)
			m.note(gpu, "released by a human; forgotten, as it is not on the node")
		} else {
			m.note(gpu, "release of a GPU not on the node ignored")
		}
		return m.end()
	}
	switch {
	case r.state == StateResetting:
		m.note(gpu, "release refused: a reset is in flight; release it once that ends")
	case r.heldFor != "":
		m.note(gpu, "release refused: it is held for the reset of its NVLink peer %s, which must include it; release that one", r.heldFor)
	default:
		r.resets = nil
		if r.state == StateServing {
			m.note(gpu, "released by a human: its reset budget is cleared")
			break
		}
		m.serve(r, "released by a human")
	}
	return m.end()
}

// Withheld reports whether gpu must not be offered, whatever health says.
func (m *Machine) Withheld(gpu string) bool {
	r := m.recs[gpu]
	return r != nil && r.state.IsWithheld()
}

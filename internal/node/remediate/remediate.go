package remediate

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// GPU is one GPU of the node as remediation knows it.
type GPU struct {
	remedy.GPU
	// Units are the device IDs its health is reported as: its UUID, or
	// its MIG devices' when it reports through them. Empty: its UUID.
	Units []string
	// Names are every name the kubelet's PodResources may know the GPU or
	// a unit of it by (device IDs under a resource, one per replica).
	Names []podresources.Names
	// DRADevice is its device name in this node's DRA pool ("gpu-3"): a
	// claim on that device or on any named "gpu-3-..." (its MIG devices,
	// placements) holds it. Empty outside DRA mode.
	DRADevice string
}

// Options configure a Service.
type Options struct {
	Policy        remedy.Policy
	GPUs          []GPU
	FabricManager remedy.FabricManager
	// UsagePoll is how often a withheld GPU's users are looked at; Tick
	// how often time passes for the Machine (grace periods, the budget's
	// window). Zero: DefaultUsagePoll, DefaultTick.
	UsagePoll, Tick time.Duration
	// Holders lists the holders of every device (PodResources); nil: who
	// holds a GPU is never known, so a withheld GPU is never reset.
	Holders func(ctx context.Context) (podresources.Holders, error)
	// Driver and Pool name this node's DRA pool, for DRADevice.
	Driver, Pool string

	Resetter Resetter
	Prober   Prober
	MPS      MPS      // nil: no MPS daemons
	Evicter  Evicter  // nil: no eviction (device-plugin mode)
	Reporter Reporter // nil: no Events, no condition
	// Cordoner cordons the Node while a GPU needs a reboot, when
	// Policy.Cordon asks (CmdCordon); nil: never cordoned.
	Cordoner Cordoner
	Metrics  Recorder // nil: none
	Store    Store    // nil: nothing kept across restarts
	Clock    Clock
	Log      *slog.Logger
}

// The defaults of Options.
const (
	DefaultUsagePoll = 5 * time.Second
	DefaultTick      = 10 * time.Second
)

// ReasonPrefix starts the health reason of a withheld GPU's units:
// "remediation: <state>: <why>".
const ReasonPrefix = "remediation: "

// Event reasons.
const (
	EventWithheld     = "GPUWithheld"
	EventResetStarted = "GPUResetStarted"
	EventGivenBack    = "GPUGivenBack"
	EventNeedsHuman   = "GPUNeedsHuman"
	EventNeedsReboot  = "GPUNeedsNodeReboot"
)

// Service owns the Machine. It is the health notifier that withholds
// (SetHealth), and takes the watcher's facts (Facts).
type Service struct {
	o    Options
	log  *slog.Logger
	gate *gate
	// byUUID are the GPUs by UUID.
	byUUID map[string]GPU

	// Run's goroutine only, after New.
	m       *remedy.Machine
	pending []remedy.Command // from New, carried out when Run starts
	health  Health
	reboot  string // the reason the node needs a reboot; "" none
	states  map[string]remedy.State
	// usageErr is why a GPU's usage is not known, for its reason.
	usageErr map[string]string
	// cordonFor are the GPUs whose CmdCordon holds, with why; cordoned
	// what the Cordoner was last told, once cordonTold.
	cordonFor            map[string]string
	cordoned, cordonTold bool
	cordonSaid           bool
	saveFailed           bool

	// facts from the watcher, to Run.
	mu    sync.Mutex
	facts []fact
	wake  chan struct{}

	results  chan result
	queries  chan chan []remedy.Status
	releases chan release
	// stopped is closed when Run returns.
	stopped chan struct{}
	wg      sync.WaitGroup
	// handled is called after each result is handled (tests).
	handled func()
}

type fact struct {
	gpu string
	f   health.Facts
}

// release is a human's release of one GPU, for Run; the reply is the
// GPU's status before it, or why it was refused.
type release struct {
	gpu   string
	reply chan released
}

type released struct {
	st  remedy.Status
	err error
}

// result is what a reset or probe in flight came back with.
type result struct {
	gpu   string
	probe bool
	err   error
}

// New restores the saved remediation (a withheld GPU is withheld at once,
// before the watcher's first report passes) and returns the service; next
// is where health goes on (the front-end's notifier).
func New(o Options, next health.Notifier) (*Service, error) {
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.UsagePoll <= 0 {
		o.UsagePoll = DefaultUsagePoll
	}
	if o.Tick <= 0 {
		o.Tick = DefaultTick
	}
	s := &Service{
		o: o, log: o.Log, byUUID: map[string]GPU{}, states: map[string]remedy.State{}, usageErr: map[string]string{}, cordonFor: map[string]string{},
		wake: make(chan struct{}, 1), results: make(chan result, len(o.GPUs)+1), queries: make(chan chan []remedy.Status),
		releases: make(chan release), stopped: make(chan struct{}),
	}
	node := remedy.Node{FabricManager: o.FabricManager}
	units := map[string][]string{}
	for _, g := range o.GPUs {
		s.byUUID[g.UUID] = g
		node.GPUs = append(node.GPUs, g.GPU)
		units[g.UUID] = g.Units
		if len(g.Units) == 0 {
			units[g.UUID] = []string{g.UUID}
		}
	}
	s.gate = newGate(next, units)
	var saved remedy.Saved
	if o.Store != nil {
		found, err := o.Store.Load(&saved)
		switch {
		case err != nil:
			s.log.Warn("reading the remediation kept from an earlier run; starting without it", "err", err)
			saved = remedy.Saved{}
		case found && len(saved.GPUs) > 0:
			s.log.Info("restoring the remediation kept from an earlier run on this boot", "gpus", len(saved.GPUs))
		}
	}
	m, cmds, err := remedy.New(o.Policy, node, saved, o.Clock.Now())
	if err != nil {
		return nil, err
	}
	s.m, s.pending = m, cmds
	if o.Holders == nil {
		s.log.Warn("remediation: who holds a GPU cannot be known without the kubelet's PodResources API (podResourcesSocket); a withheld GPU is never reset")
	}
	s.syncGate()
	return s, nil
}

// SetHealth is health.Notifier: health's word on a device passes on,
// unless its GPU is withheld.
func (s *Service) SetHealth(id string, healthy bool, reason string) bool {
	return s.gate.SetHealth(id, healthy, reason)
}

// Facts takes the health watcher's facts of a GPU (health.OnFacts); it
// never blocks.
func (s *Service) Facts(gpu string, f health.Facts) {
	s.mu.Lock()
	s.facts = append(s.facts, fact{gpu, f})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// UseHealth has a GPU given back cleared of its sticky conditions;
// called before Run.
func (s *Service) UseHealth(h Health) { s.health = h }

// Status is every GPU's remediation now, from Run's goroutine; nil once
// ctx ends or before Run.
func (s *Service) Status(ctx context.Context) []remedy.Status {
	ch := make(chan []remedy.Status, 1)
	select {
	case s.queries <- ch:
	case <-ctx.Done():
		return nil
	}
	select {
	case st := <-ch:
		return st
	case <-ctx.Done():
		return nil
	}
}

// ErrStopped is Release's error once Run has returned.
var ErrStopped = errors.New("the remediation has stopped (the plugin is shutting down)")

// Release is a human's word that gpu, out for a human or a reboot, may
// serve again: on Run's goroutine the Machine gives it back (or forgets
// it, when it is no longer on the node) and the state is saved. It
// returns the GPU's status before the release. A GPU in another state is
// refused with remedy's *NotTerminalError, one the node does not know
// with remedy.ErrUnknownGPU; ErrStopped after Run, or ctx's error.
func (s *Service) Release(ctx context.Context, gpu string) (remedy.Status, error) {
	q := release{gpu: gpu, reply: make(chan released, 1)}
	select {
	case s.releases <- q:
	case <-s.stopped:
		return remedy.Status{}, ErrStopped
	case <-ctx.Done():
		return remedy.Status{}, ctx.Err()
	}
	select {
	case a := <-q.reply:
		return a.st, a.err
	case <-ctx.Done():
		return remedy.Status{}, ctx.Err()
	}
}

// Run carries out the remediation until ctx ends; a reset or probe in
// flight is cancelled and waited for.
func (s *Service) Run(ctx context.Context) {
	defer close(s.stopped)
	defer s.wg.Wait()
	pending := s.pending
	s.pending = nil
	for _, st := range s.m.Status() {
		s.record(st.GPU, st.State)
	}
	// Saved first, as every command is: what restoring changed (a GPU
	// found resetting and gone, out for a human now) is on disk.
	s.handle(ctx, pending)
	// Told at once, reboot or not: after the reboot (a new boot starts
	// with no saved state), a cordon of ours is lifted.
	s.syncCordon()
	tick := s.o.Clock.After(s.o.Tick)
	var poll <-chan time.Time
	for {
		if s.waiting() {
			if poll == nil {
				poll = s.o.Clock.After(s.o.UsagePoll)
			}
		} else {
			poll = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			s.takeFacts(ctx)
		case r := <-s.results:
			if ctx.Err() != nil {
				// Cut short by the plugin's shutdown, the reset or probe
				// says nothing of the GPU: the state saved before it
				// (resetting, probing) has the next start probe it.
				return
			}
			now := s.o.Clock.Now()
			if r.probe {
				s.handle(ctx, s.m.ProbeDone(r.gpu, r.err, now))
			} else {
				s.handle(ctx, s.m.ResetDone(r.gpu, r.err, now))
			}
			if s.handled != nil {
				s.handled()
			}
		case <-tick:
			tick = s.o.Clock.After(s.o.Tick)
			s.handle(ctx, s.m.Tick(s.o.Clock.Now()))
		case <-poll:
			poll = nil
			s.pollUsage(ctx)
		case q := <-s.queries:
			// Facts given before the question are answered for.
			s.takeFacts(ctx)
			q <- s.m.Status()
		case q := <-s.releases:
			s.takeFacts(ctx)
			q.reply <- s.release(ctx, q.gpu)
		}
	}
}

func (s *Service) release(ctx context.Context, gpu string) released {
	st, err := s.m.Releasable(gpu)
	if err != nil {
		s.log.Info("a human's release refused", "gpu", gpu, "err", err)
		return released{st, err}
	}
	s.log.Warn("released by a human", "gpu", gpu, "state", string(st.State), "reason", st.Reason)
	s.handle(ctx, s.m.Release(gpu, s.o.Clock.Now()))
	return released{st, nil}
}

func (s *Service) takeFacts(ctx context.Context) {
	s.mu.Lock()
	facts := s.facts
	s.facts = nil
	s.mu.Unlock()
	for _, f := range facts {
		s.fact(ctx, f)
	}
}

func (s *Service) fact(ctx context.Context, f fact) {
	now := s.o.Clock.Now()
	h := f.f
	if h.Healthy && len(h.XIDs) == 0 && !h.Lost && !h.RowRemapFailure && !h.RowRemapPending && h.Action == 0 {
		s.handle(ctx, s.m.Healthy(f.gpu, now))
		return
	}
	s.handle(ctx, s.m.Fault(f.gpu, remedy.Facts{
		Action: h.Action, XIDs: h.XIDs, RowRemapPending: h.RowRemapPending, RowRemapFailure: h.RowRemapFailure,
		Lost: h.Lost, Health: h.Reason,
	}, now))
}

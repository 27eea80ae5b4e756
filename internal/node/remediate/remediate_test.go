package remediate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// notifier is the front-end: what it was told last of each device.
type notifier struct {
	mu   sync.Mutex
	last map[string]verdict
}

func (n *notifier) SetHealth(id string, healthy bool, reason string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last[id] = verdict{healthy, reason}
	return true
}

func (n *notifier) of(id string) verdict {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last[id]
}

// clock fires each After only when the test says.
type clock struct {
	mu  sync.Mutex
	now time.Time
	reg map[time.Duration]chan chan time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) queue(d time.Duration) chan chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg[d] == nil {
		c.reg[d] = make(chan chan time.Time, 16)
	}
	return c.reg[d]
}

// After's channel is unbuffered: fire returns once the service took the
// time, so what the test asks next is answered after the service acted on
// it (a buffered one would let a query overtake the tick in its select).
func (c *clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time)
	c.queue(d) <- ch
	return ch
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fire fires the latest timer of d the service waits on, waiting for it
// to be set.
func (c *clock) fire(d time.Duration) {
	q := c.queue(d)
	ch := <-q
	for len(q) > 0 {
		ch = <-q // an older one was dropped by the service
	}
	select {
	case ch <- c.Now():
	case <-time.After(time.Minute):
		panic(fmt.Sprintf("the service never took the %s timer fired", d))
	}
}

type resetter struct {
	mu     sync.Mutex
	procs  map[string]int
	procEr error
	resets chan []string
	result chan error
}

func (r *resetter) Processes(uuid string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[uuid], r.procEr
}

func (r *resetter) Reset(ctx context.Context, uuids []string) error {
	r.resets <- uuids
	select {
	case err := <-r.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *resetter) Verify(string) error { return nil }

type prober struct {
	probes chan string
	result chan error
}

func (p *prober) Probe(ctx context.Context, uuid string) error {
	p.probes <- uuid
	select {
	case err := <-p.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// calls records what the service did through the other interfaces.
type calls struct {
	mu    sync.Mutex
	log   []string
	mpsUp map[string]bool
}

func (c *calls) add(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, fmt.Sprintf(format, args...))
}

func (c *calls) has(prefix string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.log, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func (c *calls) Running(uuid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mpsUp[uuid]
}
func (c *calls) Stop(_ context.Context, uuid string) error { c.add("mps stop %s", uuid); return nil }
func (c *calls) Start(uuid string)                         { c.add("mps start %s", uuid) }
func (c *calls) Evict(uuid string, on bool)                { c.add("evict %s %t", uuid, on) }
func (c *calls) Event(gpu, reason, msg string)             { c.add("event %s %s: %s", gpu, reason, msg) }
func (c *calls) NodeReboot(reason string, on bool)         { c.add("reboot %t %s", on, reason) }
func (c *calls) Reset(result string)                       { c.add("metric reset %s", result) }
func (c *calls) Recovered(took time.Duration)              { c.add("metric recovered %s", took) }
func (c *calls) State(gpu, state string)                   { c.add("metric state %s %s", gpu, state) }
func (c *calls) ClearSticky(gpu string)                    { c.add("clear %s", gpu) }
func (c *calls) Cordon(why string, on bool)                { c.add("cordon %t %s", on, why) }

// store is the state file, in memory.
type store struct {
	mu   sync.Mutex
	data []byte
}

func (s *store) Load(v any) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return false, nil
	}
	return true, json.Unmarshal(s.data, v)
}

func (s *store) Save(v any) error {
	b, err := json.Marshal(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = b
	return err
}

// rig is a service on two GPUs: GPU-0 served as two time-slicing
// replicas, GPU-1 in MIG mode reporting as two MIG devices.
type rig struct {
	t       *testing.T
	svc     *Service
	n       *notifier
	clk     *clock
	res     *resetter
	pr      *prober
	c       *calls
	st      *store
	mu      sync.Mutex
	holders podresources.Holders
	hErr    error
	cancel  context.CancelFunc
	done    chan struct{}
	results chan struct{} // one per reset or probe result handled
}

const (
	poll = 5 * time.Second
	tick = 10 * time.Second
)

// newRig builds the rig; with, when given, changes its options.
func newRig(t *testing.T, p remedy.Policy, st *store, dra bool, with ...func(*rig, *Options)) *rig {
	t.Helper()
	r := &rig{
		t: t, n: &notifier{last: map[string]verdict{}},
		clk: &clock{now: time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC), reg: map[time.Duration]chan chan time.Time{}},
		res: &resetter{procs: map[string]int{}, resets: make(chan []string), result: make(chan error)},
		pr:  &prober{probes: make(chan string), result: make(chan error)},
		c:   &calls{mpsUp: map[string]bool{}}, st: st,
	}
	o := Options{
		Policy: p,
		GPUs: []GPU{
			{GPU: remedy.GPU{UUID: "GPU-0", Architecture: "hopper"}, Names: []podresources.Names{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-0::0", "GPU-0::1"}}}, DRADevice: "gpu-0"},
			{GPU: remedy.GPU{UUID: "GPU-1", Architecture: "hopper"}, Units: []string{"MIG-a", "MIG-b"}, Names: []podresources.Names{{Resource: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-a", "MIG-b"}}}, DRADevice: "gpu-1"},
		},
		UsagePoll: poll, Tick: tick,
		Holders: func(context.Context) (podresources.Holders, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.holders, r.hErr
		},
		Driver: "gpu.example.com", Pool: "node-a",
		Resetter: r.res, Prober: r.pr, MPS: r.c, Reporter: r.c, Metrics: r.c, Store: st, Clock: r.clk,
	}
	if dra {
		o.Evicter = r.c
	}
	for _, f := range with {
		f(r, &o)
	}
	svc, err := New(o, r.n)
	if err != nil {
		t.Fatal(err)
	}
	svc.UseHealth(r.c)
	r.results = make(chan struct{}, 16)
	svc.handled = func() { r.results <- struct{}{} }
	r.svc = svc
	return r
}

func (r *rig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { r.svc.Run(ctx); close(r.done) }()
	r.t.Cleanup(r.stop)
}

func (r *rig) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
		r.cancel = nil
	}
}

func (r *rig) hold(pods ...*v1.PodResources) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders = podresources.FromList(prt.Decode(r.t, pods...))
}

// state waits for Run to have handled everything sent so far and
// returns gpu's state.
func (r *rig) state(gpu string) remedy.Status {
	r.t.Helper()
	for _, st := range r.svc.Status(context.Background()) {
		if st.GPU == gpu {
			return st
		}
	}
	r.t.Fatalf("no status of %s", gpu)
	return remedy.Status{}
}

func (r *rig) wantState(gpu string, want remedy.State) {
	r.t.Helper()
	if st := r.state(gpu); st.State != want {
		r.t.Fatalf("%s is %s (%s; %s), want %s", gpu, st.State, st.Reason, st.Waiting, want)
	}
}

func (r *rig) wantHealth(id string, healthy bool, reasonPrefix string) {
	r.t.Helper()
	v := r.n.of(id)
	if v.healthy != healthy || !strings.HasPrefix(v.reason, reasonPrefix) || (reasonPrefix == "" && v.reason != "") {
		r.t.Fatalf("%s told %+v, want healthy=%t reason %q...", id, v, healthy, reasonPrefix)
	}
}

func (r *rig) wantCalls(prefixes ...string) {
	r.t.Helper()
	for _, p := range prefixes {
		if !r.c.has(p) {
			r.t.Errorf("no call %q in\n%s", p, strings.Join(r.c.log, "\n"))
		}
	}
}

func resetFault() health.Facts {
	return health.Facts{Reason: "recovery-action=reset", Action: nvml.RecoveryReset}
}

// The whole remediation of one GPU: withheld (its replicas unhealthy,
// with the remediation's reason once health would let them back), drained of its pod, its MPS daemon stopped,
// reset, probed and given back, after which health's own word passes
// again and its sticky conditions are cleared. The other GPU's units are
// untouched throughout, and nothing is evicted.
func TestRemediation(t *testing.T) {
	r := newRig(t, remedy.DefaultPolicy(), &store{}, false)
	r.svc.SetHealth("MIG-a", true, "")
	r.svc.SetHealth("MIG-b", false, "thermal=91C>=slowdown 90C")
	r.hold(prt.Pod("ml", "train", prt.Container("main", prt.Devices("nvidia.com/gpu", "GPU-0::1"))))
	r.c.mpsUp["GPU-0"] = true
	r.run()

	r.svc.SetHealth("GPU-0", false, "recovery-action=reset")
	r.svc.Facts("GPU-0", resetFault())
	r.wantState("GPU-0", remedy.StateDraining)
	// Health calls it unhealthy: its own reason stands, for the taints and
	// tolerations keyed on it.
	r.wantHealth("GPU-0", false, "recovery-action=reset")
	if st := r.state("GPU-0"); !strings.Contains(st.Waiting, "1 holder(s) on GPU-0") {
		t.Fatalf("waiting: %q", st.Waiting)
	}

	r.hold()
	r.clk.fire(poll)
	r.wantState("GPU-0", remedy.StateWaitingIdle)
	r.wantCalls("mps stop GPU-0")

	r.c.mu.Lock()
	r.c.mpsUp["GPU-0"] = false
	r.c.mu.Unlock()
	r.clk.fire(poll)
	if got := <-r.res.resets; !slices.Equal(got, []string{"GPU-0"}) {
		t.Fatalf("reset %v", got)
	}
	r.wantState("GPU-0", remedy.StateResetting)
	r.clk.advance(30 * time.Second)
	r.res.result <- nil
	<-r.results
	if got := <-r.pr.probes; got != "GPU-0" {
		t.Fatalf("probed %s", got)
	}
	r.wantState("GPU-0", remedy.StateProbing)
	r.svc.SetHealth("GPU-0", true, "") // the driver says no action now
	r.wantHealth("GPU-0", false, "remediation: probing: ")
	r.pr.result <- nil
	<-r.results
	r.wantState("GPU-0", remedy.StateServing)
	r.wantHealth("GPU-0", true, "")
	r.wantCalls("mps start GPU-0", "clear GPU-0", "metric reset success", "metric recovered 30s",
		"event GPU-0 GPUWithheld", "event GPU-0 GPUResetStarted", "event GPU-0 GPUGivenBack: given back after 30s",
		"metric state GPU-0 draining", "metric state GPU-0 serving")
	r.wantHealth("MIG-a", true, "")
	r.wantHealth("MIG-b", false, "thermal=91C")
	if r.c.has("evict") || r.c.has("clear GPU-1") || r.c.has("mps stop GPU-1") || r.c.has("reboot") {
		t.Errorf("calls beyond GPU-0's remediation:\n%s", strings.Join(r.c.log, "\n"))
	}
}

// A reset that fails leaves the GPU out for a human, with the error.
func TestResetFailureNeedsHuman(t *testing.T) {
	r := newRig(t, remedy.DefaultPolicy(), &store{}, false)
	r.run()
	r.svc.Facts("GPU-1", resetFault())
	<-r.res.resets
	r.res.result <- errors.New("not available in this build yet")
	<-r.results
	r.wantState("GPU-1", remedy.StateNeedsHuman)
	r.wantHealth("MIG-a", false, "remediation: needsHuman: the reset failed: not available in this build yet")
	r.wantHealth("MIG-b", false, "remediation: needsHuman: the reset failed")
	r.wantCalls("metric reset failure", "event GPU-1 GPUNeedsHuman")
	if v := r.n.of("GPU-0"); v != (verdict{}) {
		t.Errorf("GPU-0 was told %+v", v)
	}
}

// A restart while a reset is out: the new process withholds the GPU at
// once, and probes it rather than resetting it again.
func TestRestartMidResetProbes(t *testing.T) {
	st := &store{}
	r := newRig(t, remedy.DefaultPolicy(), st, false)
	r.run()
	r.svc.Facts("GPU-0", resetFault())
	<-r.res.resets
	r.stop()

	again := newRig(t, remedy.DefaultPolicy(), st, false)
	again.wantHealth("GPU-0", false, "remediation: ")
	again.run()
	select {
	case got := <-again.pr.probes:
		if got != "GPU-0" {
			t.Fatalf("probed %s", got)
		}
	case got := <-again.res.resets:
		t.Fatalf("reset %v again after the restart", got)
	}
	again.pr.result <- nil
	<-again.results
	again.wantState("GPU-0", remedy.StateServing)
	again.wantHealth("GPU-0", true, "")
}

// A restart that finds a GPU resetting and no longer on the node (the
// reset may have left it removed): out for a human, and saved so as soon
// as Run starts, though nothing else happens to it.
func TestRestartMidResetGPUGone(t *testing.T) {
	st := &store{data: []byte(`{"gpus": [{"uuid": "GPU-gone", "state": "resetting", "decision": "reset", "reason": "xid=48"}]}`)}
	r := newRig(t, remedy.DefaultPolicy(), st, false)
	r.run()
	if got := r.state("GPU-gone"); got.State != remedy.StateNeedsHuman || !got.Absent || !strings.Contains(got.Reason, "not on the node") {
		t.Fatalf("GPU-gone: %+v, want needsHuman, absent, saying it is not on the node", got)
	}
	r.wantCalls("event GPU-gone " + EventNeedsHuman)
	var saved remedy.Saved
	if _, err := st.Load(&saved); err != nil {
		t.Fatal(err)
	}
	if len(saved.GPUs) != 1 || saved.GPUs[0].State != remedy.StateNeedsHuman {
		t.Errorf("saved %+v, want GPU-gone needsHuman", saved.GPUs)
	}
}

// Eviction: DRA only, and only with evict on, after the grace period;
// the taint's NoExecute ends when the GPU is given back.
func TestEviction(t *testing.T) {
	for _, tc := range []struct {
		name  string
		evict bool
		dra   bool
		want  bool
	}{
		{"DRA with evict on", true, true, true},
		{"DRA with evict off", false, true, false},
		{"device-plugin mode", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := remedy.DefaultPolicy()
			p.Evict, p.GracePeriod = tc.evict, time.Minute
			r := newRig(t, p, &store{}, tc.dra)
			r.hold(prt.Pod("ml", "infer", prt.ClaimContainer("main", prt.Claim("ml", "gpus", "gpu.example.com", "node-a", "gpu-1-mig-1-0"))))
			r.run()
			r.svc.Facts("GPU-1", resetFault())
			r.wantState("GPU-1", remedy.StateDraining)
			r.clk.advance(2 * time.Minute)
			r.clk.fire(tick)
			r.clk.fire(poll)
			r.wantState("GPU-1", remedy.StateDraining)
			if got := r.c.has("evict GPU-1 true"); got != tc.want {
				t.Fatalf("evicted: %t, want %t\n%s", got, tc.want, strings.Join(r.c.log, "\n"))
			}
			if !tc.want {
				return
			}
			r.hold()
			r.clk.fire(poll)
			<-r.res.resets
			r.res.result <- nil
			<-r.results
			<-r.pr.probes
			r.pr.result <- nil
			<-r.results
			r.wantState("GPU-1", remedy.StateServing)
			r.wantCalls("evict GPU-1 false")
		})
	}
}

// Usage that cannot be told is never idle: the GPU waits, and its reason
// says why.
func TestUnknownUsageWaits(t *testing.T) {
	r := newRig(t, remedy.DefaultPolicy(), &store{}, false)
	r.res.mu.Lock()
	r.res.procEr = errors.New("NVML cannot tell")
	r.res.mu.Unlock()
	r.run()
	r.svc.Facts("GPU-0", resetFault())
	r.wantState("GPU-0", remedy.StateDraining)
	r.wantHealth("GPU-0", false, "remediation: draining: ")
	if v := r.n.of("GPU-0"); !strings.Contains(v.reason, "its usage is not known: processes: NVML cannot tell") {
		t.Fatalf("reason %q", v.reason)
	}
	r.clk.fire(poll)
	r.wantState("GPU-0", remedy.StateDraining)
}

// A GPU the driver says is lost: out, and the node needs a reboot, which
// the condition says until a human releases it... here, for as long as
// the process runs.
func TestNodeReboot(t *testing.T) {
	r := newRig(t, remedy.DefaultPolicy(), &store{}, false)
	r.run()
	r.svc.Facts("GPU-0", health.Facts{Reason: "gpu-lost", Lost: true})
	r.wantState("GPU-0", remedy.StateNeedsReboot)
	r.wantCalls("reboot true 1 GPU(s) need a node reboot: GPU-0: gpu-lost", "event GPU-0 GPUNeedsNodeReboot")
}

package remediate

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/cordon"
)

func cordonPolicy() remedy.Policy {
	p := remedy.DefaultPolicy()
	p.Cordon = true
	return p
}

// with is the calls that start with prefix, in order.
func (c *calls) with(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// wantCordons checks what the Cordoner was told, each call by its start.
func (r *rig) wantCordons(want ...string) {
	r.t.Helper()
	got := r.c.with("cordon ")
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = strings.HasPrefix(got[i], want[i])
	}
	if !ok {
		r.t.Fatalf("cordons %q, want %q...", got, want)
	}
}

// withCordoner makes the rig's calls the Cordoner.
func withCordoner(r *rig, o *Options) { o.Cordoner = r.c }

func lost() health.Facts { return health.Facts{Reason: "gpu-lost", Lost: true} }

// The Cordoner is told at the start (no GPU needs a reboot: lift a cordon
// of ours), once when a GPU needs a reboot however many more do, and once
// more when none does any longer (a human released them).
func TestCordon(t *testing.T) {
	r := newRig(t, cordonPolicy(), &store{}, false, withCordoner)
	r.run()
	r.wantState("GPU-0", remedy.StateServing)
	r.wantCordons("cordon false ")

	r.svc.Facts("GPU-0", lost())
	r.wantState("GPU-0", remedy.StateNeedsReboot)
	r.svc.Facts("GPU-1", lost())
	r.wantState("GPU-1", remedy.StateNeedsReboot)
	r.wantCordons("cordon false ", "cordon true GPU-0: gpu-lost")

	ctx := context.Background()
	if _, err := r.svc.Release(ctx, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	r.wantCordons("cordon false ", "cordon true GPU-0: gpu-lost")
	if _, err := r.svc.Release(ctx, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	r.wantCordons("cordon false ", "cordon true GPU-0: gpu-lost", "cordon false ")
}

// A restart on the same boot, a GPU still out for a reboot: the cordon is
// asked for again (the Cordoner finds it there), never lifted first. On a
// new boot the state starts empty, and the start lifts it.
func TestCordonAfterRestart(t *testing.T) {
	st := &store{}
	r := newRig(t, cordonPolicy(), st, false, withCordoner)
	r.run()
	r.svc.Facts("GPU-1", lost())
	r.wantState("GPU-1", remedy.StateNeedsReboot)
	r.stop()

	again := newRig(t, cordonPolicy(), st, false, withCordoner)
	again.run()
	again.wantState("GPU-1", remedy.StateNeedsReboot)
	again.wantCordons("cordon true GPU-1: gpu-lost")

	rebooted := newRig(t, cordonPolicy(), &store{}, false, withCordoner)
	rebooted.run()
	rebooted.wantState("GPU-1", remedy.StateServing)
	rebooted.wantCordons("cordon false ")
}

// Without remediation.cordon the Machine asks for no cordon, and nothing
// is cordoned.
func TestNoCordonWithoutPolicy(t *testing.T) {
	r := newRig(t, remedy.DefaultPolicy(), &store{}, false, withCordoner)
	r.run()
	r.svc.Facts("GPU-0", lost())
	r.wantState("GPU-0", remedy.StateNeedsReboot)
	r.wantCordons("cordon false ")
}

// nodeAPI is the Node as the API server keeps it, for the Cordoner the
// daemon wires (package cordon's Keeper): a patch applies as a JSON merge
// patch, only to the resourceVersion it names. Each call is sent on seen.
type nodeAPI struct {
	mu            sync.Mutex
	unschedulable bool
	annotations   map[string]string
	rv            int
	err           error
	seen          chan string
}

func (a *nodeAPI) GetNode(_ context.Context, name string) (kubeapi.Node, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer func() { a.seen <- "get" }()
	if a.err != nil {
		return kubeapi.Node{}, a.err
	}
	var n kubeapi.Node
	n.Metadata = kubeapi.ObjectMeta{Name: name, ResourceVersion: string(rune('a' + a.rv)), Annotations: maps.Clone(a.annotations)}
	n.Spec.Unschedulable = a.unschedulable
	return n, nil
}

func (a *nodeAPI) PatchNodeScheduling(_ context.Context, _ string, p kubeapi.SchedulingPatch) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer func() { a.seen <- "patch" }()
	if a.err != nil {
		return a.err
	}
	if p.ResourceVersion != string(rune('a'+a.rv)) {
		return &kubeapi.StatusError{Code: 409}
	}
	if p.Unschedulable != nil {
		a.unschedulable = *p.Unschedulable
	}
	for k, v := range p.Annotations {
		if v == nil {
			delete(a.annotations, k)
		} else {
			a.annotations[k] = *v
		}
	}
	a.rv++
	return nil
}

func (a *nodeAPI) node() (bool, string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.annotations[cordon.Annotation]
	return a.unschedulable, v, ok
}

// wantCalls waits for the API calls, in order.
func (a *nodeAPI) wantCalls(t *testing.T, want ...string) {
	t.Helper()
	for i, w := range want {
		select {
		case got := <-a.seen:
			if got != w {
				t.Fatalf("call %d: %s, want %s", i, got, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: none, want %s", i, w)
		}
	}
}

func (a *nodeAPI) wantNoCall(t *testing.T) {
	t.Helper()
	select {
	case got := <-a.seen:
		t.Fatalf("call %s, want none", got)
	default:
	}
}

// withKeeper wires the rig to a cordon Keeper over api, as the daemon
// does, its retries waiting on the rig's clock (1s: the backoff's floor).
func withKeeper(t *testing.T, api *nodeAPI) func(*rig, *Options) {
	return func(r *rig, o *Options) {
		k, err := cordon.New(api, cordon.Options{Node: "n1", Backoff: backoff.Policy{Rand: func() float64 { return 0 }}, After: r.clk.After})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { k.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		o.Cordoner = k
	}
}

// With the Keeper and an API server that fails: the remediation goes on
// (the GPU is out, its status answered, a release taken) while the calls
// are retried on the backoff's clock; once the server answers, the Node
// is cordoned, and after the release uncordoned.
func TestCordonAPIFailureRetried(t *testing.T) {
	api := &nodeAPI{annotations: map[string]string{}, err: &kubeapi.StatusError{Code: 503}, seen: make(chan string, 64)}
	r := newRig(t, cordonPolicy(), &store{}, false, withKeeper(t, api))
	r.run()
	api.wantCalls(t, "get") // the start's uncordon, failed

	r.svc.Facts("GPU-0", lost())
	r.wantState("GPU-0", remedy.StateNeedsReboot)
	r.wantHealth("GPU-0", false, "remediation: needsReboot: ")
	api.wantNoCall(t) // waiting out the backoff, not hammering

	api.mu.Lock()
	api.err = nil
	api.mu.Unlock()
	r.clk.fire(time.Second)
	api.wantCalls(t, "get", "get", "patch") // the uncordon finds nothing of ours; the cordon
	if off, why, _ := api.node(); !off || !strings.HasPrefix(why, "GPU-0: gpu-lost: NVML cannot reach the GPU") {
		t.Fatalf("unschedulable %v, annotation %q", off, why)
	}

	if _, err := r.svc.Release(context.Background(), "GPU-0"); err != nil {
		t.Fatal(err)
	}
	api.wantCalls(t, "get", "patch")
	if off, _, ours := api.node(); off || ours {
		t.Fatalf("after the release: unschedulable %v, annotation %v", off, ours)
	}
}

// An operator's cordon is never taken over, nor lifted when no GPU needs
// a reboot any more; a cordon of ours found at the start with no GPU out
// for a reboot (the plugin starting after the reboot) is lifted.
func TestCordonOnlyOurs(t *testing.T) {
	t.Run("an operator's cordon", func(t *testing.T) {
		api := &nodeAPI{unschedulable: true, annotations: map[string]string{"example.com/why": "maintenance"}, seen: make(chan string, 64)}
		r := newRig(t, cordonPolicy(), &store{}, false, withKeeper(t, api))
		r.run()
		api.wantCalls(t, "get")
		r.svc.Facts("GPU-0", lost())
		r.wantState("GPU-0", remedy.StateNeedsReboot)
		api.wantCalls(t, "get")
		if _, err := r.svc.Release(context.Background(), "GPU-0"); err != nil {
			t.Fatal(err)
		}
		api.wantCalls(t, "get")
		api.wantNoCall(t)
		if off, _, ours := api.node(); !off || ours {
			t.Fatalf("unschedulable %v, annotation of ours %v: want the operator's cordon as it was", off, ours)
		}
	})
	t.Run("ours, after the reboot", func(t *testing.T) {
		api := &nodeAPI{unschedulable: true, annotations: map[string]string{cordon.Annotation: "GPU-0: gpu-lost"}, seen: make(chan string, 64)}
		r := newRig(t, cordonPolicy(), &store{}, false, withKeeper(t, api))
		r.run()
		api.wantCalls(t, "get", "patch")
		if off, _, ours := api.node(); off || ours {
			t.Fatalf("unschedulable %v, annotation %v", off, ours)
		}
	})
}

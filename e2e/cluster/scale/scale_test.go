package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/auditlog"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// The storm: on each node, stormRounds XIDs on each of stormGPUs GPUs, as
// fast as the mock takes them. XID 94 (contained ECC error) is neither
// ignored nor fatal: the GPU is unhealthy until recovery has passed
// without another, then healthy again, so one run measures both ways.
const (
	stormGPUs   = 4
	stormRounds = 5
	stormXID    = 94
	recovery    = 20 * time.Second
	// quiet is how long the fleet must not write for a phase to end.
	quiet = 3 * time.Second
)

// The budget a burst of XIDs on one node may cost (docs/api-load.md):
// one ResourceSlice update (debounced), one Event per GPU that changed,
// one Node condition PATCH. A burst that outlasts the debounce bound may
// cost one more of each; the test fails beyond that.
const (
	budgetSliceWrites     = 1
	budgetEventWrites     = stormGPUs
	budgetConditionWrites = 1
)

func TestScale(t *testing.T) {
	s := loadSettings(t)
	ctx := t.Context()
	dir := t.TempDir()
	bin, err := harness.BuildPluginDRA(filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := harness.BuildMock(filepath.Join(dir, "lib"))
	if err != nil {
		t.Fatal(err)
	}
	profile, err := harness.ProfilePath(profileName)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]string, s.nodes)
	for i := range nodes {
		nodes[i] = nodeName(i)
	}
	if err := createNodes(ctx, s.admin, s.nodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := deleteNodes(ctx, s.admin); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	w, err := watch(ctx, s.admin)
	if err != nil {
		t.Fatal(err)
	}
	audit := &auditlog.Tail{Path: s.auditLog, User: "gpu-device-plugin-scale"}
	r := &report{nodes: s.nodes}

	// Start: batches of s.batch plugins, each batch published and its
	// condition set before the next starts, as a DaemonSet rollout would.
	if err := audit.Mark(); err != nil {
		t.Fatal(err)
	}
	f := &fleet{}
	t.Cleanup(f.stop)
	started := time.Now()
	for lo := 0; lo < s.nodes; lo += s.batch {
		batch := nodes[lo:min(lo+s.batch, s.nodes)]
		for _, n := range batch {
			work, err := harness.ShortTempDir("scale")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(work) })
			p, err := harness.StartPlugin(harness.PluginOptions{
				Binary: bin, Library: lib, Profile: profile,
				PluginDir: filepath.Join(work, "device-plugins"),
				Args:      pluginArgs(s, n, work, recovery),
			})
			if err != nil {
				t.Fatal(err)
			}
			f.plugins = append(f.plugins, p)
			f.names = append(f.names, n)
		}
		if err := w.await(ctx, batch, "published and GPUHealthy=True", 2*time.Minute, func(v nodeView) bool {
			return v.devices == gpusPerNode && v.tainted == 0 && v.condition == "True"
		}); err != nil {
			t.Fatalf("start: %v\n%s", err, f.logOf(batch[0]))
		}
	}
	r.startTook = time.Since(started)
	if _, err := r.phase(ctx, audit, "start", started); err != nil {
		t.Fatal(err)
	}

	// Rest: nothing changes on any node.
	restFrom := time.Now()
	u0 := f.usage()
	select {
	case <-time.After(s.rest): // a measuring window, not a wait for anything
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	u1 := f.usage()
	r.mem, r.restCPU = u1, u1.cpu-u0.cpu
	rest, err := r.phase(ctx, audit, "rest", restFrom)
	if err != nil {
		t.Fatal(err)
	}

	// The storm, on every node at once, then its recovery.
	before, err := scrape(ctx, s.admin)
	if err != nil {
		t.Fatal(err)
	}
	w.arm(stormGPUs)
	stormFrom := time.Now()
	injected := f.storm(t)
	if err := w.await(ctx, nodes, fmt.Sprintf("with %d tainted GPUs and GPUHealthy=False", stormGPUs), 2*time.Minute, func(v nodeView) bool {
		return v.tainted == stormGPUs && v.condition == "False"
	}); err != nil {
		t.Fatalf("storm: %v", err)
	}
	r.taintDelays(injected, w.faultTimes())
	r.sliceBytes = w.sliceBytes(nodes[0])
	fault, err := r.phase(ctx, audit, "fault", stormFrom)
	if err != nil {
		t.Fatal(err)
	}
	recoverFrom := time.Now()
	if err := w.await(ctx, nodes, "recovered (no taint, GPUHealthy=True)", recovery+2*time.Minute, func(v nodeView) bool {
		return v.tainted == 0 && v.condition == "True"
	}); err != nil {
		t.Fatalf("recovery: %v", err)
	}
	recovered, err := r.phase(ctx, audit, "recovery", recoverFrom)
	if err != nil {
		t.Fatal(err)
	}
	after, err := scrape(ctx, s.admin)
	if err != nil {
		t.Fatal(err)
	}
	r.server = after.delta(before)
	r.serverWindow = time.Since(stormFrom)
	if r.events, err = countEvents(ctx, s, nodes); err != nil {
		t.Fatal(err)
	}

	text := r.String()
	t.Log("\n" + text)
	if s.reportDir != "" {
		if err := os.MkdirAll(s.reportDir, 0o755); err == nil {
			if err := os.WriteFile(filepath.Join(s.reportDir, "scale.txt"), []byte(text), 0o644); err != nil {
				t.Error(err)
			}
		}
	}

	// The budgets.
	if r.mem.n != s.nodes {
		t.Errorf("read the memory of %d of %d plugin processes", r.mem.n, s.nodes)
	} else if err := overRSSBudget(r.mem.peakRSS / float64(r.mem.n)); err != nil {
		t.Error(err)
	}
	for _, p := range r.phases {
		if wide := p.clusterWide(); len(wide) > 0 {
			t.Errorf("%s: %d lists or watches not narrowed to the node, e.g. %s", p.name, len(wide), wide[0])
		}
	}
	if n := rest.writes(); n != 0 {
		t.Errorf("at rest the fleet wrote %d times in %s (%s); the budget is 0", n, s.rest, auditlog.Summary(rest.reqs))
	}
	for _, c := range []struct {
		ph     phase
		what   string
		budget int
		count  func(phase) int
	}{
		{fault, "ResourceSlice writes", budgetSliceWrites, sliceWrites},
		{recovered, "ResourceSlice writes", budgetSliceWrites, sliceWrites},
		{fault, "Event writes", budgetEventWrites, eventWrites},
		{recovered, "Event writes", budgetEventWrites, eventWrites},
		{fault, "Node condition PATCHes", budgetConditionWrites, conditionWrites},
		{recovered, "Node condition PATCHes", budgetConditionWrites, conditionWrites},
	} {
		if got, limit := c.count(c.ph), (c.budget+1)*s.nodes; got > limit {
			t.Errorf("%s: %d %s for %d nodes, over the budget of %d a node (+1 for a burst that outlasts the debounce)", c.ph.name, got, c.what, s.nodes, c.budget)
		}
	}
	for _, n := range nodes {
		if e := r.events[n]; e.unhealthy != stormGPUs || e.recovered != stormGPUs {
			t.Errorf("%s: %d GPUUnhealthy and %d GPURecovered Events, want %d of each", n, e.unhealthy, e.recovered, stormGPUs)
			break
		}
	}
}

// storm sends each node its burst, all nodes at once, and returns when
// each node's last XID was taken.
func (f *fleet) storm(t *testing.T) map[string]time.Time {
	var mu sync.Mutex
	last := map[string]time.Time{}
	var wg sync.WaitGroup
	for i, p := range f.plugins {
		wg.Go(func() {
			for range stormRounds {
				for gpu := range stormGPUs {
					if err := p.Inject(fmt.Sprintf("xid %d %d", gpu, stormXID)); err != nil {
						t.Errorf("%s: %v", f.names[i], err)
						return
					}
				}
			}
			mu.Lock()
			last[f.names[i]] = time.Now()
			mu.Unlock()
		})
	}
	wg.Wait()
	return last
}

func (f *fleet) logOf(node string) string {
	i := slices.Index(f.names, node)
	if i < 0 {
		return ""
	}
	return node + "'s plugin log:\n" + f.plugins[i].Log()
}

func sliceWrites(p phase) int {
	return p.count("create", "resourceslices") + p.count("update", "resourceslices") + p.count("delete", "resourceslices")
}

func eventWrites(p phase) int { return p.count("create", "events") + p.count("patch", "events") }

func conditionWrites(p phase) int { return p.count("patch", "nodes/status") }

type eventCount struct{ unhealthy, recovered int }

// countEvents counts the GPU Events of each node.
func countEvents(ctx context.Context, s settings, nodes []string) (map[string]eventCount, error) {
	l, err := s.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node"})
	if err != nil {
		return nil, fmt.Errorf("listing Node Events: %w", err)
	}
	out := map[string]eventCount{}
	for _, e := range l.Items {
		if !strings.HasPrefix(e.InvolvedObject.Name, "scale-") {
			continue
		}
		c := out[e.InvolvedObject.Name]
		switch e.Reason {
		case "GPUUnhealthy":
			c.unhealthy++
		case "GPURecovered":
			c.recovered++
		}
		out[e.InvolvedObject.Name] = c
	}
	return out, nil
}

// report is the lane's figures.
type report struct {
	nodes        int
	startTook    time.Duration
	phases       []phase
	mem          fleetUsage // at the end of the rest
	restCPU      time.Duration
	delays       []time.Duration // last XID → slice tainted, per node
	server       serverMetrics
	serverWindow time.Duration
	sliceBytes   int
	events       map[string]eventCount
}

// phase waits until the fleet has not written for quiet, then takes what
// it asked since the last phase.
func (r *report) phase(ctx context.Context, a *auditlog.Tail, name string, from time.Time) (phase, error) {
	var reqs []auditlog.Request
	lastWrite := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		more, err := a.Read()
		if err != nil {
			return phase{}, err
		}
		for _, q := range more {
			if q.Write() {
				lastWrite = time.Now()
			}
		}
		reqs = append(reqs, more...)
		if time.Since(lastWrite) >= quiet {
			break
		}
		select {
		case <-ctx.Done():
			return phase{}, ctx.Err()
		case <-tick.C:
		}
	}
	p := phase{name: name, duration: time.Since(from), reqs: reqs}
	r.phases = append(r.phases, p)
	return p, nil
}

func (r *report) taintDelays(injected, faulted map[string]time.Time) {
	for n, at := range faulted {
		if in, ok := injected[n]; ok {
			r.delays = append(r.delays, max(0, at.Sub(in)))
		}
	}
	sort.Slice(r.delays, func(i, j int) bool { return r.delays[i] < r.delays[j] })
}

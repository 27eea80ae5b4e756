package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

const (
	driverName = "gpu-device-plugin.github.io"
	// scaleLabel marks the lane's Nodes, so a failed run's leftovers are
	// found and removed by the next.
	scaleLabel = "gpu-device-plugin.github.io/scale-test"
	// The profile every fake node is: eight H100s.
	profileName = "dgx-h100"
	gpusPerNode = 8
)

// settings come from the cluster lane's suite.env.
type settings struct {
	admin           kubernetes.Interface
	scaleKubeconfig string
	auditLog        string
	reportDir       string
	nodes           int
	rest            time.Duration
	batch           int
}

func loadSettings(t *testing.T) settings {
	s := settings{
		scaleKubeconfig: os.Getenv("E2E_SCALE_KUBECONFIG"),
		auditLog:        os.Getenv("E2E_AUDIT_LOG"),
		reportDir:       os.Getenv("E2E_REPORT_DIR"),
		nodes:           100,
		rest:            60 * time.Second,
		batch:           10,
	}
	if s.scaleKubeconfig == "" || s.auditLog == "" {
		t.Skip("no E2E_SCALE_KUBECONFIG and E2E_AUDIT_LOG: run `make e2e-scale` on a cluster `make e2e-cluster` brought up")
	}
	if v := os.Getenv("E2E_SCALE_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("E2E_SCALE_NODES=%q: want a number of nodes, at least 1", v)
		}
		s.nodes = n
	}
	if v := os.Getenv("E2E_SCALE_REST"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("E2E_SCALE_REST=%q: want a duration such as 60s", v)
		}
		s.rest = d
	}
	rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatalf("KUBECONFIG (the cluster's admin): %v", err)
	}
	rc.QPS, rc.Burst = 200, 400
	if s.admin, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	return s
}

func nodeName(i int) string { return fmt.Sprintf("scale-%03d", i) }

// createNodes makes the fleet's Node objects, after removing any a failed
// run left.
func createNodes(ctx context.Context, c kubernetes.Interface, n int) error {
	if err := deleteNodes(ctx, c); err != nil {
		return err
	}
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{scaleLabel: "true"}}}
		if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Node %s: %w", node.Name, err)
		}
	}
	return nil
}

// deleteNodes removes the lane's Nodes, their ResourceSlices and Events.
func deleteNodes(ctx context.Context, c kubernetes.Interface) error {
	l, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: scaleLabel})
	if err != nil {
		return fmt.Errorf("listing the lane's Nodes: %w", err)
	}
	for _, n := range l.Items {
		if err := c.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Node %s: %w", n.Name, err)
		}
		sel := metav1.ListOptions{FieldSelector: "spec.driver=" + driverName + ",spec.nodeName=" + n.Name}
		if err := c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			return fmt.Errorf("deleting %s's ResourceSlices: %w", n.Name, err)
		}
		evSel := metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + n.Name}
		if err := c.CoreV1().Events("default").DeleteCollection(ctx, metav1.DeleteOptions{}, evSel); err != nil {
			return fmt.Errorf("deleting %s's Events: %w", n.Name, err)
		}
	}
	return nil
}

// nodeView is what the API server says of one fake node.
type nodeView struct {
	devices   int       // in its ResourceSlices
	tainted   int       // devices with a taint of ours
	condition string    // GPUHealthy's status
	faultedAt time.Time // when tainted first reached the storm's GPUs
}

// watcher follows the fleet's ResourceSlices and Nodes through one
// informer each (the test's own requests, as the admin, are not audited).
type watcher struct {
	mu     sync.Mutex
	slices map[string]map[string]*resourceapi.ResourceSlice // node → slice name → slice
	conds  map[string]string
	faults map[string]time.Time // node → first time all storm GPUs were tainted
	stormN int
}

func watch(ctx context.Context, c kubernetes.Interface) (*watcher, error) {
	w := &watcher{slices: map[string]map[string]*resourceapi.ResourceSlice{}, conds: map[string]string{}, faults: map[string]time.Time{}}
	sf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.driver=" + driverName
	}))
	si := sf.Resource().V1().ResourceSlices().Informer()
	if _, err := si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.slice(o, false) },
		UpdateFunc: func(_, o any) { w.slice(o, false) },
		DeleteFunc: func(o any) { w.slice(o, true) },
	}); err != nil {
		return nil, err
	}
	nf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = scaleLabel
	}))
	ni := nf.Core().V1().Nodes().Informer()
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.node,
		UpdateFunc: func(_, o any) { w.node(o) },
	}); err != nil {
		return nil, err
	}
	sf.Start(ctx.Done())
	nf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), si.HasSynced, ni.HasSynced) {
		return nil, fmt.Errorf("the test's informers did not sync: %w", context.Cause(ctx))
	}
	return w, nil
}

func (w *watcher) slice(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	s, ok := o.(*resourceapi.ResourceSlice)
	if !ok || s.Spec.NodeName == nil {
		return
	}
	node := *s.Spec.NodeName
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.slices[node] == nil {
		w.slices[node] = map[string]*resourceapi.ResourceSlice{}
	}
	if deleted {
		delete(w.slices[node], s.Name)
	} else {
		w.slices[node][s.Name] = s
	}
	if w.stormN > 0 && w.faults[node].IsZero() && w.viewLocked(node).tainted >= w.stormN {
		w.faults[node] = time.Now()
	}
}

func (w *watcher) node(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range n.Status.Conditions {
		if c.Type == "GPUHealthy" {
			w.conds[n.Name] = string(c.Status)
		}
	}
}

func (w *watcher) viewLocked(node string) nodeView {
	v := nodeView{condition: w.conds[node], faultedAt: w.faults[node]}
	for _, s := range w.slices[node] {
		for _, d := range s.Spec.Devices {
			v.devices++
			for _, t := range d.Taints {
				if strings.HasPrefix(t.Key, driverName+"/") {
					v.tainted++
					break
				}
			}
		}
	}
	return v
}

// arm starts timing the storm: faultedAt is set when a node's slices
// first show n tainted devices.
func (w *watcher) arm(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stormN = n
	clear(w.faults)
}

// await waits until ok holds for every node, and says which do not.
func (w *watcher) await(ctx context.Context, nodes []string, what string, timeout time.Duration, ok func(nodeView) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		w.mu.Lock()
		var bad []string
		var first nodeView
		for _, n := range nodes {
			if v := w.viewLocked(n); !ok(v) {
				if len(bad) == 0 {
					first = v
				}
				bad = append(bad, n)
			}
		}
		w.mu.Unlock()
		if len(bad) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d nodes not %s after %s (first: %s: %+v)", len(bad), len(nodes), what, timeout, bad[0], first)
		case <-tick.C:
		}
	}
}

func (w *watcher) faultTimes() map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]time.Time, len(w.faults))
	for k, v := range w.faults {
		out[k] = v
	}
	return out
}

// fleet is the plugin processes, one per node.
type fleet struct {
	plugins []*harness.Plugin
	names   []string
}

// pluginArgs make one node's plugin: DRA mode as the fleet's user, Events
// and the Node condition on, node labels off (they would write the
// machine's NFD folder), everything else in its own work directory.
func pluginArgs(s settings, node, work string, recovery time.Duration) []string {
	return []string{
		"--kubelet-api", "dra",
		"--kubeconfig", s.scaleKubeconfig,
		"--node-name", node,
		"--dra-plugin-dir", filepath.Join(work, "dra"),
		"--plugin-registry-dir", filepath.Join(work, "registry"),
		"--cdi-spec-dir", filepath.Join(work, "cdi"),
		"--pod-resources-socket", filepath.Join(work, "no-kubelet.sock"),
		"--events=true", "--node-condition=true",
		"--node-labels", "none",
		"--xid-recovery-period", recovery.String(),
		// The storm measures health's own flapping: XID 94 unhealthy, then
		// healthy once recovery passes. The remediation, on by default,
		// would withhold the GPU for a reset, and a node without a kubelet
		// never knows it idle. One remediation's requests are measured by
		// the cluster suite's remediation lanes.
		"--remediation-enabled=false",
		"--log-level", "warn",
	}
}

func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, p := range f.plugins {
		wg.Go(func() { _ = p.Stop() })
	}
	wg.Wait()
}

// fleetUsage is the fleet's memory and CPU so far, summed over the
// processes read (n).
type fleetUsage struct {
	n                      int
	peakRSS, anon, fileMiB float64 // VmHWM; RssAnon and RssFile now
	cpu                    time.Duration
}

// usage sums the fleet's resident memory (peak, and now split into
// anonymous and file-backed pages) and CPU time so far.
func (f *fleet) usage() fleetUsage {
	var u fleetUsage
	for _, p := range f.plugins {
		pu, err := p.Usage()
		if err != nil {
			continue
		}
		u.n++
		u.peakRSS += float64(pu.PeakRSS) / (1 << 20)
		u.anon += float64(pu.RSSAnon) / (1 << 20)
		u.fileMiB += float64(pu.RSSFile) / (1 << 20)
		u.cpu += pu.CPU()
	}
	return u
}

// sliceBytes is the size of one node's ResourceSlices as JSON, what etcd
// stores and every watcher of the slice receives on each update.
func (w *watcher) sliceBytes(node string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.slices[node] {
		if b, err := json.Marshal(s); err == nil {
			n += len(b)
		}
	}
	return n
}

package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// The upgrade lane (issue 29): the previous release, built from git by its
// own make image and installed from its own chart (build.sh previous), serves
// the node; pods hold GPUs and a NIC; an XID makes one held GPU Unhealthy.
// Then the chart is upgraded to this tree's and downgraded back, applied as
// `helm upgrade` does (the new rendering, and the objects it no longer has
// deleted), in device-plugin and in DRA mode. After each step: the pods keep
// their containers, the kubelet still holds their devices, the XID'd GPU is
// still Unhealthy and the others healthy, and a new pod gets free devices.
// In DRA mode a watch on the node's ResourceSlices fails the step on any
// moment without one (the maxSurge hand-over). Outcomes go to
// .report/upgrade.txt.
const (
	upHeld      = "upgrade-held"        // two GPUs (one gets the XID) and a NUMA 0 NIC
	upHeldOne   = "upgrade-held-one"    // one GPU
	upOneTmpl   = "upgrade-one-gpu"     // DRA: upHeldOne's claim
	upAfter     = "upgrade-after"       // made after each step, then deleted
	upAfterTmpl = "upgrade-gpu-and-nic" // DRA: one GPU and a NUMA 1 NIC
	restoredMsg = "restoring health conditions kept from an earlier run on this boot"
)

var upgradePods = []string{upHeld, upHeldOne, upAfter}

// TestUpgrade runs the lane in DRA mode, then device-plugin mode.
func TestUpgrade(t *testing.T) {
	if env.UpgradeSkip != "" {
		t.Skip(env.UpgradeSkip)
	}
	if env.PreviousImage == "" || env.PreviousChart == "" {
		t.Skip("no previous release on this cluster: E2E_PREVIOUS_IMAGE and E2E_PREVIOUS_CHART are written by " +
			"e2e/cluster/cluster.sh once e2e/cluster/build.sh previous has built it")
	}
	m := &upgradeMatrix{started: time.Now()}
	t.Cleanup(func() { m.report(t) })
	bootID, err := fixtureBootID()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(bootID) })
	for _, mode := range []string{"dra", "device-plugin"} {
		l := &upgradeLane{mode: mode, m: m}
		ok := t.Run(mode, func(t *testing.T) {
			start := time.Now()
			t.Cleanup(func() { m.total(mode, time.Since(start)) })
			l.run(t)
		})
		if !ok {
			t.Errorf("%s mode failed; the matrix is in %s", mode, filepath.Join(env.ReportDir, "upgrade.txt"))
		}
	}
}

// fixtureBootID gives the fixture's proc root (--proc-root) this boot's ID,
// as a node's /proc has: the plugin keeps a fatal XID across its own
// restarts only on the boot it was seen on (internal/state), and without the
// file it keeps nothing. It returns the file, for removal.
func fixtureBootID() (string, error) {
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	p := filepath.Join(env.procRoot(), "sys", "kernel", "random", "boot_id")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	return p, os.WriteFile(p, id, 0o644)
}

// healthStateFile is the chart's stateDir's health.json as this process
// sees it: the node's /var/lib is the directory above the kubelet's.
func healthStateFile() string {
	return filepath.Join(filepath.Dir(filepath.Dir(env.DevicePluginDir)), "gpu-device-plugin", "state", "health.json")
}

type upgradeLane struct {
	mode string
	m    *upgradeMatrix
	// prev and cur are the previous release's chart and this tree's,
	// rendered with the same values; installed is the one applied last.
	prev, cur, installed *release
	plugin               string
	// xidUUID is the held GPU the XID hit; xidDev its DRA device (gpu-N).
	xidUUID, xidDev string
	// containers and uids are the held pods' container IDs and pod UIDs.
	containers, uids map[string]string
	// heldDP is the kubelet checkpoint's devices of each held pod, by
	// resource; heldDRA the devices of each held pod's claims, claims
	// their UIDs.
	heldDP  map[string]map[string][]string
	heldDRA map[string][]string
	claims  map[string][]string
}

func (l *upgradeLane) dra() bool { return l.mode == "dra" }

func (l *upgradeLane) run(t *testing.T) {
	ctx := t.Context()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("plugin logs at failure:%s", pluginLogs(ctx))
		}
		if err := l.cleanUp(ctx); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	runSteps(t, ctx, []step{
		{"the previous release serves the node", l.installPrevious},
		{"pods hold GPUs and a NIC", l.hold},
		{"XID 79 makes a held GPU Unhealthy", l.xid},
		{"upgrade to this tree", l.step("upgrade", func() (*release, *release) { return l.cur, l.prev })},
		{"downgrade to the previous release", l.step("downgrade", func() (*release, *release) { return l.prev, l.cur })},
		{"pods deleted, release uninstalled", l.finish},
	})
}

// values are the suite's chart values for the mode, on image.
func (l *upgradeLane) values(image string) (map[string]any, error) {
	if l.dra() {
		v, err := draValues()
		if err != nil {
			return nil, err
		}
		v["image"] = imageValues(image)
		return v, nil
	}
	v, err := chartValues("envvar")
	if err != nil {
		return nil, err
	}
	operatorValues(v)
	v["image"] = imageValues(image)
	return v, nil
}

func (l *upgradeLane) installPrevious(t *testing.T, ctx context.Context) {
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.cleanUp(ctx); err != nil {
		t.Fatal(err)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		out          **release
		chart, image string
	}{
		{&l.prev, env.PreviousChart, env.PreviousImage},
		{&l.cur, filepath.Join(root, "deploy", "helm", "gpu-device-plugin"), env.PluginImage},
	} {
		v, err := l.values(r.image)
		if err != nil {
			t.Fatal(err)
		}
		if *r.out, err = renderChartDir(r.chart, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.prev.apply(ctx); err != nil {
		t.Fatal(err)
	}
	l.installed = l.prev
	t.Logf("installed %s %s: %s", env.PreviousRelease, env.PreviousImage, l.prev)
	if l.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if l.dra() {
		want := len(env.Profile.GPUs) + l.nics(t)
		if _, err := waitSlices(ctx, fmt.Sprintf("holding %d devices", want), func(d map[string]resourceapi.Device) bool { return len(d) == want }); err != nil {
			t.Fatalf("%v%s", err, pluginLogs(ctx))
		}
		return
	}
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
}

func (l *upgradeLane) nics(t *testing.T) int {
	nics, err := fixtureNICs()
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) == 0 {
		t.Fatal("the fixture has no NICs (e2e/cluster/fixture -nics)")
	}
	return len(nics)
}

func (l *upgradeLane) hold(t *testing.T, ctx context.Context) {
	l.containers, l.uids = map[string]string{}, map[string]string{}
	var pods []*corev1.Pod
	if l.dra() {
		nicClass, err := l.prev.nicClass(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := createTemplate(ctx, alignedTmpl, alignedClaimSpec(nicClass)); err != nil {
			t.Fatal(err)
		}
		if err := createTemplate(ctx, upOneTmpl, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass},
		}}}); err != nil {
			t.Fatal(err)
		}
		// A claim, not nvidia.com/gpu through DRA (TestDRANode's): after
		// the device-plugin lanes the kubelet still knows a device plugin
		// for nvidia.com/gpu for five minutes, and rejects such a pod
		// (UnexpectedAdmissionError: no healthy devices present).
		for _, p := range []*corev1.Pod{claimProbePod(upHeld, alignedTmpl), claimProbePod(upHeldOne, upOneTmpl)} {
			pod, err := createPod(ctx, p, true)
			if err != nil {
				t.Fatal(err)
			}
			pods = append(pods, pod)
		}
	} else {
		limits := corev1.ResourceList{gpuResource: *resource.NewQuantity(2, resource.DecimalSI), nicPool(0): *resource.NewQuantity(1, resource.DecimalSI)}
		for _, p := range []*corev1.Pod{probePodFor(upHeld, limits), probePod(upHeldOne, 1)} {
			pod, err := createPod(ctx, p, true)
			if err != nil {
				t.Fatal(err)
			}
			pods = append(pods, pod)
		}
	}
	for _, p := range pods {
		l.containers[p.Name] = p.Status.ContainerStatuses[0].ContainerID
		l.uids[p.Name] = string(p.UID)
	}
	var err error
	if l.dra() {
		l.heldDRA, l.claims, err = l.draHeld(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(l.heldDRA[upHeld]); n != 3 {
			t.Fatalf("pod %s holds %v, want two GPUs and a NIC", upHeld, l.heldDRA[upHeld])
		}
		t.Logf("held: %v (claims %v)", l.heldDRA, l.claims)
		return
	}
	if l.heldDP, err = l.dpHeld(); err != nil {
		t.Fatal(err)
	}
	if len(l.heldDP[upHeld][string(gpuResource)]) != 2 || len(l.heldDP[upHeld][string(nicPool(0))]) != 1 {
		t.Fatalf("pod %s holds %v in the kubelet's checkpoint, want two GPUs and a NIC", upHeld, l.heldDP[upHeld])
	}
	t.Logf("held: %v", l.heldDP)
}

// draHeld is what the held pods' ResourceClaims hold: our devices and the
// claims' UIDs, by pod.
func (l *upgradeLane) draHeld(ctx context.Context) (devs, uids map[string][]string, err error) {
	devs, uids = map[string][]string{}, map[string][]string{}
	for _, name := range []string{upHeld, upHeldOne} {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		claims, err := podClaims(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range claims {
			if !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
				return nil, nil, fmt.Errorf("claim %s is not reserved for pod %s", c.Name, name)
			}
			uids[name] = append(uids[name], string(c.UID))
		}
		devs[name] = ourDevices(claims)
		slices.Sort(uids[name])
	}
	return devs, uids, nil
}

// kubeletCheckpoint is the kubelet device manager's checkpoint
// (device-plugins/kubelet_internal_checkpoint): the devices it gave each
// pod's containers, and the healthy devices of each resource.
type kubeletCheckpoint struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID       string
			ResourceName string
			DeviceIDs    map[string][]string // by NUMA node
		}
		RegisteredDevices map[string][]string
	}
	written time.Time
}

func readKubeletCheckpoint() (kubeletCheckpoint, error) {
	var c kubeletCheckpoint
	p := filepath.Join(env.DevicePluginDir, "kubelet_internal_checkpoint")
	fi, err := os.Stat(p)
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", p, err)
	}
	c.written = fi.ModTime()
	return c, nil
}

// podDevices are the devices the checkpoint gives pod uid, by resource, sorted.
func (c kubeletCheckpoint) podDevices(uid string) map[string][]string {
	m := map[string][]string{}
	for _, e := range c.Data.PodDeviceEntries {
		if e.PodUID != uid {
			continue
		}
		for _, ids := range e.DeviceIDs {
			m[e.ResourceName] = append(m[e.ResourceName], ids...)
		}
		slices.Sort(m[e.ResourceName])
	}
	return m
}

// dpHeld is the kubelet checkpoint's devices of the held pods.
func (l *upgradeLane) dpHeld() (map[string]map[string][]string, error) {
	c, err := readKubeletCheckpoint()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string][]string{}
	for _, name := range []string{upHeld, upHeldOne} {
		out[name] = c.podDevices(l.uids[name])
	}
	return out, nil
}

func (l *upgradeLane) xid(t *testing.T, ctx context.Context) {
	if l.dra() {
		for _, d := range l.heldDRA[upHeld] {
			if strings.HasPrefix(d, "gpu-") {
				l.xidDev, l.xidUUID = d, uuidOf(d)
				break
			}
		}
	} else {
		l.xidUUID = l.heldDP[upHeld][string(gpuResource)][0]
	}
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if err := ctl.InjectContext(ctx, fmt.Sprintf("xid %d 79", env.uuidIndex()[l.xidUUID])); err != nil {
		t.Fatal(err)
	}
	if l.dra() {
		if _, err := waitSlices(ctx, "tainting "+l.xidDev, func(d map[string]resourceapi.Device) bool { return hasXIDTaint(d[l.xidDev]) }); err != nil {
			t.Fatal(err)
		}
		if _, err := waitPod(ctx, upHeld, time.Minute, l.xidDev+" Unhealthy", func(p *corev1.Pod) (bool, error) {
			return claimHealth(p)[gpuCDIID(l.xidUUID)].Health == "Unhealthy", nil
		}); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs))-1, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := waitPod(ctx, upHeld, time.Minute, l.xidUUID+" Unhealthy", func(p *corev1.Pod) (bool, error) {
			return allocatedGPUs(p)[l.xidUUID] == "Unhealthy", nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The previous release kept it for its successor.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		b, err := os.ReadFile(healthStateFile())
		return err == nil && bytes.Contains(b, []byte(l.xidUUID)), nil
	})
	if err != nil {
		b, _ := os.ReadFile(healthStateFile())
		t.Fatalf("the previous release did not keep the XID in %s (%s): %v", healthStateFile(), b, err)
	}
	t.Logf("XID 79 on %s (%s): Unhealthy, kept in %s", l.xidUUID, l.xidDev, healthStateFile())
}

func hasXIDTaint(d resourceapi.Device) bool {
	return slices.ContainsFunc(d.Taints, func(tt resourceapi.DeviceTaint) bool {
		return tt.Key == draDriver+"/xid" && tt.Value == "79" && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
}

func gpuCDIID(uuid string) string { return "gpu-device-plugin.github.io/gpu=" + uuid }

// step moves the node from one rendering to the other (releases gives
// them: to, from) and checks what must hold after it.
func (l *upgradeLane) step(dir string, releases func() (to, from *release)) func(*testing.T, context.Context) {
	return func(t *testing.T, ctx context.Context) {
		to, from := releases()
		var sw *sliceWatch
		var nw *allocatableWatch
		if l.dra() {
			var err error
			if sw, err = startSliceWatch(ctx, l.xidDev); err != nil {
				t.Fatal(err)
			}
			defer sw.stop()
		} else {
			nw = startAllocatableWatch(ctx)
			defer nw.stop()
		}
		pw, err := startPluginPodWatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pw.stop()
		start := time.Now()
		c := &stepChecks{t: t, l: l, dir: dir, start: start}
		old := l.plugin
		pruned, err := to.upgradeFrom(ctx, from)
		l.installed = to
		if err != nil {
			t.Fatalf("applying the %s: %v", dir, err)
		}
		if !c.check("rollout: the new plugin pod runs, the old one is gone", func() (string, error) {
			name, err := waitPluginRunning(ctx, old)
			if err != nil {
				return "", err
			}
			l.plugin = name
			p, err := k8s.kube.CoreV1().Pods(releaseNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			image := p.Spec.Containers[0].Image
			if want := to.image(); image != want {
				return "", fmt.Errorf("pod %s runs %s, want %s", name, image, want)
			}
			note := fmt.Sprintf("%s -> %s (%s); objects deleted: %d %v", old, name, image, len(pruned), pruned)
			if nw != nil {
				// The kubelet serves the new pod's devices once it registers.
				if err := socketNewerThan(ctx, start); err != nil {
					return note, err
				}
				note += fmt.Sprintf("; registered at +%.1fs", time.Since(start).Seconds())
			}
			return note, nil
		}) {
			t.FailNow()
		}
		pw.stop()
		if l.dra() {
			c.check("hand-over: the new pod ran beside the old one (maxSurge)", func() (string, error) {
				n, note := pw.verdict()
				if n < 2 {
					return note, fmt.Errorf("never two plugin pods at once: no surge")
				}
				return note, nil
			})
		} else {
			_, note := pw.verdict()
			c.fig("%s", note)
		}
		c.check("the new plugin restored the XID kept by the one before", func() (string, error) {
			return waitLog(ctx, l.plugin, restoredMsg)
		})
		if l.dra() {
			var published time.Time
			c.check("the new plugin published its devices (every source reported)", func() (string, error) {
				var err error
				published, err = l.sourcesReported(ctx)
				return fmt.Sprintf("at +%.1fs", published.Sub(start).Seconds()), err
			})
			l.draChecks(ctx, c, sw)
			c.check("ResourceSlices published throughout (watch)", func() (string, error) {
				// The slice controller syncs after the publication,
				// asynchronously, and writes nothing when the slices
				// already say what it would: nothing signals "synced".
				// The watch runs on for a settle window after it.
				if d := time.Until(published.Add(sliceSettle)); d > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(d):
					}
				}
				sw.stop()
				note, err := sw.verdict()
				return fmt.Sprintf("%s; watched until %.1fs after the publication", note, time.Since(published).Seconds()), err
			})
			// This tree reads the taints its node already published and
			// keeps their time; the previous release restamps them once.
			added, restamps := sw.xidTimeAdded()
			if dir == "upgrade" {
				c.check("the XID taint keeps its timeAdded (no slice rewrite for it)", func() (string, error) {
					if len(restamps) > 0 {
						return strings.Join(restamps, "; "), fmt.Errorf("the XID taint was restamped: %s", strings.Join(restamps, "; "))
					}
					return "timeAdded " + added, nil
				})
			} else {
				c.fig("XID taint timeAdded %s, changes %v (the previous release restamps it)", added, restamps)
			}
		} else {
			l.dpChecks(ctx, c)
			nw.stop()
			c.fig("allocatable nvidia.com/gpu below %d for %s during the step (lowest %d; sampled every 250ms)",
				len(env.Profile.GPUs)-1, nw.below(int64(len(env.Profile.GPUs)-1)).Round(time.Millisecond), nw.lowest())
		}
	}
}

// pluginPodWatch follows the release's pods through a watch and keeps the
// most that ran at once (phase Running, terminating or not).
type pluginPodWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	most   int
	seen   []string
}

func startPluginPodWatch(ctx context.Context) (*pluginPodWatch, error) {
	wi, err := k8s.kube.CoreV1().Pods(releaseNamespace).Watch(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + releaseName + ",app.kubernetes.io/name=gpu-device-plugin",
	})
	if err != nil {
		return nil, err
	}
	w := &pluginPodWatch{done: make(chan struct{})}
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		defer wi.Stop()
		running := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					return
				}
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				running[p.Name] = ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning
				n := 0
				for _, r := range running {
					if r {
						n++
					}
				}
				w.mu.Lock()
				w.most = max(w.most, n)
				if !slices.Contains(w.seen, p.Name) {
					w.seen = append(w.seen, p.Name)
				}
				w.mu.Unlock()
			}
		}
	}()
	return w, nil
}

func (w *pluginPodWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

func (w *pluginPodWatch) verdict() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, fmt.Sprintf("plugin pods %v, at most %d running at once", w.seen, w.most)
}

// image is the plugin image r's DaemonSet runs.
func (r *release) image() string {
	for _, u := range r.objects {
		if u.GetKind() != "DaemonSet" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		if len(cs) > 0 {
			if c, ok := cs[0].(map[string]any); ok {
				img, _ := c["image"].(string)
				return img
			}
		}
	}
	return ""
}

// sliceSettle is how long the slice watch runs on after the new plugin
// published: its slice controller's sync takes milliseconds here.
const sliceSettle = 2 * time.Second

// sourcesReported waits until the plugin pod logged the first report of
// every NIC pool ("NIC pool", which both releases log once each pool has
// been handed to the DRA driver, its GPUs having reported before): from
// then on the driver publishes every device. It returns the last one's time.
func (l *upgradeLane) sourcesReported(ctx context.Context) (time.Time, error) {
	var last time.Time
	pools := map[string]bool{}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := k8s.kube.CoreV1().Pods(releaseNamespace).GetLogs(l.plugin, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		for _, line := range strings.Split(string(out), "\n") {
			var e struct {
				Time     time.Time `json:"time"`
				Msg      string    `json:"msg"`
				Resource string    `json:"resource"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "NIC pool" && !pools[e.Resource] {
				pools[e.Resource] = true
				last = e.Time
			}
		}
		return pools[string(nicPool(0))] && pools[string(nicPool(1))], nil
	})
	if err != nil {
		return last, fmt.Errorf("plugin pod %s logged the first report of pools %v only: %w", l.plugin, sortedKeys(pools), err)
	}
	return last, nil
}

// stepChecks records each check of a step in the matrix.
type stepChecks struct {
	t     *testing.T
	l     *upgradeLane
	dir   string
	start time.Time
}

// check runs f, records its outcome, its note and when it passed (since
// the step's apply), and fails the test on its error.
func (c *stepChecks) check(name string, f func() (string, error)) bool {
	c.t.Helper()
	note, err := f()
	o := upgradeOutcome{mode: c.l.mode, dir: c.dir, check: name, pass: err == nil, at: time.Since(c.start), note: note}
	if err != nil {
		o.note = strings.TrimSpace(note + " " + firstLine(err.Error()))
		c.t.Errorf("%s: %s: %v", c.dir, name, err)
	} else {
		c.t.Logf("%s: %s: pass at +%.1fs: %s", c.dir, name, o.at.Seconds(), note)
	}
	c.l.m.add(o)
	return err == nil
}

func (c *stepChecks) fig(format string, args ...any) {
	line := fmt.Sprintf("%s %s: ", c.l.mode, c.dir) + fmt.Sprintf(format, args...)
	c.t.Log(line)
	c.l.m.figure(line)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// waitLog waits for a line of pod's log whose msg is msg, and returns it.
func waitLog(ctx context.Context, pod, msg string) (string, error) {
	var found string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := k8s.kube.CoreV1().Pods(releaseNamespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		for _, line := range strings.Split(string(out), "\n") {
			var e struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == msg {
				found = line
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("plugin pod %s never logged %q: %w", pod, msg, err)
	}
	return found, nil
}

// heldPodsIntact checks the held pods run in the containers they started in.
func (l *upgradeLane) heldPodsIntact(ctx context.Context) (string, error) {
	var notes []string
	for _, name := range []string{upHeld, upHeldOne} {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		cs := p.Status.ContainerStatuses
		if p.Status.Phase != corev1.PodRunning || len(cs) != 1 || cs[0].State.Running == nil {
			return "", fmt.Errorf("pod %s is no longer running:%s", name, describePod(ctx, p))
		}
		if cs[0].ContainerID != l.containers[name] || cs[0].RestartCount != 0 {
			return "", fmt.Errorf("pod %s's container is %s with %d restarts, was %s", name, cs[0].ContainerID, cs[0].RestartCount, l.containers[name])
		}
		notes = append(notes, fmt.Sprintf("%s %s restarts 0", name, shortID(cs[0].ContainerID)))
	}
	return strings.Join(notes, ", "), nil
}

func shortID(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		id = id[i+3:]
	}
	return id[:min(len(id), 12)]
}

func (l *upgradeLane) dpChecks(ctx context.Context, c *stepChecks) {
	total := len(env.Profile.GPUs)
	c.check("workload pods keep their containers", func() (string, error) { return l.heldPodsIntact(ctx) })
	var sock time.Time
	if fi, err := os.Stat(filepath.Join(env.DevicePluginDir, pluginSocket)); err == nil {
		sock = fi.ModTime()
	}
	c.check("XID'd GPU stays Unhealthy (kubelet's registered devices, allocatable, pod status)", func() (string, error) {
		// The kubelet rewrites its checkpoint at each device list a plugin
		// sends, with the healthy devices: the first from the new pod
		// must leave the XID'd GPU out. One listing it is a window in
		// which the kubelet would admit a pod to it.
		var reg []string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			cp, err := readKubeletCheckpoint()
			if err != nil || cp.written.Before(sock) {
				return false, nil
			}
			reg = cp.Data.RegisteredDevices[string(gpuResource)]
			if slices.Contains(reg, l.xidUUID) {
				return false, fmt.Errorf("the kubelet has %s healthy from the new plugin (%d registered): the XID was forgotten", l.xidUUID, len(reg))
			}
			return len(reg) == total-1, nil
		})
		if err != nil {
			return "", fmt.Errorf("kubelet's healthy nvidia.com/gpu %v: %w", reg, err)
		}
		if _, err := waitPod(ctx, upHeld, time.Minute, l.xidUUID+" Unhealthy", func(p *corev1.Pod) (bool, error) {
			if h := allocatedGPUs(p)[l.xidUUID]; h == "Healthy" {
				return false, fmt.Errorf("pod %s shows %s Healthy", upHeld, l.xidUUID)
			}
			return allocatedGPUs(p)[l.xidUUID] == "Unhealthy", nil
		}); err != nil {
			return "", err
		}
		if err := waitAllocatable(ctx, int64(total-1), time.Minute); err != nil {
			return "", err
		}
		return fmt.Sprintf("kubelet: %d healthy, %s not among them; allocatable %d", len(reg), l.xidUUID, total-1), nil
	})
	c.check("healthy GPUs and NICs stay healthy", func() (string, error) {
		var got map[string]int
		want := map[string]int{string(gpuResource): total - 1, string(nicPool(0)): 4, string(nicPool(1)): 4}
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			got = map[string]int{}
			for r := range want {
				q := n.Status.Allocatable[corev1.ResourceName(r)]
				got[r] = int(q.Value())
			}
			return maps.Equal(got, want), nil
		})
		if err != nil {
			return "", fmt.Errorf("allocatable %v, want %v: %w", got, want, err)
		}
		others := map[string]corev1.ResourceHealthStatus{}
		for _, name := range []string{upHeld, upHeldOne} {
			for _, id := range l.heldDP[name][string(gpuResource)] {
				if id != l.xidUUID {
					others[id] = "Healthy"
				}
			}
		}
		for _, name := range []string{upHeld, upHeldOne} {
			if _, err := waitPod(ctx, name, time.Minute, "showing its healthy GPUs Healthy", func(p *corev1.Pod) (bool, error) {
				for id, h := range allocatedGPUs(p) {
					if want, ok := others[id]; ok && h != want {
						return false, nil
					}
				}
				return true, nil
			}); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("allocatable %v; held healthy GPUs Healthy in pod status", got), nil
	})
	c.check("held devices stay held (kubelet checkpoint)", func() (string, error) {
		now, err := l.dpHeld()
		if err != nil {
			return "", err
		}
		for name, want := range l.heldDP {
			if fmt.Sprint(now[name]) != fmt.Sprint(want) {
				return "", fmt.Errorf("pod %s holds %v, held %v", name, now[name], want)
			}
		}
		return fmt.Sprint(now[upHeld]), nil
	})
	c.check("a new pod runs and gets free devices", func() (string, error) {
		limits := corev1.ResourceList{gpuResource: *resource.NewQuantity(2, resource.DecimalSI), nicPool(0): *resource.NewQuantity(1, resource.DecimalSI)}
		pod, err := createPod(ctx, probePodFor(upAfter, limits), true)
		if err != nil {
			return "", err
		}
		cp, err := readKubeletCheckpoint()
		if err != nil {
			return "", err
		}
		got := cp.podDevices(string(pod.UID))
		for r, ids := range got {
			for _, id := range ids {
				if id == l.xidUUID {
					return "", fmt.Errorf("pod %s got the XID'd GPU %s", upAfter, id)
				}
				for held, devs := range l.heldDP {
					if slices.Contains(devs[r], id) {
						return "", fmt.Errorf("pod %s got %s, which pod %s holds", upAfter, id, held)
					}
				}
			}
		}
		if len(got[string(gpuResource)]) != 2 || len(got[string(nicPool(0))]) != 1 {
			return "", fmt.Errorf("pod %s got %v", upAfter, got)
		}
		rep, err := probeOutput(ctx, upAfter)
		if err != nil {
			return "", err
		}
		visible := strings.Split(rep.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		slices.Sort(visible)
		if !slices.Equal(visible, got[string(gpuResource)]) {
			return "", fmt.Errorf("pod %s sees %v, was given %v", upAfter, visible, got[string(gpuResource)])
		}
		if err := deletePods(ctx, upAfter); err != nil {
			return "", err
		}
		return fmt.Sprint(got), nil
	})
}

func (l *upgradeLane) draChecks(ctx context.Context, c *stepChecks, sw *sliceWatch) {
	c.check("workload pods keep their containers", func() (string, error) { return l.heldPodsIntact(ctx) })
	c.check("XID'd GPU stays Unhealthy (slice taint, pod status)", func() (string, error) {
		// The slice watch fails the step on any moment the device was
		// published untainted (and says so here at once); then the end state.
		if u := sw.untaintedAt(); len(u) > 0 {
			return "", fmt.Errorf("%s published without its XID taint at %v", l.xidDev, u)
		}
		if _, err := waitSlices(ctx, l.xidDev+" tainted", func(d map[string]resourceapi.Device) bool { return hasXIDTaint(d[l.xidDev]) }); err != nil {
			return "", err
		}
		if _, err := waitPod(ctx, upHeld, time.Minute, l.xidDev+" Unhealthy", func(p *corev1.Pod) (bool, error) {
			h := claimHealth(p)[gpuCDIID(l.xidUUID)].Health
			if h == "Healthy" {
				return false, fmt.Errorf("pod %s shows %s Healthy", upHeld, l.xidDev)
			}
			return h == "Unhealthy", nil
		}); err != nil {
			return "", err
		}
		return l.xidDev + " tainted xid=79:NoSchedule, Unhealthy in pod status", nil
	})
	c.check("healthy devices stay healthy (slices, pod status)", func() (string, error) {
		want := len(env.Profile.GPUs) + len(mustNICs())
		var bad []string
		_, err := waitSlices(ctx, fmt.Sprintf("holding %d devices, only %s tainted", want, l.xidDev), func(d map[string]resourceapi.Device) bool {
			bad = nil
			for name, dev := range d {
				if name != l.xidDev && len(dev.Taints) > 0 {
					bad = append(bad, name)
				}
			}
			return len(d) == want && len(bad) == 0
		})
		if err != nil {
			return "", fmt.Errorf("tainted: %v: %w", bad, err)
		}
		var other string
		for _, d := range l.heldDRA[upHeld] {
			if strings.HasPrefix(d, "gpu-") && d != l.xidDev {
				other = d
			}
		}
		if _, err := waitPod(ctx, upHeld, time.Minute, other+" Healthy", func(p *corev1.Pod) (bool, error) {
			return claimHealth(p)[gpuCDIID(uuidOf(other))].Health == "Healthy", nil
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d devices, only %s tainted; %s Healthy in pod status", want, l.xidDev, other), nil
	})
	c.check("held devices stay held (ResourceClaims, kubelet and plugin checkpoints)", func() (string, error) {
		devs, uids, err := l.draHeld(ctx)
		if err != nil {
			return "", err
		}
		if fmt.Sprint(devs) != fmt.Sprint(l.heldDRA) || fmt.Sprint(uids) != fmt.Sprint(l.claims) {
			return "", fmt.Errorf("claims hold %v (%v), held %v (%v)", devs, uids, l.heldDRA, l.claims)
		}
		var want []string
		for _, u := range l.claims {
			want = append(want, u...)
		}
		slices.Sort(want)
		ours, err := checkpointClaims()
		if err != nil {
			return "", err
		}
		if !slices.Equal(ours, want) {
			return "", fmt.Errorf("the plugin's checkpoint holds %v, want %v", ours, want)
		}
		kubelet, err := os.ReadFile(filepath.Join(filepath.Dir(env.DevicePluginDir), "dra_manager_state"))
		if err != nil {
			return "", err
		}
		for _, u := range want {
			if !bytes.Contains(kubelet, []byte(u)) {
				return "", fmt.Errorf("the kubelet's dra_manager_state lacks claim %s", u)
			}
		}
		return fmt.Sprintf("%v; both checkpoints hold the %d claims", devs, len(want)), nil
	})
	c.check("a new pod runs and gets free devices", func() (string, error) {
		nicClass, err := l.installed.nicClass(1)
		if err != nil {
			return "", err
		}
		if err := createTemplate(ctx, upAfterTmpl, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass}},
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicClass}},
		}}); err != nil {
			return "", err
		}
		pod, err := createPod(ctx, claimProbePod(upAfter, upAfterTmpl), true)
		if err != nil {
			return "", err
		}
		claims, err := podClaims(ctx, pod)
		if err != nil {
			return "", err
		}
		got := ourDevices(claims)
		if len(got) != 2 {
			return "", fmt.Errorf("pod %s got %v, want a GPU and a NIC", upAfter, got)
		}
		var gpu string
		for _, d := range got {
			if d == l.xidDev {
				return "", fmt.Errorf("pod %s got the XID'd GPU %s", upAfter, d)
			}
			for held, devs := range l.heldDRA {
				if slices.Contains(devs, d) {
					return "", fmt.Errorf("pod %s got %s, which pod %s holds", upAfter, d, held)
				}
			}
			if strings.HasPrefix(d, "gpu-") {
				gpu = d
			}
		}
		rep, err := probeOutput(ctx, upAfter)
		if err != nil {
			return "", err
		}
		if got := rep.Env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
			return "", fmt.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void (CDI)", got)
		}
		if !slices.Contains(rep.devicePaths(), fmt.Sprintf("/dev/nvidia%d", env.Profile.GPUs[env.uuidIndex()[uuidOf(gpu)]].Minor)) {
			return "", fmt.Errorf("pod %s lacks %s's device node: %v", upAfter, gpu, rep.devicePaths())
		}
		if err := deletePods(ctx, upAfter); err != nil {
			return "", err
		}
		// Unprepared by the release now serving: the checkpoint holds the
		// held pods' claims only again.
		var left []string
		err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			left, err = checkpointClaims()
			return err == nil && len(left) == len(l.claims[upHeld])+len(l.claims[upHeldOne]), nil
		})
		if err != nil {
			return "", fmt.Errorf("the plugin's checkpoint holds %v after pod %s went: %w", left, upAfter, err)
		}
		return fmt.Sprintf("%v; unprepared when deleted", got), nil
	})
}

func mustNICs() []fixtureNIC {
	n, _ := fixtureNICs()
	return n
}

func (l *upgradeLane) finish(t *testing.T, ctx context.Context) {
	c := &stepChecks{t: t, l: l, dir: "downgrade", start: time.Now()}
	if l.dra() {
		c.check("held pods deleted: their claims unprepared", func() (string, error) {
			if err := deletePods(ctx, upgradePods...); err != nil {
				return "", err
			}
			var left []string
			err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				var err error
				left, err = checkpointClaims()
				return err == nil && len(left) == 0, nil
			})
			if err != nil {
				return "", fmt.Errorf("the plugin's checkpoint still holds %v: %w", left, err)
			}
			return "checkpoint empty", nil
		})
	}
	if err := l.cleanUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// cleanUp removes what the lane makes: pods, templates, both renderings'
// objects, the slices, the CDI specs and the kept health.
func (l *upgradeLane) cleanUp(ctx context.Context) error {
	errs := []error{deletePods(ctx, upgradePods...)}
	for _, n := range []string{alignedTmpl, upOneTmpl, upAfterTmpl} {
		if err := k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	for _, r := range []*release{l.installed, l.prev, l.cur} {
		if r != nil {
			errs = append(errs, r.uninstall(ctx))
		}
	}
	if l.installed == nil {
		// Before this lane rendered anything: what an interrupted run left.
		if v, err := l.values(env.PluginImage); err == nil {
			if r, err := renderValues(v); err == nil {
				errs = append(errs, r.uninstall(ctx))
			}
		}
	}
	l.installed = nil
	if l.dra() {
		// The kubelet wipes a gone driver's slices 30 s after it
		// unregistered; the next lane need not wait for it.
		errs = append(errs, k8s.kube.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
			FieldSelector: "spec.driver=" + draDriver + ",spec.nodeName=" + env.Node,
		}))
	}
	errs = append(errs, removeSpecs())
	// This tree's remediation, on by default, keeps the GPU the XID made
	// fall off the bus out until a reboot: the next lane's node is a fresh
	// one.
	for _, f := range []string{healthStateFile(), remediationStateFile()} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sliceWatch follows the node's ResourceSlices of our driver through a
// watch (every change, not samples): moments with none, the fewest
// devices, and any version publishing the XID'd device without its taint.
type sliceWatch struct {
	xidDev string
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	slices     map[string]*resourceapi.ResourceSlice
	events     int
	relists    int
	empty      int
	emptyFor   time.Duration
	emptySince time.Time
	fewest     int
	untainted  []string
	xidAdded   string   // the XID taint's timeAdded when first seen
	restamps   []string // later changes of it
	changes    []string
	err        error
	started    time.Time
}

func startSliceWatch(ctx context.Context, xidDev string) (*sliceWatch, error) {
	w := &sliceWatch{xidDev: xidDev, done: make(chan struct{}), started: time.Now(), fewest: -1}
	rv, err := w.relist(ctx)
	if err != nil {
		return nil, err
	}
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			wi, err := k8s.kube.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{
				FieldSelector:       "spec.driver=" + draDriver + ",spec.nodeName=" + env.Node,
				ResourceVersion:     rv,
				AllowWatchBookmarks: true,
			})
			if err == nil {
				rv = w.follow(wi)
			}
			if ctx.Err() != nil {
				return
			}
			// The watch ended (a timeout, or its resourceVersion is too
			// old): list again, counted, and go on from there.
			w.mu.Lock()
			w.relists++
			w.mu.Unlock()
			if rv, err = w.relist(ctx); err != nil && ctx.Err() == nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
		}
	}()
	return w, nil
}

func (w *sliceWatch) relist(ctx context.Context) (string, error) {
	l, err := k8s.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + draDriver + ",spec.nodeName=" + env.Node,
	})
	if err != nil {
		return "", err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.slices = map[string]*resourceapi.ResourceSlice{}
	for i := range l.Items {
		w.slices[l.Items[i].Name] = &l.Items[i]
	}
	w.observe()
	return l.ResourceVersion, nil
}

// follow applies the watch's events until it ends; it returns the last
// resourceVersion seen.
func (w *sliceWatch) follow(wi watch.Interface) string {
	defer wi.Stop()
	var rv string
	for ev := range wi.ResultChan() {
		s, ok := ev.Object.(*resourceapi.ResourceSlice)
		if !ok {
			return rv // an error event: list again
		}
		rv = s.ResourceVersion
		w.mu.Lock()
		prev := w.slices[s.Name]
		switch ev.Type {
		case watch.Added, watch.Modified:
			w.slices[s.Name] = s
		case watch.Deleted:
			delete(w.slices, s.Name)
		}
		if ev.Type != watch.Bookmark {
			w.events++
			if len(w.changes) < 10 {
				w.changes = append(w.changes, fmt.Sprintf("+%.2fs %s %s (pool generation %d, %d devices%s)",
					time.Since(w.started).Seconds(), ev.Type, s.Name, s.Spec.Pool.Generation, len(s.Spec.Devices), sliceDiff(prev, s)))
			}
			w.observe()
		}
		w.mu.Unlock()
	}
	return rv
}

// sliceDiff says what changed from a to b: each changed device and its
// changed fields, before -> after.
func sliceDiff(a, b *resourceapi.ResourceSlice) string {
	if a == nil || b == nil {
		return ""
	}
	index := func(s *resourceapi.ResourceSlice) map[string]map[string]json.RawMessage {
		m := map[string]map[string]json.RawMessage{}
		for _, d := range s.Spec.Devices {
			raw, _ := json.Marshal(d)
			var fields map[string]json.RawMessage
			json.Unmarshal(raw, &fields)
			m[d.Name] = fields
		}
		return m
	}
	before, after := index(a), index(b)
	var out []string
	for _, name := range sortedKeys(after) {
		for _, f := range sortedKeys(after[name]) {
			if !bytes.Equal(before[name][f], after[name][f]) {
				out = append(out, fmt.Sprintf("%s.%s %s -> %s", name, f, before[name][f], after[name][f]))
			}
		}
		for _, f := range sortedKeys(before[name]) {
			if _, ok := after[name][f]; !ok {
				out = append(out, fmt.Sprintf("%s.%s %s -> none", name, f, before[name][f]))
			}
		}
	}
	if len(out) == 0 {
		return "; devices unchanged"
	}
	return "; " + strings.Join(out, "; ")
}

// observe looks at the slices as they are now; w.mu held.
func (w *sliceWatch) observe() {
	now := time.Now()
	devs := 0
	for _, s := range w.slices {
		for _, d := range s.Spec.Devices {
			devs++
			if d.Name == w.xidDev && !hasXIDTaint(d) {
				w.untainted = append(w.untainted, fmt.Sprintf("+%.2fs in %s", now.Sub(w.started).Seconds(), s.Name))
			}
			if d.Name == w.xidDev {
				w.noteXIDAdded(d, now)
			}
		}
	}
	if w.fewest < 0 || devs < w.fewest {
		w.fewest = devs
	}
	switch {
	case len(w.slices) == 0 && w.emptySince.IsZero():
		w.empty++
		w.emptySince = now
	case len(w.slices) > 0 && !w.emptySince.IsZero():
		w.emptyFor += now.Sub(w.emptySince)
		w.emptySince = time.Time{}
	}
}

// noteXIDAdded records the XID taint's timeAdded, and any change of it;
// w.mu held.
func (w *sliceWatch) noteXIDAdded(d resourceapi.Device, now time.Time) {
	for _, tt := range d.Taints {
		if !(tt.Key == draDriver+"/xid" && tt.Value == "79") || tt.TimeAdded == nil {
			continue
		}
		at := tt.TimeAdded.UTC().Format(time.RFC3339)
		switch {
		case w.xidAdded == "":
			w.xidAdded = at
		case at != w.xidAdded && !strings.HasSuffix(strings.Join(w.restamps, ""), at):
			w.restamps = append(w.restamps, fmt.Sprintf("+%.2fs %s -> %s", now.Sub(w.started).Seconds(), w.xidAdded, at))
		}
	}
}

// xidTimeAdded is the XID taint's first timeAdded and its changes since.
func (w *sliceWatch) xidTimeAdded() (string, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.xidAdded, slices.Clone(w.restamps)
}

func (w *sliceWatch) untaintedAt() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.untainted)
}

func (w *sliceWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

// verdict fails on any moment without a slice or with the XID'd device
// untainted; its note gives what the watch saw.
func (w *sliceWatch) verdict() (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.emptySince.IsZero() {
		w.emptyFor += time.Since(w.emptySince)
	}
	note := fmt.Sprintf("%d slice events over %.1fs %v, %d relists; fewest devices published %d", w.events,
		time.Since(w.started).Seconds(), w.changes, w.relists, w.fewest)
	var errs []error
	if w.err != nil {
		errs = append(errs, fmt.Errorf("the watch failed: %w", w.err))
	}
	if w.empty > 0 {
		errs = append(errs, fmt.Errorf("no ResourceSlice %d times, %s in all", w.empty, w.emptyFor.Round(time.Millisecond)))
	}
	if len(w.untainted) > 0 {
		errs = append(errs, fmt.Errorf("%s published without its XID taint at %v", w.xidDev, w.untainted))
	}
	return note, errors.Join(errs...)
}

// allocatableWatch samples the node's allocatable nvidia.com/gpu every
// 250 ms, for the figure of how long a step took GPUs away.
type allocatableWatch struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	samples []nodeSample
}

func startAllocatableWatch(ctx context.Context) *allocatableWatch {
	w := &allocatableWatch{done: make(chan struct{})}
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			if c, a, err := nodeGPUs(ctx); err == nil {
				w.mu.Lock()
				w.samples = append(w.samples, nodeSample{at: time.Now(), capacity: c, allocatable: a})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *allocatableWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

// below is how long allocatable was under want.
func (w *allocatableWatch) below(want int64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for i := 1; i < len(w.samples); i++ {
		if w.samples[i-1].allocatable < want {
			d += w.samples[i].at.Sub(w.samples[i-1].at)
		}
	}
	return d
}

func (w *allocatableWatch) lowest() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	low := int64(-1)
	for _, s := range w.samples {
		if low < 0 || s.allocatable < low {
			low = s.allocatable
		}
	}
	return low
}

// upgradeMatrix is the lane's outcome: mode x direction x check.
type upgradeMatrix struct {
	mu       sync.Mutex
	started  time.Time
	outcomes []upgradeOutcome
	figures  []string
	totals   []string
}

type upgradeOutcome struct {
	mode, dir, check string
	pass             bool
	at               time.Duration
	note             string
}

func (m *upgradeMatrix) add(o upgradeOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.outcomes = append(m.outcomes, o)
}

func (m *upgradeMatrix) figure(line string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.figures = append(m.figures, line)
}

func (m *upgradeMatrix) total(mode string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.totals = append(m.totals, fmt.Sprintf("%s mode %s", mode, d.Round(time.Second)))
}

// report appends the matrix to .report/upgrade.txt and logs it.
func (m *upgradeMatrix) report(t *testing.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b bytes.Buffer
	now := time.Now().UTC().Format(time.RFC3339)
	fmt.Fprintf(&b, "%s TestUpgrade: previous %s (%s, its own chart), current %s (this tree); %s; lane %s\n",
		now, env.PreviousRelease, env.PreviousImage, env.PluginImage, strings.Join(m.totals, ", "), time.Since(m.started).Round(time.Second))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tdirection\tcheck\tresult\tat\tnote")
	for _, o := range m.outcomes {
		res := "pass"
		if !o.pass {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t+%.1fs\t%s\n", o.mode, o.dir, o.check, res, o.at.Seconds(), o.note)
	}
	tw.Flush()
	for _, f := range m.figures {
		fmt.Fprintln(&b, f)
	}
	t.Logf("upgrade matrix:\n%s", b.String())
	if env.ReportDir == "" {
		return
	}
	if err := os.MkdirAll(env.ReportDir, 0o755); err != nil {
		t.Log(err)
		return
	}
	f, err := os.OpenFile(filepath.Join(env.ReportDir, "upgrade.txt"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Log(err)
		return
	}
	defer f.Close()
	f.Write(b.Bytes())
}

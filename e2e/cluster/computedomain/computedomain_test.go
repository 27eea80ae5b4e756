package computedomain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

const (
	jobDomain   = "training"
	jobTemplate = "training-channel"
	bigDomain   = "too-big"
	// retryEvery is how often the test, as the kubelet, retries a Prepare
	// that failed.
	retryEvery = 500 * time.Millisecond
)

func TestComputeDomain(t *testing.T) {
	c := loadCluster(t)
	ctx := t.Context()
	dir := t.TempDir()
	r := &report{}
	laneStart := time.Now()

	// Four nodes in clique A, two in clique B.
	var nodes []*node
	for i := range 4 {
		nodes = append(nodes, &node{name: fmt.Sprintf("cd-a%d", i), ip: fmt.Sprintf("127.0.0.%d", 21+i), clique: cliqueA})
	}
	for i := range 2 {
		nodes = append(nodes, &node{name: fmt.Sprintf("cd-b%d", i), ip: fmt.Sprintf("127.0.0.%d", 31+i), clique: cliqueB})
	}
	job, other := nodes[:4], nodes[4]

	bins := build(t, dir)
	profs := profiles(t, dir)
	undoAPI := installAPI(ctx, t, c)
	if err := createNodes(ctx, c, nodes); err != nil {
		t.Fatal(err)
	}
	if err := deleteNamespace(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := deleteNamespace(ctx, c); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
		if err := deleteNodes(ctx, c); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
		undoAPI(ctx)
	})

	started := time.Now()
	for _, n := range nodes {
		startNode(t, c, bins, profs[n.clique], n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			if err := n.plugin.Stop(); err != nil {
				t.Errorf("node %s: %v", n.name, err)
			}
			if t.Failed() {
				t.Logf("node %s's plugin log (last 6000 bytes):\n%s", n.name, tail(n.plugin.Log(), 6000))
			}
		}
		// Whatever a plugin left running is ours: end it by its PID.
		left, _ := imexProcesses(nodes)
		for pid, name := range left {
			t.Errorf("node %s: nvidia-imex %d still runs after its plugin stopped; killed", name, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	kubelets := map[string]*kubelet{}
	for _, n := range nodes {
		if err := awaitChannel(ctx, c, n); err != nil {
			t.Fatalf("%v\n%s", err, tail(n.plugin.Log(), 4000))
		}
		k, err := dialPlugin(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.conn.Close() })
		kubelets[n.name] = k
	}
	r.published = time.Since(started)
	startController(t, c, bins.plugin)

	// An unsatisfiable domain: more nodes than the largest clique has.
	if _, err := createDomain(ctx, c, bigDomain, "too-big-channel", 5); err != nil {
		t.Fatal(err)
	}
	// The job's domain, followed from its creation.
	created := time.Now()
	uid, err := createDomain(ctx, c, jobDomain, jobTemplate, 4)
	if err != nil {
		t.Fatal(err)
	}
	tl := follow(ctx, c, jobDomain)
	tmpl, err := awaitTemplate(ctx, c, jobTemplate)
	if err != nil {
		t.Fatal(err)
	}
	r.template = time.Since(created)
	claims := map[string]*resourceapi.ResourceClaim{}
	for i, n := range job {
		if claims[n.name], err = allocateClaim(ctx, c, tmpl, fmt.Sprintf("worker-%d", i), n.name); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("unsatisfiable domain says so in status and a Warning Event", func(t *testing.T) {
		st, err := awaitDomain(ctx, c, bigDomain, 30*time.Second, "TooManyNodes", func(s domainStatus) bool { return s.Reason == "TooManyNodes" })
		if err != nil {
			t.Fatal(err)
		}
		if st.Status != "NotReady" || !strings.Contains(st.Message, "5") || !strings.Contains(st.Message, cliqueID(cliqueA)) || !strings.Contains(st.Message, "4 nodes") {
			t.Errorf("status = %s; want NotReady, a message naming numNodes 5 and clique %s's 4 nodes", st, cliqueID(cliqueA))
		}
		ev, err := awaitEvent(ctx, c, bigDomain, corev1.EventTypeWarning, "TooManyNodes")
		if err != nil {
			t.Fatal(err)
		}
		if ev.Message != st.Message {
			t.Errorf("Event message %q, want the status's %q", ev.Message, st.Message)
		}
		r.tooBig = st.Message
	})

	// The job: Prepare on its four nodes, retried as the kubelet does,
	// fails until the domain is Ready, then gives each the same channel.
	t.Run("four pods in one clique get the same channel once the daemons are ready", func(t *testing.T) {
		prepStart := time.Now()
		got := map[string][]string{}
		firstErr := map[string]error{}
		attempts := map[string]int{}
		deadline := time.Now().Add(2 * time.Minute)
		for len(got) < len(job) {
			if time.Now().After(deadline) {
				st, _ := getDomain(ctx, c, jobDomain)
				t.Fatalf("after 2m only %d of %d nodes prepared; last errors %v; domain: %s", len(got), len(job), firstErr, st)
			}
			for _, n := range job {
				if got[n.name] != nil {
					continue
				}
				attempts[n.name]++
				ids, err := kubelets[n.name].prepare(ctx, claims[n.name])
				if err != nil {
					if _, ok := firstErr[n.name]; !ok {
						firstErr[n.name] = err
					}
					if !strings.Contains(err.Error(), "the kubelet retries") {
						t.Fatalf("node %s: Prepare failed, not retryably: %v", n.name, err)
					}
					continue
				}
				if ids == nil {
					ids = []string{}
				}
				got[n.name] = ids
				// The plugin hands out the channel only once the domain
				// says Ready, which the timeline saw first or at once.
				st, err := getDomain(ctx, c, jobDomain)
				if err != nil {
					t.Fatal(err)
				}
				if st.Status != "Ready" {
					t.Errorf("node %s prepared while the domain is %s", n.name, st)
				}
			}
			if len(got) < len(job) {
				// The kubelet's retry interval: nothing signals readiness to it.
				select {
				case <-ctx.Done():
					t.Fatal(ctx.Err())
				case <-time.After(retryEvery):
				}
			}
		}
		r.prepared = time.Since(prepStart)
		r.attempts = attempts
		for _, n := range job {
			if err := firstErr[n.name]; err == nil || !strings.Contains(err.Error(), "is not ready yet") {
				t.Errorf("node %s: first Prepare = %v, want a refusal saying the domain is not ready yet", n.name, err)
			} else if r.firstRefusal == "" {
				r.firstRefusal = err.Error()
			}
			// The channel, and the claim's own metadata device
			// (draDeviceMetadata, on by default).
			ids := got[n.name]
			meta := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == channelCDI })
			if len(ids)-len(meta) != 1 || slices.ContainsFunc(meta, func(id string) bool { return !strings.HasPrefix(id, driverName+"/metadata=") }) {
				t.Errorf("node %s: CDI devices %v, want %s and the claim's metadata device", n.name, ids, channelCDI)
			}
			checkChannel(t, n)
		}
		st, err := getDomain(ctx, c, jobDomain)
		if err != nil {
			t.Fatal(err)
		}
		checkReady(t, st, job)
		// Each node wrote its device status into its claim: a server-side
		// apply the API server refuses when it would change the allocation.
		for _, n := range job {
			if err := poll(ctx, 30*time.Second, func() (bool, error) {
				cl, err := c.kube.ResourceV1().ResourceClaims(namespace).Get(ctx, claims[n.name].Name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				return slices.ContainsFunc(cl.Status.Devices, func(d resourceapi.AllocatedDeviceStatus) bool {
					return d.Driver == driverName && d.Pool == n.name && d.Device == channelDevice
				}), nil
			}); err != nil {
				t.Errorf("node %s: claim %s has no device status for its channel: %v", n.name, claims[n.name].Name, err)
			}
		}
		for _, s := range tl.all() {
			if s.status == "Ready" {
				r.ready = s.at.Sub(created)
				break
			}
		}
		procs, err := imexProcesses(nodes)
		if err != nil {
			t.Fatal(err)
		}
		if per := countBy(procs); len(procs) != len(job) || per[other.name]+per[nodes[5].name] != 0 {
			t.Errorf("nvidia-imex processes chrooted into their node's driver root, by node: %v; want one on each of the job's 4 nodes", per)
		}
		for pid := range procs {
			if err := checkConfined(pid); err != nil {
				t.Error(err)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("a killed daemon is restarted and the domain is Ready again", func(t *testing.T) {
		victim := job[1]
		pid, err := daemonPID(victim, string(uid))
		if err != nil {
			t.Fatal(err)
		}
		procs, err := imexProcesses(job)
		if err != nil {
			t.Fatal(err)
		}
		if procs[pid] != victim.name {
			t.Fatalf("node %s's PID file names %d, which is not its nvidia-imex (running: %v)", victim.name, pid, procs)
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var newPID int
		if err := poll(ctx, 30*time.Second, func() (bool, error) {
			p, err := daemonPID(victim, string(uid))
			if err != nil || p == pid {
				return false, nil
			}
			procs, err := imexProcesses([]*node{victim})
			newPID = p
			return err == nil && procs[p] == victim.name, err
		}); err != nil {
			t.Fatalf("node %s did not restart its nvidia-imex: %v", victim.name, err)
		}
		r.restarted = time.Since(killed)
		// Ready again: every node has written its entry since the kill
		// (heartbeats are whole seconds), each Ready, the domain Ready.
		after := killed.Truncate(time.Second).Add(time.Second)
		st, err := awaitDomain(ctx, c, jobDomain, time.Minute, "Ready with fresh entries", func(s domainStatus) bool {
			if s.Status != "Ready" || len(s.Nodes) != len(job) {
				return false
			}
			for _, e := range s.Nodes {
				hb, err := time.Parse(time.RFC3339, e.Heartbeat)
				if err != nil || hb.Before(after) || e.Status != "Ready" {
					return false
				}
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		r.readyAgain = time.Since(killed)
		r.restartSeen = tl.since(killed)
		checkReady(t, st, job)
		t.Logf("daemon %d killed, %d running %s later; domain Ready with every entry fresh after %s; transitions: %v",
			pid, newPID, r.restarted.Round(time.Millisecond), r.readyAgain.Round(time.Millisecond), r.restartSeen)
	})

	t.Run("a node that stops reporting is reported lost, kept, and comes back", func(t *testing.T) {
		lost := job[3]
		pid := lost.plugin.Pid()
		stopped := time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		defer resume()
		st, err := awaitDomain(ctx, c, jobDomain, nodeTimeout+time.Minute, "NodeLost", func(s domainStatus) bool { return s.Reason == "NodeLost" })
		if err != nil {
			t.Fatal(err)
		}
		r.lostAfter = time.Since(stopped)
		if _, ok := st.entry(lost.name); !ok || len(st.Nodes) != len(job) || st.Status != "NotReady" || !strings.Contains(st.Message, lost.name) {
			t.Errorf("status = %s; want NotReady naming %s, its entry kept among %d", st, lost.name, len(job))
		}
		if _, err := awaitEvent(ctx, c, jobDomain, corev1.EventTypeWarning, "NodeLost"); err != nil {
			t.Error(err)
		}
		resume()
		continued := time.Now()
		if _, err := awaitDomain(ctx, c, jobDomain, time.Minute, "Ready again", func(s domainStatus) bool { return s.Status == "Ready" }); err != nil {
			t.Fatal(err)
		}
		r.backAfter = time.Since(continued)
	})

	t.Run("a pod placed outside the clique is refused with the reason", func(t *testing.T) {
		claim, err := allocateClaim(ctx, c, tmpl, "worker-outside", other.name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kubelets[other.name].prepare(ctx, claim)
		if err == nil {
			t.Fatalf("node %s (clique %s) prepared a claim of a domain in clique %s", other.name, cliqueB, cliqueA)
		}
		r.refusal = err.Error()
		for _, want := range []string{"node outside the ComputeDomain's clique", cliqueID(cliqueA), cliqueID(cliqueB), other.name, "nvidia.com/gpu.clique"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "the kubelet retries") {
			t.Errorf("refusal %q says the kubelet retries; waiting cannot help", err)
		}
		st, err := getDomain(ctx, c, jobDomain)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := st.entry(other.name); ok {
			t.Errorf("the refused node wrote an entry: %s", st)
		}
		if procs, err := imexProcesses([]*node{other}); err != nil || len(procs) > 0 {
			t.Errorf("the refused node runs nvidia-imex %v (%v)", procs, err)
		}
		if err := kubelets[other.name].unprepare(ctx, claim); err != nil {
			t.Errorf("Unprepare of the refused claim: %v", err)
		}
	})

	t.Run("deleting the domain stops its daemons; Unprepare leaves nothing behind", func(t *testing.T) {
		deleted := time.Now()
		if err := c.dyn.Resource(domainGVR).Namespace(namespace).Delete(ctx, jobDomain, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, time.Minute, func() (bool, error) {
			procs, err := imexProcesses(nodes)
			return err == nil && len(procs) == 0, err
		}); err != nil {
			procs, _ := imexProcesses(nodes)
			t.Fatalf("nvidia-imex still runs after the domain's deletion: %v (%v)", countBy(procs), err)
		}
		r.daemonsGone = time.Since(deleted)
		if err := poll(ctx, time.Minute, func() (bool, error) {
			_, err := c.kube.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, jobTemplate, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Errorf("the domain's template outlives it: %v", err)
		} else {
			r.templateGone = time.Since(deleted)
		}
		for _, n := range job {
			if err := kubelets[n.name].unprepare(ctx, claims[n.name]); err != nil {
				t.Errorf("node %s: %v", n.name, err)
			}
		}
		for _, n := range nodes {
			left, err := os.ReadDir(n.domainsDir())
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
			if len(left) > 0 {
				t.Errorf("node %s keeps %d domain directories in %s", n.name, len(left), n.domainsDir())
			}
			for _, claim := range claims {
				if where := mentions(t, n, string(claim.UID)); where != "" {
					t.Errorf("node %s still mentions claim %s in %s", n.name, claim.UID, where)
				}
			}
		}
	})

	r.total = time.Since(laneStart)
	r.timeline = tl.all()
	r.created = created
	text := r.String()
	t.Log("\n" + text)
	if c.reportDir != "" {
		if err := os.MkdirAll(c.reportDir, 0o755); err != nil {
			t.Error(err)
		} else if err := os.WriteFile(filepath.Join(c.reportDir, "computedomain.txt"), []byte(text), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// awaitChannel waits for a node's ResourceSlice to offer its channel
// device in its clique, and for its DRA socket.
func awaitChannel(ctx context.Context, c cluster, n *node) error {
	var last string
	err := poll(ctx, 2*time.Minute, func() (bool, error) {
		l, err := c.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName + ",spec.nodeName=" + n.name})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name != channelDevice {
					continue
				}
				a := d.Attributes["cliqueID"]
				if a.StringValue == nil || *a.StringValue != cliqueID(n.clique) {
					last = fmt.Sprintf("channel device with cliqueID %v", a.StringValue)
					return false, nil
				}
				_, err := os.Stat(filepath.Join(n.draDir(), "dra.sock"))
				return err == nil, nil
			}
		}
		last = fmt.Sprintf("%d slices, no %s device", len(l.Items), channelDevice)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s does not offer its channel in clique %s (%s): %w", n.name, cliqueID(n.clique), last, err)
	}
	return nil
}

// checkChannel: the CDI device the plugin answered is in its spec
// directory, and names the channel's node, made from the driver's major.
func checkChannel(t *testing.T, n *node) {
	t.Helper()
	host := filepath.Join(n.plugin.DevRoot, channelNode)
	var st unix.Stat_t
	if err := unix.Stat(host, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("node %s: %s is not a character device (%v)", n.name, host, err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Join(n.work, "cdi")), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(channelCDI)
	if dev == nil {
		t.Errorf("node %s: no CDI spec defines %s (known: %v; errors: %v)", n.name, channelCDI, cache.ListDevices(), cache.GetErrors())
		return
	}
	if nodes := dev.ContainerEdits.DeviceNodes; len(nodes) != 1 || nodes[0].HostPath != host {
		t.Errorf("node %s: %s's device nodes = %+v, want one from %s", n.name, channelCDI, nodes, host)
	}
}

// checkReady: the domain is Ready with exactly the job's nodes, each Ready
// at its own address in clique A.
func checkReady(t *testing.T, st domainStatus, job []*node) {
	t.Helper()
	if st.Status != "Ready" || st.Reason != "DomainReady" || len(st.Nodes) != len(job) {
		t.Errorf("domain = %s; want Ready (DomainReady) with %d nodes", st, len(job))
	}
	for _, n := range job {
		e, ok := st.entry(n.name)
		if !ok || e.Status != "Ready" || e.IPAddress != n.ip || e.CliqueID != cliqueID(cliqueA) {
			t.Errorf("node %s's entry = %+v (listed %t); want Ready at %s in %s", n.name, e, ok, n.ip, cliqueID(cliqueA))
		}
	}
}

// mentions says which of the node's plugin files (its DRA directory and
// CDI specs) still name s; "" when none.
func mentions(t *testing.T, n *node, s string) string {
	t.Helper()
	var found []string
	for _, root := range []string{n.draDir(), filepath.Join(n.work, "cdi")} {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Type()&os.ModeSocket != 0 {
				return nil
			}
			if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), s) {
				found = append(found, path)
			}
			return nil
		})
	}
	return strings.Join(found, ", ")
}

func deleteNamespace(ctx context.Context, c cluster) error {
	err := c.kube.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting namespace %s: %w", namespace, err)
	}
	return poll(ctx, 90*time.Second, func() (bool, error) {
		_, err := c.kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func countBy(procs map[int]string) map[string]int {
	out := map[string]int{}
	for _, n := range procs {
		out[n]++
	}
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

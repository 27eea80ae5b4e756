package computedomain

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// What the lane checks, spelt out rather than imported from the plugin,
// so a rename there fails here.
const (
	driverName    = "gpu-device-plugin.github.io"
	group         = "gpu-device-plugin.github.io"
	channelClass  = "compute-domain-channel." + driverName
	channelDevice = "imex-channel"
	channelCDI    = driverName + "/imex-channel=channel0"
	channelNode   = "nvidia-caps-imex-channels/channel0"
	// laneLabel marks the lane's Nodes, so a failed run's leftovers are
	// found and removed by the next.
	laneLabel = "gpu-device-plugin.github.io/computedomain-test"
	namespace = "computedomain-lane"
	crdName   = "computedomains." + group
	// The gb200-tray profile's NVLink domain and clique (its fabric=);
	// clique B's nodes are the same tray with the clique changed.
	clusterUUID = "6c3f2a1e-9b7d-4e58-a0c4-1d2e3f405162"
	cliqueA     = "32766"
	cliqueB     = "7"
)

var domainGVR = schema.GroupVersionResource{Group: group, Version: "v1alpha1", Resource: "computedomains"}

// cliqueID is how status and the channel devices name a clique.
func cliqueID(clique string) string { return clusterUUID + "." + clique }

// cluster is the API server as the test's admin sees it.
type cluster struct {
	kubeconfig string
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	reportDir  string
}

func loadCluster(t *testing.T) cluster {
	c := cluster{kubeconfig: os.Getenv("KUBECONFIG"), reportDir: os.Getenv("E2E_REPORT_DIR")}
	if c.kubeconfig == "" || os.Getenv("E2E_AUDIT_LOG") == "" {
		t.Skip("no KUBECONFIG and E2E_AUDIT_LOG: run `make e2e-computedomain` on a cluster `make e2e-cluster` brought up")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatalf("KUBECONFIG (the cluster's admin): %v", err)
	}
	rc.QPS, rc.Burst = 100, 200
	if c.kube, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	if c.dyn, err = dynamic.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	return c
}

// node is one fake GB200 tray: its plugin, its directories, its address.
type node struct {
	name, ip, clique string
	// work holds the plugin's directories: dra (the kubelet's plugin
	// directory, its socket, checkpoint and the daemons' files), cdi,
	// registry; root is its driver root, proc its /proc.
	work, root, proc string
	plugin           *harness.Plugin
}

func (n *node) draDir() string     { return filepath.Join(n.work, "dra") }
func (n *node) domainsDir() string { return filepath.Join(n.draDir(), "compute-domains") }
func (n *node) imexBinary() string { return filepath.Join(n.root, "usr", "bin", "nvidia-imex") }

// binaries are what the lane builds once.
type binaries struct {
	plugin, library, imex string
}

func build(t *testing.T, dir string) binaries {
	var b binaries
	var err error
	if b.plugin, err = harness.BuildPluginDRA(filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	if b.library, err = harness.BuildMock(filepath.Join(dir, "lib")); err != nil {
		t.Fatal(err)
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b.imex = filepath.Join(dir, "imex", "nvidia-imex")
	cmd := exec.Command("go", "build", "-o", b.imex, "./imexstub")
	cmd.Dir = filepath.Join(root, "e2e")
	// Static: the plugin runs it chrooted in a driver root with no libc.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building e2e/imexstub: %v\n%s", err, out)
	}
	return b
}

// profiles writes the two cliques' profiles: gb200-tray as it is
// (clique A) and with its clique changed (clique B).
func profiles(t *testing.T, dir string) map[string]string {
	tray, err := harness.ProfilePath("gb200-tray")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(tray)
	if err != nil {
		t.Fatal(err)
	}
	from := []byte("fabric=" + clusterUUID + ":" + cliqueA)
	if bytes.Count(text, from) != 1 {
		t.Fatalf("%s: want one %q line to derive clique %s's profile from", tray, from, cliqueB)
	}
	b := filepath.Join(dir, "gb200-tray-clique"+cliqueB+".profile")
	if err := os.WriteFile(b, bytes.Replace(text, from, []byte("fabric="+clusterUUID+":"+cliqueB), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]string{cliqueA: tray, cliqueB: b}
}

// startNode makes a node's Node object's files and starts its plugin in
// DRA mode with ComputeDomains on.
func startNode(t *testing.T, c cluster, b binaries, profile string, n *node) {
	var err error
	if n.work, err = harness.ShortTempDir("cd"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(n.work) })
	n.root, n.proc = filepath.Join(n.work, "root"), filepath.Join(n.work, "proc")
	bin := filepath.Dir(n.imexBinary())
	// A whole driver root, which the plugin chroots the daemons into: the
	// mount points it binds /dev, /proc, /sys and its tmpfs on.
	for _, dir := range []string{"usr/bin", "dev", "proc", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(n.root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// One binary, two names (nvidia-imex-ctl is the stub run as that),
	// copied in: a symlink out of the root would not resolve in the chroot.
	stub, err := os.ReadFile(b.imex)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.imexBinary(), stub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(n.imexBinary(), filepath.Join(bin, "nvidia-imex-ctl")); err != nil {
		t.Fatal(err)
	}
	prof, err := mocknvml.LoadProfile(profile)
	if err != nil {
		t.Fatal(err)
	}
	if err := prof.WriteProc(n.proc); err != nil {
		t.Fatal(err)
	}
	n.plugin, err = harness.StartPlugin(harness.PluginOptions{
		Binary: b.plugin, Library: b.library, Profile: profile,
		PluginDir: filepath.Join(n.work, "device-plugins"),
		Args: []string{
			"--kubelet-api", "dra",
			"--kubeconfig", c.kubeconfig,
			"--node-name", n.name,
			"--dra-plugin-dir", n.draDir(),
			"--plugin-registry-dir", filepath.Join(n.work, "registry"),
			"--cdi-spec-dir", filepath.Join(n.work, "cdi"),
			"--pod-resources-socket", filepath.Join(n.work, "no-kubelet.sock"),
			"--proc-root", n.proc,
			"--driver-root", n.root,
			"--imex-compute-domains=true",
			"--imex-node-ip", n.ip,
			"--events=false", "--node-condition=false",
			"--node-labels", "none",
			"--remediation-enabled=false",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// createNodes makes the lane's Node objects, after removing what a
// failed run left.
func createNodes(ctx context.Context, c cluster, nodes []*node) error {
	if err := deleteNodes(ctx, c); err != nil {
		return err
	}
	for _, n := range nodes {
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			laneLabel: "true", "nvidia.com/gpu.clique": cliqueID(n.clique)}}}
		if _, err := c.kube.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Node %s: %w", n.name, err)
		}
	}
	return nil
}

// deleteNodes removes the lane's Nodes and their ResourceSlices.
func deleteNodes(ctx context.Context, c cluster) error {
	l, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: laneLabel})
	if err != nil {
		return fmt.Errorf("listing the lane's Nodes: %w", err)
	}
	for _, n := range l.Items {
		if err := c.kube.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Node %s: %w", n.Name, err)
		}
		sel := metav1.ListOptions{FieldSelector: "spec.driver=" + driverName + ",spec.nodeName=" + n.Name}
		if err := c.kube.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			return fmt.Errorf("deleting %s's ResourceSlices: %w", n.Name, err)
		}
	}
	return nil
}

// installAPI applies the chart's ComputeDomain CRD and makes the channel
// DeviceClass as the chart's computeDomains.enabled does; undo removes
// what was not there before.
func installAPI(ctx context.Context, t *testing.T, c cluster) (undo func(context.Context)) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "gpu-device-plugin", "crds", "computedomains.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatalf("the chart's CRD: %v", err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	_, err = c.dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
	madeCRD := apierrors.IsNotFound(err)
	body, err := crd.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	force := true
	if _, err := c.dyn.Resource(crdGVR).Patch(ctx, crdName, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: "computedomain-lane", Force: &force}); err != nil {
		t.Fatalf("applying the chart's CRD: %v", err)
	}
	if err := poll(ctx, 30*time.Second, func() (bool, error) {
		u, err := c.dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, co := range conds {
			if m, ok := co.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the CRD is not Established: %v", err)
	}
	attrs := fmt.Sprintf("device.attributes[%q]", driverName)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: channelClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q && %s.type == \"channel\"", driverName, attrs)}}}},
	}
	_, err = c.kube.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
	madeClass := err == nil
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating DeviceClass %s: %v", channelClass, err)
	}
	return func(ctx context.Context) {
		if madeClass {
			_ = c.kube.ResourceV1().DeviceClasses().Delete(ctx, channelClass, metav1.DeleteOptions{})
		}
		if madeCRD {
			_ = c.dyn.Resource(crdGVR).Delete(ctx, crdName, metav1.DeleteOptions{})
		}
	}
}

// poll calls f every 200 ms until it says done, fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		done, err := f()
		if done && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("after %s: %w", timeout, last)
			}
			return fmt.Errorf("not within %s", timeout)
		case <-tick.C:
		}
	}
}

// controller is gpu-device-plugin-controller, built beside the plugin,
// run as the admin, with a node timeout short enough for the lane.
type controller struct {
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
}

const (
	nodeTimeout      = 20 * time.Second
	controllerResync = 2 * time.Second
)

func startController(t *testing.T, c cluster, plugin string) *controller {
	bin := filepath.Join(filepath.Dir(plugin), "gpu-device-plugin-controller")
	ctl := &controller{log: &lockedBuffer{}, done: make(chan struct{})}
	ctl.cmd = exec.Command(bin,
		"--kubeconfig", c.kubeconfig, "--namespace", namespace, "--identity", "computedomain-lane",
		"--node-timeout", nodeTimeout.String(), "--resync", controllerResync.String(), "--lease-duration", "5s")
	ctl.cmd.Stdout, ctl.cmd.Stderr = ctl.log, ctl.log
	ctl.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ctl.cmd.Start(); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
	go func() { _ = ctl.cmd.Wait(); close(ctl.done) }()
	t.Cleanup(func() {
		_ = ctl.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ctl.done:
		case <-time.After(10 * time.Second):
			_ = ctl.cmd.Process.Kill()
			<-ctl.done
		}
		if t.Failed() {
			t.Logf("controller log:\n%s", ctl.log.String())
		}
	})
	return ctl
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// kubelet is the DRA gRPC client of one node's plugin, as the kubelet
// calls it.
type kubelet struct {
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient
}

func dialPlugin(n *node) (*kubelet, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(n.draDir(), "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("node %s: dialling the DRA socket: %w", n.name, err)
	}
	return &kubelet{conn: conn, dra: drapb.NewDRAPluginClient(conn)}, nil
}

// prepare calls NodePrepareResources for one claim: the CDI devices, or
// the plugin's error for it.
func (k *kubelet) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{
		Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil {
		return nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	r := resp.Claims[string(claim.UID)]
	switch {
	case r == nil:
		return nil, fmt.Errorf("NodePrepareResources answered nothing for claim %s", claim.UID)
	case r.Error != "":
		return nil, fmt.Errorf("%s", r.Error)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids, nil
}

func (k *kubelet) unprepare(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{
		Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" {
		return fmt.Errorf("NodeUnprepareResources of claim %s: %+v", claim.UID, r)
	}
	return nil
}

// inRootBinary is the daemon's path inside its driver root.
const inRootBinary = "/usr/bin/nvidia-imex"

// imexProcesses lists the stand-in daemons running chrooted into the
// nodes' driver roots, by PID: argv[0] is the in-root nvidia-imex, and the
// process's root has the node's binary there. An unconfined daemon (argv[0]
// the host path) is not one.
func imexProcesses(nodes []*node) (map[int]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // a zombie has no cmdline; one listed runs
		}
		if argv0, _, _ := bytes.Cut(cmdline, []byte{0}); string(argv0) != inRootBinary {
			continue
		}
		inRoot, err := os.Stat(filepath.Join("/proc", e.Name(), "root", inRootBinary))
		if err != nil {
			continue
		}
		for _, n := range nodes {
			if fi, err := os.Stat(n.imexBinary()); err == nil && os.SameFile(fi, inRoot) {
				out[pid] = n.name
			}
		}
	}
	return out, nil
}

// checkConfined says what of the daemon pid is not as the plugin confines
// it: a mount namespace of its own, and only the environment it is given.
func checkConfined(pid int) error {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return err
	}
	if own, err := os.Readlink("/proc/self/ns/mnt"); err != nil || own == ns {
		return fmt.Errorf("nvidia-imex %d runs in the test's mount namespace (%v)", pid, err)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return err
	}
	for _, kv := range strings.Split(strings.TrimRight(string(env), "\x00"), "\x00") {
		if !strings.HasPrefix(kv, "PATH=") {
			return fmt.Errorf("nvidia-imex %d has %q in its environment, which the plugin does not give it", pid, kv)
		}
	}
	return nil
}

// daemonPID reads the PID file imexd gives a domain's daemon on a node.
func daemonPID(n *node, domainUID string) (int, error) {
	b, err := os.ReadFile(filepath.Join(n.domainsDir(), domainUID, "nvidia-imex.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

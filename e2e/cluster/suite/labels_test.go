package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
)

// Node Feature Discovery as the node-labels lane deploys it: nfd-master
// and nfd-worker on the node's network (the API server is on the node's
// loopback; no kube-proxy), each on its own port for /healthz and metrics.
const (
	nfdNamespace  = "node-feature-discovery"
	nfdMasterPort = 18440
	nfdWorkerPort = 18441
	// nfdFeaturesMount is where nfd-worker's local source reads (fixed in NFD).
	nfdFeaturesMount = "/etc/kubernetes/node-feature-discovery/features.d"
	// featureFileName is the plugin's file in that folder.
	featureFileName = "gpu-device-plugin"
	// nfdAnnotations are NFD's bookkeeping on the Node.
	nfdAnnotations = "nfd.node.kubernetes.io/"
	// machineLabel may differ from the golden file (a real DGX names itself).
	machineLabel = "nvidia.com/gpu.machine"
	// restWindow is how long the Node must be left alone at rest.
	restWindow = 60 * time.Second
)

// The lane's pods: one that selects the node by its GPU, one that cannot.
const (
	podLabelsMatch = "gpu-product-match"
	podLabelsWrong = "gpu-product-wrong"
)

// TestNodeLabels installs Node Feature Discovery and the chart with
// nodeLabels.mode nfd and checks that GPU Feature Discovery's labels
// reach the Node through NFD's local feature file: every label of
// e2e/profiles/testdata/<profile>.labels, pods selecting the node by
// product and memory, and nothing written at rest.
func TestNodeLabels(t *testing.T) {
	if env.NFDSkip != "" {
		t.Skip(env.NFDSkip)
	}
	if env.NFDManifests == "" || env.NFDMasterImage == "" || env.NFDWorkerImage == "" || env.NFDFeaturesDir == "" {
		t.Skip("no Node Feature Discovery on this cluster: E2E_NFD_MANIFESTS, E2E_NFD_MASTER_IMAGE, " +
			"E2E_NFD_WORKER_IMAGE and E2E_NFD_FEATURES_DIR are written by e2e/cluster/cluster.sh and e2e/kind/kind.sh")
	}
	ctx := t.Context()
	s := &labelsScenario{file: filepath.Join(env.NFDFeaturesDir, featureFileName)}
	steps := []step{
		{"NFD and the plugin installed", s.install},
		{"the Node carries the plugin's labels", s.labelsReachNode},
		{"pods select the node by GPU product and memory", s.nodeSelector},
		{"the Node is left alone at rest", s.atRest},
		{"uninstall", s.uninstall},
	}
	// Last to run: NFD, its labels and the file go whatever happened.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s.stopWatching()
		if t.Failed() {
			t.Logf("NFD logs at failure:%s", nfdLogs(ctx))
		}
		if err := s.reset(ctx); err != nil {
			t.Errorf("cleaning up NFD: %v", err)
		}
	})
	cleanUpOnFailure(t, func() *release { return s.release }, false, podLabelsMatch, podLabelsWrong)
	runSteps(t, ctx, steps)
}

type labelsScenario struct {
	release *release
	nfd     *release
	// file is the plugin's feature file as this process sees it.
	file string
	// want are the golden labels, without machineLabel.
	want map[string]string
	// pluginStart is when the plugin's container started.
	pluginStart time.Time
	writes      *fileWrites
}

// goldenLabels reads e2e/profiles/testdata/<profile>.labels.
func goldenLabels() (map[string]string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, "e2e", "profiles", "testdata", env.Profile.Name+".labels"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLabels(f)
}

// parseLabels reads key=value lines, skipping blanks and # comments, as
// NFD's local source reads a feature file.
func parseLabels(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("not key=value: %q", line)
		}
		out[k] = v
	}
	return out, sc.Err()
}

// gpuLabels are the node's nvidia.com/ labels, but the chart's nodeSelector
// label, which the suite sets.
func gpuLabels(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, "nvidia.com/") && k != gpuLabel {
			out[k] = v
		}
	}
	return out
}

// labelDiff describes how got differs from want, keys sorted; empty when equal.
func labelDiff(want, got map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(want) {
		if g, ok := got[k]; !ok {
			fmt.Fprintf(&b, "\n  missing %s=%s", k, want[k])
		} else if g != want[k] {
			fmt.Fprintf(&b, "\n  %s=%s, want %s", k, g, want[k])
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "\n  unexpected %s=%s", k, got[k])
		}
	}
	return b.String()
}

// withoutMachine is m without machineLabel.
func withoutMachine(m map[string]string) map[string]string {
	out := maps.Clone(m)
	delete(out, machineLabel)
	return out
}

// fileWrites polls the plugin's feature file and records each version of
// it (the plugin renames a new file into place: a new inode per write).
type fileWrites struct {
	mu     sync.Mutex
	seen   []fileVersion
	cancel context.CancelFunc
	done   chan struct{}
}

type fileVersion struct {
	at    time.Time
	ino   uint64
	mtime time.Time
	size  int64
}

func (v fileVersion) same(o fileVersion) bool {
	return v.ino == o.ino && v.mtime.Equal(o.mtime) && v.size == o.size
}

func watchFile(path string) *fileWrites {
	ctx, cancel := context.WithCancel(context.Background())
	w := &fileWrites{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if fi, err := os.Stat(path); err == nil {
				v := fileVersion{at: time.Now(), mtime: fi.ModTime(), size: fi.Size()}
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					v.ino = st.Ino
				}
				w.mu.Lock()
				if n := len(w.seen); n == 0 || !w.seen[n-1].same(v) {
					w.seen = append(w.seen, v)
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// versions are the versions seen so far.
func (w *fileWrites) versions() []fileVersion {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

func (w *fileWrites) stop() {
	w.cancel()
	<-w.done
}

func (s *labelsScenario) stopWatching() {
	if s.writes != nil {
		s.writes.stop()
	}
}

// nfdObjects are NFD's CRDs and RBAC from its own deployment manifests
// (build.sh copies them from the module), its namespace, and nfd-master and
// nfd-worker with only the local feature source, reading the plugin's folder.
func nfdObjects() (*release, error) {
	host, port, err := apiHostPort()
	if err != nil {
		return nil, err
	}
	r := &release{}
	add := func(obj runtime.Object, gvk schema.GroupVersionKind) error {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(gvk)
		r.objects = append(r.objects, u)
		return nil
	}
	if err := add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nfdNamespace}}, corev1.SchemeGroupVersion.WithKind("Namespace")); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(env.NFDManifests, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no NFD manifests in %s (e2e/cluster/build.sh nfd): %v", env.NFDManifests, err)
	}
	slices.Sort(files) // nfd-api-crds.yaml before rbac-*.yaml
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(b)), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			// What kustomize's namespace: does, for these kinds.
			switch u.GetKind() {
			case "ServiceAccount", "Role", "RoleBinding":
				u.SetNamespace(nfdNamespace)
			}
			if subjects, ok, _ := unstructured.NestedSlice(u.Object, "subjects"); ok {
				for _, sub := range subjects {
					if m, ok := sub.(map[string]any); ok && m["kind"] == "ServiceAccount" {
						m["namespace"] = nfdNamespace
					}
				}
				unstructured.SetNestedSlice(u.Object, subjects, "subjects")
			}
			r.objects = append(r.objects, &u)
		}
	}

	podEnv := []corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "KUBERNETES_SERVICE_HOST", Value: host},
		{Name: "KUBERNETES_SERVICE_PORT", Value: port},
	}
	probe := func(port int) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(port)), Host: "127.0.0.1"}},
			PeriodSeconds:    2,
			FailureThreshold: 30,
		}
	}
	podSpec := func(name, image string, port int, args []string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{
				ServiceAccountName: name,
				HostNetwork:        true,
				EnableServiceLinks: new(bool),
				Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{
					Name:            name,
					Image:           image,
					ImagePullPolicy: corev1.PullNever,
					Command:         []string{"/usr/local/bin/" + name},
					Args:            append([]string{fmt.Sprintf("-port=%d", port)}, args...),
					Env:             podEnv,
					ReadinessProbe:  probe(port),
				}},
			},
		}
	}
	one := int32(1)
	master := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "nfd-master", Namespace: nfdNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nfd-master"}},
			// v0.18 takes labels in any namespace but kubernetes.io's
			// (nvidia.com included): no -extra-label-ns needed.
			Template: podSpec("nfd-master", env.NFDMasterImage, nfdMasterPort, nil),
		},
	}
	worker := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "nfd-worker", Namespace: nfdNamespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nfd-worker"}},
			// Only the local source (feature files); its default 60 s
			// sleep interval, as a user's NFD has it.
			Template: podSpec("nfd-worker", env.NFDWorkerImage, nfdWorkerPort, []string{"-feature-sources=local", "-label-sources=local"}),
		},
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	ws := &worker.Spec.Template.Spec
	ws.Volumes = []corev1.Volume{{Name: "features-d", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: env.NFDFeaturesDir, Type: &dirOrCreate}}}}
	ws.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "features-d", MountPath: nfdFeaturesMount, ReadOnly: true}}
	if err := add(master, appsv1.SchemeGroupVersion.WithKind("Deployment")); err != nil {
		return nil, err
	}
	if err := add(worker, appsv1.SchemeGroupVersion.WithKind("DaemonSet")); err != nil {
		return nil, err
	}
	return r, nil
}

// nfdLogs is the tail of each NFD pod's log, for failure messages.
func nfdLogs(ctx context.Context) string { return namespaceLogs(ctx, nfdNamespace) }

// namespaceLogs is the tail of the log of each pod in namespace, for
// failure messages; a log that cannot be read says why.
func namespaceLogs(ctx context.Context, namespace string) string {
	l, err := k8s.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var b strings.Builder
	tail := int64(30)
	for _, p := range l.Items {
		out, err := k8s.kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil {
			out = []byte(err.Error())
		}
		fmt.Fprintf(&b, "\n--- %s (%s):\n%s", p.Name, p.Status.Phase, out)
	}
	return b.String()
}

// reset removes NFD, the plugin's feature file, and the labels and
// annotations NFD left on the Node (NFD leaves them when it goes), so
// that the lane starts, and leaves the node, without them.
func (s *labelsScenario) reset(ctx context.Context) error {
	nfd := s.nfd
	if nfd == nil {
		var err error
		if nfd, err = nfdObjects(); err != nil {
			return err
		}
	}
	if err := nfd.uninstall(ctx); err != nil {
		return err
	}
	s.nfd = nil
	if err := os.Remove(s.file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	labels, annotations := map[string]any{}, map[string]any{}
	for k := range gpuLabels(n) {
		labels[k] = nil
	}
	for k := range n.Annotations {
		if strings.HasPrefix(k, nfdAnnotations) {
			annotations[k] = nil
		}
	}
	if len(labels)+len(annotations) == 0 {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels, "annotations": annotations}})
	_, err = k8s.kube.CoreV1().Nodes().Patch(ctx, env.Node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (s *labelsScenario) install(t *testing.T, ctx context.Context) {
	want, err := goldenLabels()
	if err != nil {
		t.Fatal(err)
	}
	s.want = withoutMachine(want)
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deletePods(ctx, podLabelsMatch, podLabelsWrong); err != nil {
		t.Fatal(err)
	}
	// An earlier lane's plugin wrote the file, an earlier run's NFD the labels.
	if err := s.reset(ctx); err != nil {
		t.Fatal(err)
	}
	nfd, err := nfdObjects()
	if err != nil {
		t.Fatal(err)
	}
	if err := nfd.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.nfd = nfd
	if err := waitNFDReady(ctx); err != nil {
		t.Fatalf("%v%s", err, nfdLogs(ctx))
	}
	t.Logf("NFD %s running", env.NFDWorkerImage[strings.LastIndex(env.NFDWorkerImage, ":")+1:])

	s.writes = watchFile(s.file)
	r, err := renderChart("envvar")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.release = r
	name, err := waitPluginRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := k8s.kube.CoreV1().Pods(releaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil {
			s.pluginStart = cs.State.Running.StartedAt.Time
		}
	}
	t.Logf("installed %s; plugin pod %s started %s", r, name, s.pluginStart.Format(time.RFC3339))
}

// waitNFDReady waits for nfd-master's and nfd-worker's pods to be ready.
func waitNFDReady(ctx context.Context) error {
	var state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Pods(nfdNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := map[string]bool{}
		state = ""
		for _, p := range l.Items {
			state += fmt.Sprintf("%s=%s ", p.Name, p.Status.Phase)
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready[p.Labels["app"]] = true
				}
			}
		}
		return ready["nfd-master"] && ready["nfd-worker"], nil
	})
	if err != nil {
		return fmt.Errorf("NFD not ready (%s): %w", strings.TrimSpace(state), err)
	}
	return nil
}

func (s *labelsScenario) labelsReachNode(t *testing.T, ctx context.Context) {
	var got map[string]string
	var machine string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		all := gpuLabels(n)
		machine = all[machineLabel]
		got = withoutMachine(all)
		return machine != "" && labelDiff(s.want, got) == "", nil
	})
	onNode := time.Now()
	if err != nil {
		t.Fatalf("node %s's nvidia.com/ labels are not %s.labels:%s\n(%v)%s%s", env.Node, env.Profile.Name,
			labelDiff(s.want, got), err, pluginLogs(ctx), nfdLogs(ctx))
	}
	// The file itself: NFD's expiry line and the same labels.
	b, err := os.ReadFile(s.file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "# +expiry-time=") {
		t.Errorf("%s has no # +expiry-time= line:\n%s", s.file, b)
	}
	inFile, err := parseLabels(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if d := labelDiff(s.want, withoutMachine(inFile)); d != "" {
		t.Errorf("%s differs from %s.labels:%s", s.file, env.Profile.Name, d)
	}

	vs := s.writes.versions()
	if len(vs) == 0 {
		t.Fatalf("the Node has the labels, yet %s was never seen", s.file)
	}
	// Container start times have second resolution: round the figures so.
	toNode := onNode.Sub(s.pluginStart)
	toFile := vs[0].mtime.Sub(s.pluginStart)
	line := fmt.Sprintf("%d labels (gpu.machine=%s) on node %s %.1fs after the plugin container started "+
		"(feature file written at +%.1fs, %d write(s) seen; NFD took %.1fs from the file, its worker rescans every 60s)",
		len(got)+1, machine, env.Node, toNode.Seconds(), toFile.Seconds(), len(vs), onNode.Sub(vs[0].mtime).Seconds())
	t.Log(line)
	s.report("time-to-labels: " + line)
}

// report appends a line to node-labels.txt in the report directory.
func (s *labelsScenario) report(line string) {
	if env.ReportDir == "" {
		return
	}
	if err := os.MkdirAll(env.ReportDir, 0o755); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(env.ReportDir, "node-labels.txt"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339), line)
}

// labelPod is a pod without GPUs that selects its node by GPU labels.
func labelPod(name string, selector map[string]string) *corev1.Pod {
	p := probePodFor(name, nil)
	p.Spec.NodeSelector = selector
	return p
}

func (s *labelsScenario) nodeSelector(t *testing.T, ctx context.Context) {
	product, memory := "nvidia.com/gpu.product", "nvidia.com/gpu.memory"
	match := labelPod(podLabelsMatch, map[string]string{product: s.want[product], memory: s.want[memory]})
	wrong := labelPod(podLabelsWrong, map[string]string{product: "NVIDIA-A100-SXM4-80GB", memory: s.want[memory]})
	for _, p := range []*corev1.Pod{match, wrong} {
		if _, err := createPod(ctx, p, false); err != nil {
			t.Fatal(err)
		}
	}
	p, err := waitPod(ctx, podLabelsMatch, 2*time.Minute, "scheduled on "+env.Node, func(p *corev1.Pod) (bool, error) {
		return p.Spec.NodeName == env.Node, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%s=%s, %s=%s) scheduled on %s", p.Name, product, s.want[product], memory, s.want[memory], p.Spec.NodeName)
	p, err = waitPod(ctx, podLabelsWrong, time.Minute, "unschedulable", func(p *corev1.Pod) (bool, error) {
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s, asking for another GPU product, was scheduled on %s", p.Name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var msg string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			msg = c.Message
		}
	}
	if !strings.Contains(msg, "node affinity/selector") {
		t.Errorf("pod %s is unschedulable for another reason than its node selector: %s", p.Name, msg)
	}
	// Still Pending a moment later.
	time.Sleep(2 * time.Second)
	if p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podLabelsWrong, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("pod %s: want Pending and unscheduled, got %v", podLabelsWrong, describePod(ctx, p))
	}
	t.Logf("%s (%s=NVIDIA-A100-SXM4-80GB) Pending: %s", podLabelsWrong, product, msg)
	if err := deletePods(ctx, podLabelsMatch, podLabelsWrong); err != nil {
		t.Fatal(err)
	}
}

// nodeChange is one update of the Node seen at rest.
type nodeChange struct {
	rv       string
	managers []string
	labels   string
	annots   string
}

// changedManagers are the field managers whose entries are new or newer in n than in old.
func changedManagers(old, n *corev1.Node) []string {
	var out []string
	for _, e := range n.ManagedFields {
		i := slices.IndexFunc(old.ManagedFields, func(o metav1.ManagedFieldsEntry) bool {
			return o.Manager == e.Manager && o.Operation == e.Operation && o.Subresource == e.Subresource
		})
		if i < 0 || old.ManagedFields[i].Time == nil || e.Time == nil || !old.ManagedFields[i].Time.Equal(e.Time) ||
			string(old.ManagedFields[i].FieldsV1.Raw) != string(e.FieldsV1.Raw) {
			name := e.Manager
			if e.Subresource != "" {
				name += "/" + e.Subresource
			}
			out = append(out, name)
		}
	}
	return out
}

func (s *labelsScenario) atRest(t *testing.T, ctx context.Context) {
	n0, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writesBefore := len(s.writes.versions())
	wctx, cancel := context.WithTimeout(ctx, restWindow)
	defer cancel()
	w, err := k8s.kube.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", env.Node).String(),
		ResourceVersion: n0.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var changes []nodeChange
	prev := n0
	start := time.Now()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			t.Fatalf("watching node %s: %v", env.Node, apierrors.FromObject(ev.Object))
		}
		n, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type == watch.Bookmark {
			continue
		}
		c := nodeChange{rv: n.ResourceVersion, managers: changedManagers(prev, n)}
		if !maps.Equal(prev.Labels, n.Labels) {
			c.labels = labelDiff(prev.Labels, n.Labels)
		}
		if !maps.Equal(prev.Annotations, n.Annotations) {
			c.annots = labelDiff(prev.Annotations, n.Annotations)
		}
		changes = append(changes, c)
		prev = n
	}
	if elapsed := time.Since(start); elapsed < restWindow-time.Second {
		t.Fatalf("the watch of node %s ended after %s, before the %s window", env.Node, elapsed.Round(time.Second), restWindow)
	}
	vs := s.writes.versions()
	restWrites := len(vs) - writesBefore
	n1, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if restWrites != 0 {
		t.Errorf("the plugin wrote %s %d time(s) in %s at rest", s.file, restWrites, restWindow)
	}
	var line string
	if len(changes) == 0 && n1.ResourceVersion == n0.ResourceVersion {
		line = fmt.Sprintf("node %s resourceVersion %s unchanged for %s at rest; feature file writes at rest: 0 (%d in all)",
			env.Node, n0.ResourceVersion, restWindow, len(vs))
	} else {
		// Something else may update the Node (the kubelet's periodic
		// status report): only labels, annotations and any other
		// writer than the kubelet's status count.
		var b strings.Builder
		for _, c := range changes {
			fmt.Fprintf(&b, "\n  rv %s by %s", c.rv, strings.Join(c.managers, ", "))
			bad := c.labels != "" || c.annots != ""
			for _, m := range c.managers {
				bad = bad || m != "kubelet/status"
			}
			if c.labels != "" {
				fmt.Fprintf(&b, "; labels:%s", c.labels)
			}
			if c.annots != "" {
				fmt.Fprintf(&b, "; annotations:%s", c.annots)
			}
			if bad {
				t.Errorf("node %s changed at rest by more than the kubelet's status:%s", env.Node, b.String())
			}
		}
		line = fmt.Sprintf("node %s updated %d time(s) in %s at rest, only the kubelet's status (labels and annotations unchanged):%s; feature file writes at rest: %d (%d in all)",
			env.Node, len(changes), restWindow, b.String(), restWrites, len(vs))
	}
	t.Log(line)
	s.report("at-rest: " + line)
	if got := withoutMachine(gpuLabels(n1)); labelDiff(s.want, got) != "" {
		t.Errorf("node %s's labels changed at rest:%s", env.Node, labelDiff(s.want, got))
	}
}

func (s *labelsScenario) uninstall(t *testing.T, ctx context.Context) {
	if err := s.release.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	s.release = nil
}

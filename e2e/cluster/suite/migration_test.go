package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The migration lane (docs/migrating-from-nvidia.md, "From NVIDIA's chart"):
// NVIDIA's device plugin and GPU Feature Discovery serve the node, then the
// node moves to ours by the guide's label, then back.
const (
	nvidiaNamespace = "nvidia-device-plugin"
	nvidiaPluginDS  = "nvidia-device-plugin-daemonset"
	nvidiaGFDDS     = "gpu-feature-discovery"
	// serveLabel is the guide's node label: which plugin serves the node.
	serveLabel = "gpu-device-plugin.github.io/serve"
	// gfdFileName is GFD's feature file in NFD's folder (its --output-file).
	gfdFileName = "gfd"
	// nvidiaSocket is NVIDIA's plugin's socket in the kubelet's directory.
	nvidiaSocket  = "nvidia-gpu.sock"
	podHeldAcross = "held-across-migration"
	podAfterMove  = "after-migration"
)

// gfdOnly are the keys GFD sets and ours does not (docs/node-labels.md).
var gfdOnly = map[string]string{
	"nvidia.com/gfd.timestamp": "no timestamp label is written, ever: nothing changes at rest",
	"nvidia.com/vgpu.present":  "vGPU labels are not served yet",
}

// TestMigrationFromNVIDIA moves the node from NVIDIA's device plugin and GFD
// (v0.19.0, built from their module) to ours the way the migration guide
// says, and back: a pod keeps its container and GPUs, capacity stays, new
// pods with the same nodeSelector schedule, and the labels match GFD's key
// for key.
func TestMigrationFromNVIDIA(t *testing.T) {
	if env.NFDSkip != "" {
		t.Skip(env.NFDSkip)
	}
	if env.NFDManifests == "" || env.NFDWorkerImage == "" || env.NFDFeaturesDir == "" ||
		env.NVIDIAPluginImage == "" || env.NVIDIAGFDImage == "" {
		t.Skip("no NFD or NVIDIA images on this cluster: E2E_NFD_* and E2E_NVIDIA_PLUGIN_IMAGE, E2E_NVIDIA_GFD_IMAGE " +
			"are written by e2e/cluster/cluster.sh")
	}
	ctx := t.Context()
	s := &migrationScenario{
		labels: &labelsScenario{file: filepath.Join(env.NFDFeaturesDir, featureFileName)},
		watch:  &nodeWatch{},
	}
	steps := []step{
		{"NFD, NVIDIA's device plugin and GFD serve the node", s.installNVIDIA},
		{"a pod holds GPUs under NVIDIA's plugin", s.podUnderNVIDIA},
		{"ours installed on no node; NVIDIA's kept off moved nodes", s.prepare},
		{"the node moves to ours", s.move},
		{"a new pod with the same nodeSelector gets GPUs from ours", s.newPod},
		{"the labels match GFD's key for key", s.labelsMatch},
		{"rollback: the node goes back to NVIDIA's", s.rollback},
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s.watch.stop()
		if t.Failed() {
			t.Logf("plugin logs at failure:%s\nNVIDIA's logs:%s\nNFD logs:%s", pluginLogs(ctx), nvidiaLogs(ctx), nfdLogs(ctx))
		}
		if err := s.cleanUp(ctx); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	runSteps(t, ctx, steps)
	s.report(t)
}

type migrationScenario struct {
	labels  *labelsScenario
	nvidia  *release
	ours    *release
	watch   *nodeWatch
	product string
	// gfdLabels are the node's nvidia.com/ labels under GFD.
	gfdLabels map[string]string
	// held is the pod that runs across the move: its container and GPUs.
	heldContainer string
	heldGPUs      string
	nvidiaPods    []string
	figures       []string
}

func (s *migrationScenario) fig(t *testing.T, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	s.figures = append(s.figures, line)
}

// nvidiaObjects are NVIDIA's device plugin and GFD as DaemonSets, with what
// their chart sets that matters here (priority, tolerations, the kubelet's
// directory, GFD's output in NFD's folder and the host's /sys), on the mock
// node: the driver root and profile of the fixture, and the fixture's sysfs
// as GFD's /sys. Configured by their own variables, as a user's chart
// values would: deviceListStrategy envvar, deviceIDStrategy uuid. notIn
// adds the guide's affinity (step 4).
func nvidiaObjects(notIn bool) (*release, error) {
	r := &release{}
	add := func(obj runtime.Object, kind string) error {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: m}
		gv := corev1.SchemeGroupVersion
		if kind == "DaemonSet" {
			gv = appsv1.SchemeGroupVersion
		}
		u.SetGroupVersionKind(gv.WithKind(kind))
		r.objects = append(r.objects, u)
		return nil
	}
	if err := add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nvidiaNamespace}}, "Namespace"); err != nil {
		return nil, err
	}
	driverLibs := filepath.Join(env.driverRoot(), "usr", "lib", "x86_64-linux-gnu")
	// NVIDIA's chart: nvidia.com/gpu.present (or NFD's PCI labels); the guide adds NotIn.
	exprs := []corev1.NodeSelectorRequirement{{Key: gpuLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}
	if notIn {
		exprs = append(exprs, corev1.NodeSelectorRequirement{Key: serveLabel, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"true"}})
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	directory := corev1.HostPathDirectory
	hostPath := func(name, path string, typ *corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: typ}}}
	}
	ds := func(name, cmd string, envs []corev1.EnvVar, vols []corev1.Volume, mounts []corev1.VolumeMount) *appsv1.DaemonSet {
		no := false
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nvidiaNamespace},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
					Spec: corev1.PodSpec{
						PriorityClassName:            "system-node-critical",
						HostNetwork:                  true,
						AutomountServiceAccountToken: &no,
						EnableServiceLinks:           &no,
						Tolerations:                  []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
						Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
							RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
								NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: exprs}},
							},
						}},
						Containers: []corev1.Container{{
							Name:            name,
							Image:           map[bool]string{true: env.NVIDIAPluginImage, false: env.NVIDIAGFDImage}[name == nvidiaPluginDS],
							ImagePullPolicy: corev1.PullNever,
							Command:         []string{cmd},
							Env:             envs,
							VolumeMounts:    mounts,
							SecurityContext: &corev1.SecurityContext{
								AllowPrivilegeEscalation: &no,
								Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							},
						}},
						Volumes: vols,
					},
				},
			},
		}
	}
	mock := []corev1.EnvVar{{Name: "MOCK_NVML_PROFILE", Value: env.profilePath()}}
	plugin := ds(nvidiaPluginDS, "/usr/local/bin/nvidia-device-plugin",
		append([]corev1.EnvVar{
			{Name: "DEVICE_LIST_STRATEGY", Value: "envvar"},
			{Name: "DEVICE_ID_STRATEGY", Value: "uuid"},
			{Name: "FAIL_ON_INIT_ERROR", Value: "true"},
			{Name: "NVIDIA_DRIVER_ROOT", Value: env.driverRoot()},
			{Name: "CONTAINER_DRIVER_ROOT", Value: env.driverRoot()},
		}, mock...),
		[]corev1.Volume{hostPath("device-plugin", "/var/lib/kubelet/device-plugins", nil), hostPath("fixture", env.Fixture, &directory)},
		[]corev1.VolumeMount{{Name: "device-plugin", MountPath: "/var/lib/kubelet/device-plugins"}, {Name: "fixture", MountPath: env.Fixture, ReadOnly: true}})
	gfd := ds(nvidiaGFDDS, "/usr/local/bin/gpu-feature-discovery",
		append([]corev1.EnvVar{
			{Name: "GFD_USE_NODE_FEATURE_API", Value: "false"},
			// go-nvml dlopens libnvidia-ml.so.1; on a node the driver's
			// library is on the loader's path, here the fixture's is.
			{Name: "LD_LIBRARY_PATH", Value: driverLibs},
			{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		}, mock...),
		[]corev1.Volume{
			hostPath("output-dir", env.NFDFeaturesDir, &dirOrCreate),
			// NVIDIA's chart mounts the host's /sys; the node's is the fixture's.
			hostPath("host-sys", filepath.Join(env.Fixture, "sys"), &directory),
			hostPath("fixture", env.Fixture, &directory),
		},
		[]corev1.VolumeMount{
			{Name: "output-dir", MountPath: nfdFeaturesMount},
			{Name: "host-sys", MountPath: "/sys", ReadOnly: true},
			{Name: "fixture", MountPath: env.Fixture, ReadOnly: true},
		})
	if err := add(plugin, "DaemonSet"); err != nil {
		return nil, err
	}
	if err := add(gfd, "DaemonSet"); err != nil {
		return nil, err
	}
	return r, nil
}

// nvidiaPods are NVIDIA's pods on the node that are not being deleted, by DaemonSet.
func nvidiaPods(ctx context.Context) (map[string][]corev1.Pod, error) {
	l, err := k8s.kube.CoreV1().Pods(nvidiaNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]corev1.Pod{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out[p.Labels["app"]] = append(out[p.Labels["app"]], p)
		}
	}
	return out, nil
}

// nvidiaLogs is the tail of each of NVIDIA's pods' logs, for failure messages.
func nvidiaLogs(ctx context.Context) string { return namespaceLogs(ctx, nvidiaNamespace) }

// waitNVIDIARunning waits for one running pod of each of NVIDIA's
// DaemonSets and returns their names.
func waitNVIDIARunning(ctx context.Context) ([]string, error) {
	var names []string
	var state string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := nvidiaPods(ctx)
		if err != nil {
			return false, nil
		}
		names, state = nil, ""
		for _, ds := range []string{nvidiaPluginDS, nvidiaGFDDS} {
			for _, p := range pods[ds] {
				state += fmt.Sprintf("%s=%s ", p.Name, p.Status.Phase)
			}
			if len(pods[ds]) != 1 || pods[ds][0].Status.Phase != corev1.PodRunning {
				return false, nil
			}
			names = append(names, pods[ds][0].Name)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("NVIDIA's pods not running (%s): %w%s", strings.TrimSpace(state), err, nvidiaLogs(ctx))
	}
	return names, nil
}

// waitNVIDIAGone waits until NVIDIA's DaemonSets have no pod on the node.
func waitNVIDIAGone(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Pods(nvidiaNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
}

// waitGFDLabels waits until the node carries GFD's labels (its timestamp
// among them) and returns the nvidia.com/ ones.
func waitGFDLabels(ctx context.Context, timeout time.Duration) (map[string]string, error) {
	var got map[string]string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = gpuLabels(n)
		return got["nvidia.com/gfd.timestamp"] != "" && got["nvidia.com/gpu.product"] != "", nil
	})
	if err != nil {
		return got, fmt.Errorf("GFD's labels not on node %s (have %v): %w", env.Node, got, err)
	}
	return got, nil
}

func (s *migrationScenario) installNVIDIA(t *testing.T, ctx context.Context) {
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.cleanUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	nfd, err := nfdObjects()
	if err != nil {
		t.Fatal(err)
	}
	if err := nfd.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.labels.nfd = nfd
	if err := waitNFDReady(ctx); err != nil {
		t.Fatalf("%v%s", err, nfdLogs(ctx))
	}
	start := time.Now()
	if s.nvidia, err = nvidiaObjects(false); err != nil {
		t.Fatal(err)
	}
	if err := s.nvidia.apply(ctx); err != nil {
		t.Fatal(err)
	}
	if s.nvidiaPods, err = waitNVIDIARunning(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), 2*time.Minute); err != nil {
		t.Fatalf("%v%s", err, nvidiaLogs(ctx))
	}
	s.fig(t, "NVIDIA's device plugin %s: nvidia.com/gpu %d allocatable %.1fs after apply", nvidiaVersion(), len(env.Profile.GPUs), time.Since(start).Seconds())
	if s.gfdLabels, err = waitGFDLabels(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v%s%s", err, nvidiaLogs(ctx), nfdLogs(ctx))
	}
	s.product = s.gfdLabels["nvidia.com/gpu.product"]
	s.fig(t, "GFD %s: %d nvidia.com/ labels on the node %.1fs after apply (gpu.product=%s)", nvidiaVersion(), len(s.gfdLabels), time.Since(start).Seconds(), s.product)
	s.watch.start(ctx)
}

func nvidiaVersion() string {
	return env.NVIDIAPluginImage[strings.LastIndex(env.NVIDIAPluginImage, ":")+1:]
}

// selectingPod is a probe asking for two GPUs on a node of the product.
func (s *migrationScenario) selectingPod(name string) *corev1.Pod {
	p := probePod(name, 2)
	p.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": s.product}
	return p
}

func (s *migrationScenario) podUnderNVIDIA(t *testing.T, ctx context.Context) {
	p, err := createPod(ctx, s.selectingPod(podHeldAcross), true)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podHeldAcross)
	if err != nil {
		t.Fatal(err)
	}
	s.heldGPUs = rep.Env["NVIDIA_VISIBLE_DEVICES"]
	if n := len(strings.Split(s.heldGPUs, ",")); s.heldGPUs == "" || n != 2 {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q from NVIDIA's plugin, want two GPUs", s.heldGPUs)
	}
	s.heldContainer = p.Status.ContainerStatuses[0].ContainerID
	t.Logf("pod %s runs on NVIDIA's GPUs %s (container %s)", podHeldAcross, s.heldGPUs, s.heldContainer)
}

// checkHeld checks that the held pod runs in the same container, never restarted.
func (s *migrationScenario) checkHeld(t *testing.T, ctx context.Context) {
	t.Helper()
	p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, podHeldAcross, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s is %s%s", podHeldAcross, p.Status.Phase, describePod(ctx, p))
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.ContainerID != s.heldContainer || cs.RestartCount != 0 || cs.State.Running == nil {
		t.Errorf("pod %s: container %s (restarts %d, running %v), want %s never restarted", podHeldAcross, cs.ContainerID, cs.RestartCount, cs.State.Running != nil, s.heldContainer)
	}
}

func (s *migrationScenario) prepare(t *testing.T, ctx context.Context) {
	// Step 3: ours, on no node yet.
	values, err := chartValues("envvar")
	if err != nil {
		t.Fatal(err)
	}
	operatorValues(values)
	values["nodeSelector"] = map[string]any{gpuLabel: "true", serveLabel: "true"}
	if s.ours, err = renderValues(values); err != nil {
		t.Fatal(err)
	}
	if err := s.ours.apply(ctx); err != nil {
		t.Fatal(err)
	}
	// Step 4: NVIDIA's get the NotIn affinity; the DaemonSets' pod
	// templates change, so their rolling update replaces their pods once.
	notIn, err := nvidiaObjects(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := notIn.apply(ctx); err != nil {
		t.Fatal(err)
	}
	s.nvidia = notIn
	start := time.Now()
	var names []string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := nvidiaPods(ctx)
		if err != nil {
			return false, nil
		}
		names = nil
		for _, ds := range []string{nvidiaPluginDS, nvidiaGFDDS} {
			if len(pods[ds]) != 1 || pods[ds][0].Status.Phase != corev1.PodRunning || slices.Contains(s.nvidiaPods, pods[ds][0].Name) {
				return false, nil
			}
			names = append(names, pods[ds][0].Name)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("NVIDIA's DaemonSets did not roll out the affinity: %v%s", err, nvidiaLogs(ctx))
	}
	s.fig(t, "step 4 (NotIn affinity on NVIDIA's DaemonSets) replaced their pods once (rolling update) in %.1fs; %v -> %v",
		time.Since(start).Seconds(), s.nvidiaPods, names)
	s.nvidiaPods = names
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), time.Minute); err != nil {
		t.Fatal(err)
	}
	if pods, err := pluginPods(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("our plugin has pods on a node without %s: %v %v", serveLabel, podNames(pods), err)
	}
	s.checkHeld(t, ctx)
}

func podNames(pods []corev1.Pod) []string {
	var n []string
	for _, p := range pods {
		n = append(n, p.Name)
	}
	return n
}

func labelNode(ctx context.Context, value *string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{serveLabel: value}}})
	_, err := k8s.kube.CoreV1().Nodes().Patch(ctx, env.Node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// featureLabels reads an NFD feature file's labels ("" lines and # lines skipped).
func featureLabels(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLabels(f)
}

func (s *migrationScenario) move(t *testing.T, ctx context.Context) {
	// Step 5.
	s.watch.mark("move")
	start := time.Now()
	yes := "true"
	if err := labelNode(ctx, &yes); err != nil {
		t.Fatal(err)
	}
	name, err := waitPluginRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at, err := waitRegistered(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	s.fig(t, "move: our plugin registered %.1fs after the label", at.Sub(start).Seconds())
	if err := waitNVIDIAGone(ctx); err != nil {
		t.Fatalf("NVIDIA's pods did not leave the node: %v%s", err, nvidiaLogs(ctx))
	}
	s.fig(t, "move: NVIDIA's pods gone %.1fs after the label", time.Since(start).Seconds())
	if _, err := os.Stat(filepath.Join(env.NFDFeaturesDir, gfdFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("GFD's feature file is still there after GFD stopped: %v", err)
	}
	// Our labels on the node, GFD's timestamp gone (NFD's next pass).
	var ours map[string]string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		file, err := featureLabels(s.labels.file)
		if err != nil {
			return false, nil
		}
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		ours = gpuLabels(n)
		return labelDiff(file, ours) == "", nil
	})
	if err != nil {
		t.Fatalf("the node's labels are not our file's: %v%s", err, labelDiff(s.gfdLabels, ours))
	}
	s.fig(t, "move: the node's nvidia.com/ labels are ours (gfd.timestamp gone) %.1fs after the label", time.Since(start).Seconds())
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), time.Minute); err != nil {
		t.Fatal(err)
	}
	s.checkHeld(t, ctx)
	if gaps := s.watch.gaps("move"); gaps != "" {
		s.fig(t, "move: %s", gaps)
	}
}

func (s *migrationScenario) newPod(t *testing.T, ctx context.Context) {
	if _, err := createPod(ctx, s.selectingPod(podAfterMove), true); err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podAfterMove)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(rep.Env["NVIDIA_VISIBLE_DEVICES"], ",")
	if len(got) != 2 {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q from ours, want two GPUs", rep.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	for _, g := range got {
		if strings.Contains(s.heldGPUs, g) {
			t.Errorf("ours gave %s, which pod %s holds since NVIDIA's plugin gave it (%s)", g, podHeldAcross, s.heldGPUs)
		}
	}
	checkGPUDevices(t, rep, got)
	s.checkHeld(t, ctx)
	t.Logf("pod %s got %v from ours", podAfterMove, got)
}

func (s *migrationScenario) labelsMatch(t *testing.T, ctx context.Context) {
	n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ours := gpuLabels(n)
	common := 0
	for _, k := range sortedKeys(s.gfdLabels) {
		v, ok := ours[k]
		switch {
		case !ok && gfdOnly[k] == "":
			t.Errorf("only GFD set %s=%s", k, s.gfdLabels[k])
		case ok:
			common++
			if v != s.gfdLabels[k] {
				t.Errorf("%s: GFD %q, ours %q", k, s.gfdLabels[k], v)
			}
		}
	}
	for _, k := range sortedKeys(ours) {
		if _, ok := s.gfdLabels[k]; !ok {
			t.Errorf("only ours set %s=%s", k, ours[k])
		}
	}
	var only []string
	for k := range s.gfdLabels {
		if _, ok := ours[k]; !ok {
			only = append(only, k)
		}
	}
	slices.Sort(only)
	s.fig(t, "labels: %d keys both set, all equal; only GFD's: %s", common, strings.Join(only, " "))
}

func (s *migrationScenario) rollback(t *testing.T, ctx context.Context) {
	if err := deletePods(ctx, podAfterMove); err != nil {
		t.Fatal(err)
	}
	s.watch.mark("rollback")
	start := time.Now()
	if err := labelNode(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := waitNVIDIARunning(ctx); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := pluginPods(ctx)
		return err == nil && len(pods) == 0, nil
	})
	if err != nil {
		t.Fatalf("our plugin pod did not leave the node: %v", err)
	}
	// NVIDIA's plugin registered again: its socket, and allocatable.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(env.DevicePluginDir, nvidiaSocket))
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("NVIDIA's plugin socket not back: %v%s", err, nvidiaLogs(ctx))
	}
	if err := waitAllocatable(ctx, int64(len(env.Profile.GPUs)), time.Minute); err != nil {
		t.Fatal(err)
	}
	s.fig(t, "rollback: NVIDIA's plugin serving again %.1fs after the label went", time.Since(start).Seconds())
	if _, err := waitGFDLabels(ctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	s.fig(t, "rollback: GFD's labels (its timestamp) back %.1fs after the label went", time.Since(start).Seconds())
	s.checkHeld(t, ctx)
	// A pod scheduled under NVIDIA's again.
	if _, err := createPod(ctx, s.selectingPod(podAfterMove), true); err != nil {
		t.Fatal(err)
	}
	if gaps := s.watch.gaps("rollback"); gaps != "" {
		s.fig(t, "rollback: %s", gaps)
	}
}

func (s *migrationScenario) report(t *testing.T) {
	if env.ReportDir == "" || len(s.figures) == 0 {
		return
	}
	f, err := os.OpenFile(filepath.Join(env.ReportDir, "migration.txt"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Log(err)
		return
	}
	defer f.Close()
	now := time.Now().UTC().Format(time.RFC3339)
	for _, l := range s.figures {
		fmt.Fprintf(f, "%s %s\n", now, l)
	}
}

// cleanUp removes what the lane deploys: pods, both plugins, NFD, both
// feature files, the serve label and the labels NFD left.
func (s *migrationScenario) cleanUp(ctx context.Context) error {
	var errs []error
	errs = append(errs, deletePods(ctx, podHeldAcross, podAfterMove))
	ours := s.ours
	if ours == nil {
		values, err := chartValues("envvar")
		if err == nil {
			operatorValues(values)
			ours, err = renderValues(values)
		}
		errs = append(errs, err)
	}
	if ours != nil {
		errs = append(errs, ours.uninstall(ctx))
	}
	nv := s.nvidia
	if nv == nil {
		var err error
		nv, err = nvidiaObjects(false)
		errs = append(errs, err)
	}
	if nv != nil {
		errs = append(errs, nv.uninstall(ctx))
	}
	errs = append(errs, labelNode(ctx, nil))
	if err := os.Remove(filepath.Join(env.NFDFeaturesDir, gfdFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	os.Remove(filepath.Join(env.DevicePluginDir, nvidiaSocket))
	errs = append(errs, s.labels.reset(ctx))
	return errors.Join(errs...)
}

// nodeWatch polls the Node every 250 ms and records when GFD's label keys
// (gfd.timestamp aside) were missing and when nvidia.com/gpu capacity or
// allocatable dropped below the node's GPUs, from each mark on.
type nodeWatch struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	keys   []string
	marks  map[string]time.Time
	// samples in time order.
	samples []nodeSample
}

type nodeSample struct {
	at                    time.Time
	missing               int
	capacity, allocatable int64
}

func (w *nodeWatch) start(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	w.done = make(chan struct{})
	n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
	if err == nil {
		for k := range gpuLabels(n) {
			if gfdOnly[k] == "" {
				w.keys = append(w.keys, k)
			}
		}
	}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
			if err == nil {
				sm := nodeSample{at: time.Now()}
				for _, k := range w.keys {
					if _, ok := n.Labels[k]; !ok {
						sm.missing++
					}
				}
				c, a := n.Status.Capacity[gpuResource], n.Status.Allocatable[gpuResource]
				sm.capacity, sm.allocatable = c.Value(), a.Value()
				w.mu.Lock()
				w.samples = append(w.samples, sm)
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
}

func (w *nodeWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

func (w *nodeWatch) mark(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.marks == nil {
		w.marks = map[string]time.Time{}
	}
	w.marks[name] = time.Now()
}

// gaps says, since mark, how long the node lacked any of GFD's label keys
// and how long its nvidia.com/gpu capacity or allocatable was below its
// GPUs: "" when never (and always says the sampled span).
func (w *nodeWatch) gaps(mark string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := w.marks[mark]
	want := int64(len(env.Profile.GPUs))
	var noLabels, lowCap time.Duration
	maxMissing, minAlloc := 0, want
	var prev *nodeSample
	n := 0
	for i := range w.samples {
		sm := &w.samples[i]
		if sm.at.Before(from) {
			continue
		}
		n++
		if prev != nil {
			d := sm.at.Sub(prev.at)
			if prev.missing > 0 {
				noLabels += d
			}
			if prev.capacity < want || prev.allocatable < want {
				lowCap += d
			}
		}
		maxMissing = max(maxMissing, sm.missing)
		minAlloc = min(minAlloc, sm.allocatable, sm.capacity)
		prev = sm
	}
	return fmt.Sprintf("node sampled %d times every 250ms: GFD's label keys missing for %s (at most %d of %d), nvidia.com/gpu below %d for %s (lowest %d)",
		n, noLabels.Round(time.Millisecond), maxMissing, len(w.keys), want, lowCap.Round(time.Millisecond), minAlloc)
}

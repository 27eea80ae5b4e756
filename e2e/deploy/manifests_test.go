package deploy

import (
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// measuredPeakRSS is the plugin's peak RSS in the scenario report (make
// bench-scenario, hgx-16: 25.2 MiB). The memory request must cover it.
var measuredPeakRSS = resource.MustParse("26Mi")

const (
	// unpublishedImage is the repository values.yaml and make image name,
	// which no registry serves yet: the chart refuses it.
	unpublishedImage = "ghcr.io/gpu-device-plugin/gpu-device-plugin"
	// defaultImage is the placeholder the static manifests carry until an
	// image is published, and what the tests set as image.repository in the
	// chart, as every user must.
	defaultImage      = "registry.example.com/gpu-device-plugin"
	defaultCDIHookDir = "/var/lib/gpu-device-plugin/bin"
)

// defaultPodResourcesDir is the directory of the Go side's default
// PodResources socket: the chart's default must be it, so that `kubectl
// exec ... gpu-device-plugin list`, which gets no flags, finds the socket.
var defaultPodResourcesDir = filepath.Dir(config.DefaultPodResourcesSocket)

func readManifest(t *testing.T) objects {
	t.Helper()
	p := repoPath(t, "deploy", "manifests", "gpu-device-plugin.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(p, b)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestManifestDecodesStrictlyAndValidates(t *testing.T) {
	objs := readManifest(t)
	if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 || len(objs.Services) != 0 {
		t.Fatalf("want one ConfigMap and one DaemonSet, got %d ConfigMaps, %d DaemonSets, %d Services",
			len(objs.ConfigMaps), len(objs.DaemonSets), len(objs.Services))
	}
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the manifest:\n%v", errs.ToAggregate())
	}
}

func TestManifestDaemonSet(t *testing.T) {
	objs := readManifest(t)
	checkDaemonSet(t, objs.DaemonSets[0], objs.ConfigMaps[0], wantDaemonSet{
		namespace: "kube-system", hostDriverRoot: "/", devicePluginDir: "/var/lib/kubelet/device-plugins", cdiSpecDir: "/var/run/cdi",
		cdiHookDir: defaultCDIHookDir, stateDir: "/var/lib/gpu-device-plugin/state", podResourcesDir: defaultPodResourcesDir,
		privileged: true, image: defaultImage, maxUnavailable: intstr.FromInt32(1),
	})
	t.Run("init container installs the hook", func(t *testing.T) { checkInstallsHook(t, objs.DaemonSets[0]) })
}

// TestManifestAcceptedByPlugin runs the real binary with the DaemonSet's
// arguments, environment and ConfigMap: every flag must exist and every
// value pass the plugin's own validation.
func TestManifestAcceptedByPlugin(t *testing.T) {
	objs := readManifest(t)
	checkAcceptedByPlugin(t, objs.DaemonSets[0], objs.ConfigMaps[0])
}

type wantDaemonSet struct {
	namespace       string
	hostDriverRoot  string
	devicePluginDir string
	cdiSpecDir      string
	cdiHookDir      string // host directory the init container installs the CDI hook into
	stateDir        string // host directory of the health kept across restarts
	mpsRoot         string // host directory of the MPS daemons; "": the default
	podResourcesDir string // host directory of the kubelet's PodResources socket; "" when not mounted
	serviceAccount  string // device-plugin mode with events or nodeCondition on; "" for none
	privileged      bool
	image           string // repository
	maxUnavailable  intstr.IntOrString
	maxSurge        *intstr.IntOrString // checked when set
	dra             *wantDRA            // DRA mode (kubeletAPI: dra); nil: device-plugin mode
	ownAffinity     bool                // the values set the nodes: not the chart's default GPU node affinity
}

// wantDRA is what DRA mode adds to the pod: API access and the kubelet's
// plugin directories instead of its device-plugin directory.
type wantDRA struct {
	serviceAccount string
	pluginDir      string // the driver's socket directory, host path = pod path
	registryDir    string // the kubelet's plugins_registry, host path = pod path
}

// checkDaemonSet pins what the static manifest and the chart both promise.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap, want wantDaemonSet) {
	t.Helper()
	checkProbes(t, ds)
	spec := ds.Spec.Template.Spec
	if ds.Namespace != want.namespace {
		t.Errorf("namespace %q, want %q", ds.Namespace, want.namespace)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	if !tolerates(spec.Tolerations, corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}) {
		t.Errorf("tolerations %v do not tolerate the nvidia.com/gpu:NoSchedule taint", spec.Tolerations)
	}
	if !want.ownAffinity {
		if len(spec.NodeSelector) != 0 {
			t.Errorf("nodeSelector %v, want none: a node with any one of %v runs the plugin", spec.NodeSelector, gpuNodeLabels)
		}
		checkGPUNodeAffinity(t, spec.Affinity)
	}
	if us := ds.Spec.UpdateStrategy; us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable == nil || *us.RollingUpdate.MaxUnavailable != want.maxUnavailable {
		t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable %s", us, want.maxUnavailable.String())
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; want.maxSurge != nil && (ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != *want.maxSurge) {
		t.Errorf("updateStrategy %+v, want maxSurge %s", ds.Spec.UpdateStrategy, want.maxSurge.String())
	}
	switch {
	case want.dra == nil && want.serviceAccount != "":
		if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
			t.Error("automountServiceAccountToken is not true: events and nodeCondition go through the API server")
		}
		if spec.ServiceAccountName != want.serviceAccount {
			t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, want.serviceAccount)
		}
	case want.dra == nil:
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Error("automountServiceAccountToken is not false: in device-plugin mode the plugin never talks to the API server")
		}
		if spec.ServiceAccountName != "" {
			t.Errorf("serviceAccountName %q in device-plugin mode, which needs no API access", spec.ServiceAccountName)
		}
	default:
		if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
			t.Error("automountServiceAccountToken is not true: DRA mode publishes ResourceSlices through the API server")
		}
		if spec.ServiceAccountName != want.dra.serviceAccount {
			t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, want.dra.serviceAccount)
		}
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if !strings.HasPrefix(c.Image, want.image+":") {
		t.Errorf("image %q, want %s:TAG", c.Image, want.image)
	}
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("args %q do not start with serve", c.Args)
	}

	// Each path flag points into a mount of the matching host path.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	hostPathOf := func(mountPath string) (string, corev1.VolumeMount) {
		m, ok := mounts[mountPath]
		if !ok {
			t.Errorf("nothing is mounted at %s", mountPath)
			return "", m
		}
		v := volumes[m.Name]
		if v.HostPath == nil {
			t.Errorf("%s is not a hostPath mount", mountPath)
			return "", m
		}
		return v.HostPath.Path, m
	}
	type pathFlag struct {
		flag, hostPath string
		readOnly       bool
	}
	pathFlags := []pathFlag{
		{"driver-root", want.hostDriverRoot, true},
		{"dev-root", "/dev", false},
		{"sysfs-root", "/sys", true},
		{"cdi-spec-dir", want.cdiSpecDir, false},
		{"state-dir", want.stateDir, false},
		{"mps-root", cmp.Or(want.mpsRoot, config.DefaultMPSRoot), false},
	}
	if want.dra == nil {
		pathFlags = append(pathFlags, pathFlag{"device-plugin-dir", want.devicePluginDir, false})
	} else {
		pathFlags = append(pathFlags, pathFlag{"dra-plugin-dir", want.dra.pluginDir, false}, pathFlag{"plugin-registry-dir", want.dra.registryDir, false})
		checkDRAPod(t, spec, c, want.dra, volumes)
	}
	for _, f := range pathFlags {
		mountPath, ok := flagValue(c.Args, f.flag)
		if !ok {
			t.Errorf("no --%s in args %q", f.flag, c.Args)
			continue
		}
		hp, m := hostPathOf(mountPath)
		if hp != f.hostPath {
			t.Errorf("--%s=%s is host path %q, want %q", f.flag, mountPath, hp, f.hostPath)
		}
		if m.ReadOnly != f.readOnly {
			t.Errorf("mount %s readOnly=%v, want %v", mountPath, m.ReadOnly, f.readOnly)
		}
	}
	// The container runtimes' configs, under the host's root: a variable,
	// so that list through kubectl exec reads them as serve does.
	var runtimeRoot string
	for _, e := range c.Env {
		if e.Name == "GPU_DEVICE_PLUGIN_RUNTIME_CONFIG_ROOT" {
			runtimeRoot = e.Value
		}
	}
	if hp, m := hostPathOf(runtimeRoot); hp != "/" || !m.ReadOnly {
		t.Errorf("GPU_DEVICE_PLUGIN_RUNTIME_CONFIG_ROOT=%q is host path %q (readOnly %v), want / read-only", runtimeRoot, hp, m.ReadOnly)
	}
	checkHookMounts(t, spec.InitContainers, c, volumes, want.cdiHookDir)
	checkPodResourcesMount(t, c, volumes, want.podResourcesDir)
	if hdr, _ := flagValue(c.Args, "host-driver-root"); hdr != want.hostDriverRoot {
		t.Errorf("--host-driver-root=%q, want the driver root's host path %q (CDI specs name host paths)", hdr, want.hostDriverRoot)
	}
	if dr, _ := flagValue(c.Args, "driver-root"); mounts[dr].MountPropagation == nil || *mounts[dr].MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("driver root mount has no HostToContainer propagation: a driver container's later mount would not show")
	}
	cfgPath, ok := flagValue(c.Args, "config")
	if !ok {
		t.Fatalf("no --config in args %q", c.Args)
	}
	m, ok := mounts[filepath.Dir(cfgPath)]
	if v := volumes[m.Name]; !ok || v.ConfigMap == nil || v.ConfigMap.Name != cm.Name {
		t.Errorf("--config=%s is not in a mount of ConfigMap %s", cfgPath, cm.Name)
	}
	if _, ok := cm.Data[filepath.Base(cfgPath)]; !ok {
		t.Errorf("ConfigMap %s has no key %s", cm.Name, filepath.Base(cfgPath))
	}

	// Sized from measurement, no CPU limit, a memory limit above the request.
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().Cmp(measuredPeakRSS) < 0 {
		t.Errorf("requests %v: want a CPU request and memory of at least the measured peak RSS %s", req, measuredPeakRSS.String())
	}
	if _, ok := lim[corev1.ResourceCPU]; ok {
		t.Errorf("limits %v: a CPU limit would throttle Allocate", lim)
	}
	if lim.Memory().Cmp(*req.Memory()) <= 0 {
		t.Errorf("memory limit %s not above the request %s", lim.Memory(), req.Memory())
	}
	var gomemlimit bool
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			gomemlimit = true
		}
	}
	if !gomemlimit {
		t.Error("GOMEMLIMIT does not follow limits.memory")
	}

	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root filesystem is not read-only")
	}
	if want.privileged && (sc == nil || sc.Privileged == nil || !*sc.Privileged) {
		t.Error("not privileged: without the NVIDIA runtime, NVML cannot open /dev/nvidia*")
	}
}

// checkHookMounts pins the CDI hook's way to the host: an init container
// from the plugin's image installs it into a hostPath at the same path in
// the pod, which the plugin mounts read-only and names in --cdi-hook-path.
func checkHookMounts(t *testing.T, inits []corev1.Container, c corev1.Container, volumes map[string]corev1.Volume, dir string) {
	t.Helper()
	if len(inits) != 1 || inits[0].Name != "install-cdi-hook" {
		t.Errorf("%d init containers, want one, install-cdi-hook", len(inits))
		return
	}
	ic := inits[0]
	if ic.Image != c.Image || ic.ImagePullPolicy != c.ImagePullPolicy {
		t.Errorf("init container image %s (%s), want the plugin's %s (%s)", ic.Image, ic.ImagePullPolicy, c.Image, c.ImagePullPolicy)
	}
	argv := append(append([]string{}, ic.Command...), ic.Args...)
	if want := []string{imageHookPath, "install", "--dir=" + dir}; !slices.Equal(argv, want) {
		t.Errorf("init container runs %q, want %q", argv, want)
	}
	if sc := ic.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("init container's root filesystem is not read-only")
	}
	if hp, ok := flagValue(c.Args, "cdi-hook-path"); !ok || hp != filepath.Join(dir, hookName) {
		t.Errorf("--cdi-hook-path=%q, want %s", hp, filepath.Join(dir, hookName))
	}
	mountOf := func(who string, ms []corev1.VolumeMount, readOnly bool) string {
		for _, m := range ms {
			if m.MountPath != dir {
				continue
			}
			v := volumes[m.Name]
			if v.HostPath == nil || v.HostPath.Path != dir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("%s mounts %s from volume %s, want hostPath %s, DirectoryOrCreate", who, dir, m.Name, dir)
			}
			if m.ReadOnly != readOnly {
				t.Errorf("%s mounts %s readOnly=%v, want %v", who, dir, m.ReadOnly, readOnly)
			}
			return m.Name
		}
		t.Errorf("%s mounts nothing at %s", who, dir)
		return ""
	}
	if a, b := mountOf("init container", ic.VolumeMounts, false), mountOf("plugin", c.VolumeMounts, true); a != b {
		t.Errorf("init container and plugin mount %s from different volumes, %s and %s", dir, a, b)
	}
}

// checkPodResourcesMount pins the way to the kubelet's PodResources API:
// its directory, at the same path in the pod and read-only (connecting to
// a socket needs no write access), of type Directory (the kubelet makes
// it: missing means a wrong kubelet root), and --pod-resources-socket
// naming kubelet.sock in it. With dir "", neither.
func checkPodResourcesMount(t *testing.T, c corev1.Container, volumes map[string]corev1.Volume, dir string) {
	t.Helper()
	sock, hasFlag := flagValue(c.Args, "pod-resources-socket")
	var found bool
	for _, m := range c.VolumeMounts {
		hp := volumes[m.Name].HostPath
		if hp == nil || (m.MountPath != dir && filepath.Base(hp.Path) != "pod-resources") {
			continue
		}
		found = true
		if dir == "" {
			t.Errorf("host %s mounted at %s, want no PodResources mount", hp.Path, m.MountPath)
			continue
		}
		if hp.Path != dir || m.MountPath != dir {
			t.Errorf("host %s mounted at %s, want %s at the same path", hp.Path, m.MountPath, dir)
		}
		if !m.ReadOnly {
			t.Errorf("%s is mounted read-write: the plugin only connects to the kubelet's socket", m.MountPath)
		}
		if hp.Type == nil || *hp.Type != corev1.HostPathDirectory {
			t.Errorf("host path %s has type %v, want Directory (the kubelet makes it)", hp.Path, hp.Type)
		}
	}
	switch {
	case dir == "" && hasFlag:
		t.Errorf("--pod-resources-socket=%s without a PodResources mount", sock)
	case dir == "":
	case !found:
		t.Errorf("nothing mounted at %s (the kubelet's PodResources directory)", dir)
	case sock != filepath.Join(dir, "kubelet.sock"):
		t.Errorf("--pod-resources-socket=%q, want %s", sock, filepath.Join(dir, "kubelet.sock"))
	}
}

func tolerates(ts []corev1.Toleration, taint corev1.Taint) bool {
	for _, tol := range ts {
		if tol.ToleratesTaint(logr.Discard(), &taint, false) {
			return true
		}
	}
	return false
}

// checkAcceptedByPlugin runs `gpu-device-plugin version` with the
// container's arguments, environment and config file, as the kubelet would
// start it on a node whose IP is 10.0.0.5. version parses and validates the
// whole configuration, as serve does, and needs no GPU.
func checkAcceptedByPlugin(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	t.Helper()
	checkAcceptedByPluginOn(t, ds, cm, "10.0.0.5")
}

// checkAcceptedByPluginOn is checkAcceptedByPlugin on a node whose IP
// (status.hostIP) is hostIP.
func checkAcceptedByPluginOn(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap, hostIP string) {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	env := kubeletEnv(c, ds.Namespace, hostIP)
	// $(VAR) in the arguments, expanded by the kubelet's own code.
	_, expanded := kubecontainer.ExpandContainerCommandAndArgs(&c, env)
	dir := t.TempDir()
	var args []string
	for _, a := range expanded[1:] {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			local := filepath.Join(dir, filepath.Base(p))
			if err := os.WriteFile(local, []byte(cm.Data[filepath.Base(p)]), 0o644); err != nil {
				t.Fatal(err)
			}
			// config.Load is what the plugin reads it with; check it alone
			// too, for a clearer message.
			if _, err := config.Load(local); err != nil {
				t.Fatalf("ConfigMap %s: %v", cm.Name, err)
			}
			a = "--config=" + local
		}
		args = append(args, a)
	}
	// Before the command: the top level takes every setting serve does.
	cmd := exec.Command(plugin(t), append(args, "version")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpu-device-plugin version %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if !strings.HasPrefix(string(out), "gpu-device-plugin ") {
		t.Fatalf("gpu-device-plugin version printed:\n%s", out)
	}
}

// kubeletEnv is c's environment as the kubelet gives it to a pod in
// namespace on a node whose IP is hostIP: literal values, and the downward
// API's fields with made-up values for the pod. Resource fields
// (GOMEMLIMIT) are left out.
func kubeletEnv(c corev1.Container, namespace, hostIP string) []kubecontainer.EnvVar {
	fields := map[string]string{"spec.nodeName": "node-1", "metadata.uid": "0b5f6a2e-4a8c-4a3e-9d62-5d4f7c1e2b90", "status.hostIP": hostIP,
		"metadata.name": "gpu-device-plugin-x7k2p", "metadata.namespace": namespace}
	var env []kubecontainer.EnvVar
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, kubecontainer.EnvVar{Name: e.Name, Value: e.Value})
		case e.ValueFrom.FieldRef != nil:
			env = append(env, kubecontainer.EnvVar{Name: e.Name, Value: fields[e.ValueFrom.FieldRef.FieldPath]})
		}
	}
	return env
}

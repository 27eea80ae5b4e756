package suite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	testNamespace = "gpu-e2e"
	gpuResource   = corev1.ResourceName("nvidia.com/gpu")
	// libraryInContainer is where a CDI spec mounts the driver's NVML.
	libraryInContainer = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
)

// probeReport is what e2e/cluster/images/probe prints.
type probeReport struct {
	Env     map[string]string `json:"env"`
	Devices []struct {
		Path  string `json:"path"`
		Char  bool   `json:"char"`
		Major uint32 `json:"major"`
		Minor uint32 `json:"minor"`
	} `json:"devices"`
	Files        map[string]bool   `json:"files"`
	Contents     map[string]string `json:"contents"`
	Links        map[string]string `json:"links"`
	LDCache      []string          `json:"ldCache"`
	LDCacheError string            `json:"ldCacheError"`
}

// cudaCacheLine is the `ldconfig -p` line of cudaLibDir's libcuda.so.1,
// or "".
func (r probeReport) cudaCacheLine() string {
	for _, l := range r.LDCache {
		if strings.HasPrefix(l, "libcuda.so.1 (") && strings.HasSuffix(l, "=> "+cudaLibDir+"/libcuda.so.1") {
			return l
		}
	}
	return ""
}

// devicePaths lists the device nodes the probe saw.
func (r probeReport) devicePaths() []string {
	var p []string
	for _, d := range r.Devices {
		p = append(p, d.Path)
	}
	return p
}

// cudaLibDir is where the fixture's driver root keeps libcuda, and so where
// CDI mounts it in the container.
var cudaLibDir = filepath.Dir(libraryInContainer)

// gpuSpecFile is the plugin's GPU spec as the node sees it.
func gpuSpecFile() string {
	return filepath.Join(env.CDIDir, "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json")
}

// removeSpecs is README's uninstall step: the plugin's spec files go.
func removeSpecs() error {
	m, err := filepath.Glob(filepath.Join(env.CDIDir, "gpu-device-plugin_*.json"))
	if err != nil {
		return err
	}
	for _, p := range m {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

// cudaProbePod is probePod that also reports the image's ld cache and the
// libcuda.so link, and carries a marker argument probePID finds it by.
func cudaProbePod(name string, gpus int64) *corev1.Pod {
	p := probePod(name, gpus)
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args,
		"-ldconfig=/sbin/ldconfig", "-links="+cudaLibDir+"/libcuda.so", "-look-for="+libraryInContainer+","+markerPath(name))
	return p
}

func markerPath(pod string) string { return "/e2e-marker/" + testNamespace + "/" + pod }

// probePID finds the probe process of pod on this node by its marker.
func probePID(pod string) (int, error) {
	marker := []byte(markerPath(pod))
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(cmd, []byte("/probe\x00")) && bytes.Contains(cmd, marker) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no probe process of pod %s on this node", pod)
}

// checkCUDA checks what CUDA and Triton need inside the container: the
// image's own `ldconfig -p` lists libcuda.so.1, libcuda.so links to it,
// and NVIDIA_VISIBLE_DEVICES is void so no legacy hook adds GPUs.
func checkCUDA(t *testing.T, rep probeReport) {
	t.Helper()
	if rep.LDCacheError != "" {
		t.Errorf("ldconfig -p in the container: %s", rep.LDCacheError)
	}
	if rep.cudaCacheLine() == "" {
		t.Errorf("ldconfig -p in the container does not list %s/libcuda.so.1:\n%s", cudaLibDir, strings.Join(rep.LDCache, "\n"))
	}
	if got := rep.Links[cudaLibDir+"/libcuda.so"]; got != "libcuda.so.1" {
		t.Errorf("%s/libcuda.so -> %q, want libcuda.so.1", cudaLibDir, got)
	}
	if got := rep.Env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void", got)
	}
}

// probePod asks for gpus GPUs and reports what it got. It shares the
// host's network, so the node needs no working pod network.
func probePod(name string, gpus int64) *corev1.Pod {
	return probePodFor(name, corev1.ResourceList{gpuResource: *resource.NewQuantity(gpus, resource.DecimalSI)})
}

// probePodFor asks for limits.
func probePodFor(name string, limits corev1.ResourceList) *corev1.Pod {
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace, Labels: map[string]string{"app": "gpu-e2e-probe"}},
		Spec: corev1.PodSpec{
			NodeName:                      "", // the scheduler places it
			HostNetwork:                   true,
			AutomountServiceAccountToken:  new(bool),
			EnableServiceLinks:            new(bool),
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "probe",
				Image:           env.ProbeImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"-look-for=" + libraryInContainer},
				Resources:       corev1.ResourceRequirements{Limits: limits},
			}},
		},
	}
}

// createPod creates pod and, when running is true, waits until it runs.
func createPod(ctx context.Context, pod *corev1.Pod, running bool) (*corev1.Pod, error) {
	if _, err := k8s.kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	if !running {
		return pod, nil
	}
	return waitRunning(ctx, pod.Name)
}

// waitRunning waits until pod name runs, every container started.
func waitRunning(ctx context.Context, name string) (*corev1.Pod, error) {
	return waitPod(ctx, name, 2*time.Minute, "running", func(p *corev1.Pod) (bool, error) {
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s ended: %s %s", p.Name, p.Status.Phase, p.Status.Message)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return false, nil
			}
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
}

// waitPod polls pod name until cond holds, and returns it then.
func waitPod(ctx context.Context, name string, timeout time.Duration, what string, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return cond(p)
	})
	if err != nil {
		return last, fmt.Errorf("pod %s not %s: %w%s", name, what, err, describePod(ctx, last))
	}
	return last, nil
}

// describePod is the pod's status and events, for a failure message.
func describePod(ctx context.Context, p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	b, _ := json.MarshalIndent(p.Status, "", "  ")
	s := "\nstatus: " + string(b)
	events, err := k8s.kube.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err == nil {
		for _, e := range events.Items {
			s += fmt.Sprintf("\nevent: %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return s
}

func deletePods(ctx context.Context, names ...string) error {
	zero := int64(0)
	for _, n := range names {
		err := k8s.kube.CoreV1().Pods(testNamespace).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}

// probeOutput reads the probe's report from the pod's log, through the
// API server and the kubelet, as `kubectl logs` does.
func probeOutput(ctx context.Context, name string) (probeReport, error) {
	var r probeReport
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		b, err := k8s.kube.CoreV1().Pods(testNamespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = string(b)
		sc := bufio.NewScanner(strings.NewReader(last))
		for sc.Scan() {
			if js, ok := strings.CutPrefix(sc.Text(), "probe: "); ok {
				return true, json.Unmarshal([]byte(js), &r)
			}
		}
		return false, nil
	})
	if err != nil {
		return r, fmt.Errorf("reading pod %s's log: %w (last: %s)", name, err, last)
	}
	return r, nil
}

// checkGPUDevices checks that the container has the device nodes of gpus
// (by UUID) and nvidiactl, as character devices, and no other GPU's.
func checkGPUDevices(t *testing.T, rep probeReport, gpus []string) {
	t.Helper()
	index := env.uuidIndex()
	want := []string{"/dev/nvidiactl"}
	for _, u := range gpus {
		i, ok := index[u]
		if !ok {
			t.Fatalf("GPU %q is not in the profile", u)
		}
		want = append(want, fmt.Sprintf("/dev/nvidia%d", env.Profile.GPUs[i].Minor))
	}
	have := rep.devicePaths()
	for _, d := range want {
		if !slices.Contains(have, d) {
			t.Errorf("container lacks %s; it has %v", d, have)
		}
	}
	for _, d := range rep.Devices {
		if !d.Char {
			t.Errorf("%s is not a character device", d.Path)
		}
		gpuNode := strings.HasPrefix(d.Path, "/dev/nvidia") && !strings.HasPrefix(d.Path, "/dev/nvidia-")
		if gpuNode && !slices.Contains(want, d.Path) {
			t.Errorf("container has %s, which it was not given", d.Path)
		}
	}
}

// allocatedGPUs is what the kubelet reports it gave the pod's container,
// by device ID, with each device's health.
func allocatedGPUs(p *corev1.Pod) map[string]corev1.ResourceHealthStatus {
	m := map[string]corev1.ResourceHealthStatus{}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name != gpuResource {
				continue
			}
			for _, h := range rs.Resources {
				m[string(h.ResourceID)] = h.Health
			}
		}
	}
	return m
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// statusRecord is one snapshot of a pod's allocatedResourcesStatus,
// for the report: what the kubelet says of each GPU, and how long after
// the fault the pod status and the node's allocatable showed it.
type statusRecord struct {
	Step             string            `json:"step"`
	Time             time.Time         `json:"time"`
	PodStatusAfter   string            `json:"podStatusAfter,omitempty"`
	AllocatableAfter string            `json:"nodeAllocatableAfter,omitempty"`
	NodeAllocatable  string            `json:"nodeAllocatableGPUs"`
	Status           recordedPodStatus `json:"status"`
}

// recordedPodStatus is the part of a pod's status the report shows.
type recordedPodStatus struct {
	Phase             corev1.PodPhase     `json:"phase"`
	ContainerStatuses []recordedContainer `json:"containerStatuses"`
}

type recordedContainer struct {
	Name                     string                  `json:"name"`
	RestartCount             int32                   `json:"restartCount"`
	AllocatedResourcesStatus []corev1.ResourceStatus `json:"allocatedResourcesStatus"`
}

// record appends a snapshot of pod to the report file name (JSON lines)
// and returns it indented, for the test log.
func record(ctx context.Context, file string, rec statusRecord, pod *corev1.Pod) string {
	rec.Time = time.Now().UTC()
	rec.NodeAllocatable = "?"
	if n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{}); err == nil {
		q := n.Status.Allocatable[gpuResource]
		rec.NodeAllocatable = q.String()
	}
	rec.Status.Phase = pod.Status.Phase
	for _, cs := range pod.Status.ContainerStatuses {
		rec.Status.ContainerStatuses = append(rec.Status.ContainerStatuses, recordedContainer{
			Name: cs.Name, RestartCount: cs.RestartCount, AllocatedResourcesStatus: cs.AllocatedResourcesStatus,
		})
	}
	line, _ := json.Marshal(rec)
	if env.ReportDir != "" {
		if err := os.MkdirAll(env.ReportDir, 0o755); err == nil {
			if f, err := os.OpenFile(filepath.Join(env.ReportDir, file), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
				f.Write(append(line, '\n'))
				f.Close()
			}
		}
	}
	pretty, _ := json.MarshalIndent(rec, "", "  ")
	return string(pretty)
}

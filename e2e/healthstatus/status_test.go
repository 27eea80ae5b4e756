package healthstatus

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

const (
	// waitTimeout bounds every wait. It is generous because -race on two
	// cores slows gRPC by an order of magnitude; the measured figures are
	// logged.
	waitTimeout = 20 * time.Second
	// pollInterval is the plugin's health poll, short so a thermal test
	// takes milliseconds.
	pollInterval = 20 * time.Millisecond

	containerName = "cuda"
	coolC         = 40
	hotC          = 95 // at or above nvmltest.SlowdownC
)

var gpuResource = v1.ResourceName(resname.GPU)

// TestAllocatedResourcesStatus: a GPU the plugin finds unhealthy shows as
// Unhealthy in the allocatedResourcesStatus of the pod it is allocated to,
// and only that pod's, through the kubelet's own device manager; a GPU that
// recovers shows as Healthy again.
func TestAllocatedResourcesStatus(t *testing.T) {
	if !harness.Isolated(t) {
		return
	}
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ResourceHealthStatus, true)

	k := startKubelet(t)
	n := startPlugin(t)
	k.waitCapacity(t, 8, 8)

	a := k.admit(t, n, "pod-a")
	b := k.admit(t, n, "pod-b")
	if a.gpu == b.gpu {
		t.Fatalf("the device manager gave both pods GPU %s", a.gpu)
	}
	for _, p := range []*pod{a, b} {
		if got := k.refresh(p); !reflect.DeepEqual(got, p.want(v1.ResourceHealthStatusHealthy)) {
			t.Fatalf("%s before any fault: allocatedResourcesStatus = %s, want its GPU Healthy", p.Name, toJSON(got))
		}
		t.Logf("%s (GPU %d, %s) before any fault: %s", p.Name, p.index, p.gpu, k.statusJSON(p))
	}

	t.Run("fatal XID marks the pod's GPU unhealthy", func(t *testing.T) {
		k.drainUpdates(t)
		start := time.Now()
		n.events <- gonvml.EventData{Device: n.lib.Devices[a.index], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
		k.waitStatus(t, a, v1.ResourceHealthStatusUnhealthy, start)
		t.Logf("%s after XID 79: %s", a.Name, k.statusJSON(a))
		if got := k.refresh(b); !reflect.DeepEqual(got, b.want(v1.ResourceHealthStatusHealthy)) {
			t.Errorf("XID on %s's GPU changed %s's status: %s", a.Name, b.Name, toJSON(got))
		}
		k.waitCapacity(t, 8, 7)
	})

	t.Run("hot GPU is unhealthy until it cools", func(t *testing.T) {
		k.drainUpdates(t)
		start := time.Now()
		n.temps[b.index].Store(hotC)
		k.waitStatus(t, b, v1.ResourceHealthStatusUnhealthy, start)
		t.Logf("%s at %dC: %s", b.Name, hotC, k.statusJSON(b))
		k.waitCapacity(t, 8, 6)

		start = time.Now()
		n.temps[b.index].Store(coolC)
		k.waitStatus(t, b, v1.ResourceHealthStatusHealthy, start)
		t.Logf("%s cooled to %dC: %s", b.Name, coolC, k.statusJSON(b))
		k.waitCapacity(t, 8, 7)

		// XID 79 is sticky: pod A's GPU stays unhealthy throughout.
		if got := k.refresh(a); !reflect.DeepEqual(got, a.want(v1.ResourceHealthStatusUnhealthy)) {
			t.Errorf("%s after %s's GPU cooled: %s, want its GPU still Unhealthy", a.Name, b.Name, toJSON(got))
		}
	})
}

// kubelet is the device-manager part of a kubelet: the real ManagerImpl,
// the active-pod list the kubelet would give it, and the pod statuses the
// kubelet would keep.
type kubelet struct {
	m   *devicemanager.ManagerImpl
	log klog.Logger
	ctx context.Context

	mu   sync.Mutex
	pods []*v1.Pod
}

// pod is an admitted pod with one container holding one GPU.
type pod struct {
	*v1.Pod
	status v1.PodStatus
	gpu    string // the GPU's UUID, its device-plugin ID
	index  int    // the GPU's index in the mock
}

// want is the allocatedResourcesStatus of p with its GPU in health h.
func (p *pod) want(h v1.ResourceHealthStatus) []v1.ResourceStatus {
	return []v1.ResourceStatus{{
		Name:      gpuResource,
		Resources: []v1.ResourceHealth{{ResourceID: v1.ResourceID(p.gpu), Health: h}},
	}}
}

func startKubelet(t *testing.T) *kubelet {
	t.Helper()
	log := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	k := &kubelet{log: log, ctx: klog.NewContext(context.Background(), log)}
	k.m = harness.StartDeviceManager(t, log, nil, topologymanager.NewFakeManager(log), func() []*v1.Pod {
		k.mu.Lock()
		defer k.mu.Unlock()
		return slices.Clone(k.pods)
	})
	return k
}

// waitCapacity waits until the node would advertise capacity GPUs of
// which allocatable are healthy. The manager signals no change of its own
// devices, so this polls, as the kubelet's node-status loop does.
func (k *kubelet) waitCapacity(t *testing.T, capacity, allocatable int64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		c, a, _ := k.m.GetCapacity(k.log)
		gotC, gotA := c[gpuResource], a[gpuResource]
		if gotC.Value() == capacity && gotA.Value() == allocatable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("device manager has %s %s capacity, %s allocatable after %s; want %d, %d",
				gotC.String(), resname.GPU, gotA.String(), waitTimeout, capacity, allocatable)
		}
		<-tick.C
	}
}

// admit makes a pod with one container asking for one GPU active and has
// the device manager allocate it, as the kubelet does at admission.
func (k *kubelet) admit(t *testing.T, n *node, name string) *pod {
	t.Helper()
	one := resource.MustParse("1")
	v := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:  containerName,
			Image: "cuda",
			Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{gpuResource: one},
				Requests: v1.ResourceList{gpuResource: one},
			},
		}}},
	}
	k.mu.Lock()
	k.pods = append(k.pods, v)
	k.mu.Unlock()
	c := &v.Spec.Containers[0]
	if err := k.m.Allocate(k.ctx, v, c, lifecycle.AddOperation); err != nil {
		t.Fatalf("allocating %s: %v", name, err)
	}
	devs := k.m.GetDevices(string(v.UID), containerName)[resname.GPU]
	if len(devs) != 1 {
		t.Fatalf("%s got %d %s devices, want 1", name, len(devs), resname.GPU)
	}
	p := &pod{Pod: v, status: v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: containerName}}}, index: -1}
	for id := range devs {
		p.gpu = id
	}
	for i := range n.lib.Devices {
		if nvmltest.Device(n.lib, i).UUID == p.gpu {
			p.index = i
		}
	}
	if p.index < 0 {
		t.Fatalf("%s got device %q, which is no mock GPU's UUID", name, p.gpu)
	}
	// The container would see the same GPU: the plugin's Allocate answer,
	// as the manager cached it for the runtime.
	opts, err := k.m.GetDeviceRunContainerOptions(k.ctx, v, c)
	if err != nil {
		t.Fatalf("run options of %s: %v", name, err)
	}
	var env []string
	for _, e := range opts.Envs {
		env = append(env, e.Name+"="+e.Value)
	}
	if !slices.Contains(env, gpu.VisibleDevicesEnv+"="+p.gpu) {
		t.Errorf("%s was allocated %s but its container environment is %v", name, p.gpu, env)
	}
	return p
}

// refresh does what the kubelet does when it builds a pod's status: it
// asks the device manager to fill allocatedResourcesStatus.
func (k *kubelet) refresh(p *pod) []v1.ResourceStatus {
	k.m.UpdateAllocatedResourcesStatus(k.log, p.Pod, &p.status)
	return p.status.ContainerStatuses[0].AllocatedResourcesStatus
}

func (k *kubelet) statusJSON(p *pod) string {
	k.refresh(p)
	return toJSON(p.status.ContainerStatuses[0])
}

func toJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// drainUpdates empties the Updates channel, so that the next wait sees
// only what a fault caused.
func (k *kubelet) drainUpdates(t *testing.T) {
	t.Helper()
	for {
		select {
		case u := <-k.m.Updates():
			t.Logf("stale update for pods %v", u.PodUIDs)
		default:
			return
		}
	}
}

// waitStatus waits, as the kubelet's sync loop does, for the device
// manager to name p on its Updates channel, then refreshes p's status and
// expects its GPU in health h. It logs the latencies from start, when the
// fault was injected or cleared.
func (k *kubelet) waitStatus(t *testing.T, p *pod, h v1.ResourceHealthStatus, start time.Time) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case u := <-k.m.Updates():
			if !slices.Contains(u.PodUIDs, string(p.UID)) {
				t.Logf("update for other pods %v", u.PodUIDs)
				continue
			}
			updated := time.Since(start)
			got := k.refresh(p)
			seen := time.Since(start)
			if !reflect.DeepEqual(got, p.want(h)) {
				t.Fatalf("after the device manager's update for %s: allocatedResourcesStatus = %s, want its GPU %s", p.Name, toJSON(got), h)
			}
			t.Logf("latency %s GPU %d -> %s: %s to the Updates channel, %s to the pod status", p.Name, p.index, h, updated, seen)
			return
		case <-timeout:
			t.Fatalf("no device-manager update for %s within %s; its status: %s", p.Name, waitTimeout, toJSON(k.refresh(p)))
		}
	}
}

// node is the plugin running over a mock DGX A100 whose XIDs and
// temperatures the test sets.
type node struct {
	lib    *dgxa100.Server
	events chan<- gonvml.EventData
	temps  []atomic.Uint32
}

// startPlugin runs the whole plugin, daemon.Run, against the kubelet's
// device-plugin directory, as it runs on a node.
func startPlugin(t *testing.T) *node {
	t.Helper()
	n := &node{lib: nvmltest.NewDGXA100()}
	n.events = nvmltest.WithEvents(n.lib)
	n.temps = make([]atomic.Uint32, len(n.lib.Devices))
	for i := range n.lib.Devices {
		n.temps[i].Store(coolC)
		nvmltest.Device(n.lib, i).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			return n.temps[i].Load(), gonvml.SUCCESS
		}
	}
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.DeviceInfoDir = t.TempDir()
	cfg.DevicePluginDir = pluginapi.DevicePluginPath
	cfg.SysfsRoot = t.TempDir()
	cfg.DevRoot = t.TempDir()
	cfg.HealthPollInterval = config.Duration{Duration: pollInterval}
	open := func(string) (nvml.Library, error) { return n.lib, nil }
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("component", "plugin")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, cfg, open, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("plugin: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("plugin did not stop within %s", waitTimeout)
		}
	})
	return n
}

// testWriter sends the plugin's log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

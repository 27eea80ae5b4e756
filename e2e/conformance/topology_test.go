package conformance

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// rdmaAny is one NIC pool of all eight ConnectX-7s of the dgx-h100 tree,
// four on each NUMA node, so that the Topology Manager, not the pool,
// decides which node's NIC a pod gets.
const rdmaAny = "example.com/rdma"

// twoNUMANodes is the machine description the kubelet would get from
// cadvisor for a two-socket DGX: NUMA nodes 0 and 1, 56 cores each.
func twoNUMANodes() []cadvisorapi.Node {
	nodes := make([]cadvisorapi.Node, 2)
	for id := range nodes {
		nodes[id] = cadvisorapi.Node{Id: id, Memory: 1 << 40, Distances: []uint64{10, 21}}
		if id == 1 {
			nodes[id].Distances = []uint64{21, 10}
		}
		for c := range 56 {
			core := id*56 + c
			nodes[id].Cores = append(nodes[id].Cores, cadvisorapi.Core{Id: core, Threads: []int{core, core + 112}, SocketID: id})
		}
	}
	return nodes
}

// TestTopologyAlignment proves what the README tells operators: with the
// kubelet's Topology Manager on `single-numa-node`, a pod's GPUs and NIC
// end up on one NUMA node, and a pod that cannot be aligned is rejected at
// admission. Both managers are the kubelet's own (topologymanager.NewManager
// with the device manager, devicemanager.ManagerImpl, as its hint
// provider); the plugin is daemon.Run serving the mock DGX's GPUs (0-3 on
// NUMA node 0, 4-7 on node 1) and one NIC pool with four NICs on each
// node. Pods go through the Topology Manager's Admit, as the kubelet's
// admission does; the GPUs and NICs checked are the ones the device
// manager recorded and the plugin's Allocate put in the container's
// environment.
func TestTopologyAlignment(t *testing.T) {
	if !harness.Isolated(t) {
		return
	}
	started := time.Now()
	k := startAligningKubelet(t, topologymanager.PolicySingleNumaNode, topologymanager.ContainerTopologyScope)

	root := sysfstest.Load(t, "dgx-h100")
	cfg := config.Default()
	cfg.DevicePluginDir = pluginapi.DevicePluginPath
	cfg.SysfsRoot, cfg.ProcRoot, cfg.DevRoot = filepath.Join(root, "sys"), filepath.Join(root, "proc"), filepath.Join(root, "dev")
	rdma := true
	cfg.NICResources = []config.NICResource{{
		Name:      rdmaAny,
		Selectors: config.NICSelectors{Vendors: []string{"15b3"}, Devices: []string{"1021"}, Drivers: []string{"mlx5_core"}, RDMA: &rdma},
	}}
	lib := nvmltest.NewDGXA100()
	numa := map[string]int{} // device ID -> NUMA node, from the fixtures
	for i := range lib.Devices {
		numa[nvmltest.Device(lib, i).UUID] = i / 4
	}
	for pool, nics := range poolNICs {
		for addr := range nics {
			numa[addr] = int(poolNUMA[pool])
		}
	}
	startDaemon(t, cfg, lib)
	k.waitCapacity(t, map[string]int64{resname.GPU: 8, rdmaAny: 8})
	t.Logf("kubelet and plugin ready in %v", time.Since(started))

	t.Run("2 GPUs and a NIC: four pods, each on one NUMA node, two per node", func(t *testing.T) {
		perNode := map[int]int{}
		for i := range 4 {
			p := k.admit(t, fmt.Sprintf("two-gpus-%d", i), 2, 1)
			perNode[k.checkAligned(t, p, numa, 2, 1)]++
		}
		if perNode[0] != 2 || perNode[1] != 2 {
			t.Errorf("pods per NUMA node = %v, want 2 on each", perNode)
		}
		// Every GPU is taken: the device manager has nothing to hint, and
		// the Topology Manager rejects it.
		k.rejected(t, "two-gpus-4", 2, 1)
	})
	k.endAll()

	t.Run("more GPUs than a NUMA node has, plus a NIC: rejected", func(t *testing.T) {
		// Eight GPUs are free, but only four on each node.
		k.rejected(t, "five-gpus", 5, 1)
		// Nothing stays allocated: both nodes can still take four.
		for i := range 2 {
			p := k.admit(t, fmt.Sprintf("four-gpus-%d", i), 4, 1)
			k.checkAligned(t, p, numa, 4, 1)
		}
	})
	k.endAll()

	t.Run("one free GPU on each node is no aligned pair", func(t *testing.T) {
		a := k.admit(t, "three-gpus-a", 3, 1)
		b := k.admit(t, "three-gpus-b", 3, 1)
		if na, nb := k.checkAligned(t, a, numa, 3, 1), k.checkAligned(t, b, numa, 3, 1); na == nb {
			t.Fatalf("both 3-GPU pods on NUMA node %d", na)
		}
		// Two GPUs are free, one per node: without the Topology Manager
		// the device manager would hand them out across nodes.
		k.rejected(t, "two-gpus-split", 2, 1)
		// One GPU with three NICs fits on either node.
		for _, name := range []string{"one-gpu-a", "one-gpu-b"} {
			p := k.admit(t, name, 1, 3)
			k.checkAligned(t, p, numa, 1, 3)
		}
	})
	t.Logf("TestTopologyAlignment took %v", time.Since(started))
}

// aligningKubelet is the part of a kubelet that admits pods with devices:
// the Topology Manager with the device manager as its hint provider, and
// the active pods the kubelet would list.
type aligningKubelet struct {
	tm  topologymanager.Manager
	dm  *devicemanager.ManagerImpl
	log klog.Logger
	ctx context.Context

	mu   sync.Mutex
	pods []*v1.Pod
}

// startAligningKubelet wires the two managers as the kubelet's container
// manager does (the device manager gets the Topology Manager as its
// affinity store and registers as a hint provider) and starts the device
// manager's registration server in pluginapi.DevicePluginPath.
func startAligningKubelet(t *testing.T, policy, scope string) *aligningKubelet {
	t.Helper()
	log := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	k := &aligningKubelet{log: log, ctx: klog.NewContext(context.Background(), log)}
	machine := twoNUMANodes()
	tm, err := topologymanager.NewManager(log, machine, policy, scope, nil)
	if err != nil {
		t.Fatal(err)
	}
	dm := harness.StartDeviceManager(t, log, machine, tm, func() []*v1.Pod {
		k.mu.Lock()
		defer k.mu.Unlock()
		return slices.Clone(k.pods)
	})
	tm.AddHintProvider(log, dm)
	k.tm, k.dm = tm, dm
	return k
}

// waitCapacity waits until every resource in want is registered with that
// many healthy devices. The device manager signals no change of its own,
// so this polls, as the kubelet's node-status loop does.
func (k *aligningKubelet) waitCapacity(t *testing.T, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		_, allocatable, _ := k.dm.GetCapacity(k.log)
		got := map[string]int64{}
		for res := range want {
			q := allocatable[v1.ResourceName(res)]
			got[res] = q.Value()
		}
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("device manager has %v allocatable after %v, want %v", got, waitTimeout, want)
		}
		<-tick.C
	}
}

const alignedContainer = "train"

// newPod is a pod with one container asking for gpus GPUs and nics NICs of
// the rdmaAny pool.
func newPod(name string, gpus, nics int64) *v1.Pod {
	res := v1.ResourceList{
		v1.ResourceName(resname.GPU): *resource.NewQuantity(gpus, resource.DecimalSI),
		v1.ResourceName(rdmaAny):     *resource.NewQuantity(nics, resource.DecimalSI),
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      alignedContainer,
			Image:     "trainer",
			Resources: v1.ResourceRequirements{Limits: res, Requests: res},
		}}},
	}
}

// tryAdmit makes the pod active and runs the Topology Manager's admission
// on it, as the kubelet's admit handlers do; a rejected pod is no longer
// active (the kubelet fails it).
func (k *aligningKubelet) tryAdmit(p *v1.Pod) lifecycle.PodAdmitResult {
	k.mu.Lock()
	others := slices.Clone(k.pods)
	k.pods = append(k.pods, p)
	k.mu.Unlock()
	res := k.tm.Admit(k.ctx, &lifecycle.PodAdmitAttributes{Pod: p, OtherPods: others, Operation: lifecycle.AddOperation})
	if !res.Admit {
		k.mu.Lock()
		k.pods = slices.DeleteFunc(k.pods, func(q *v1.Pod) bool { return q == p })
		k.mu.Unlock()
	}
	return res
}

// admit admits a pod asking for gpus GPUs and nics NICs and fails the
// test if it is rejected.
func (k *aligningKubelet) admit(t *testing.T, name string, gpus, nics int64) *v1.Pod {
	t.Helper()
	p := newPod(name, gpus, nics)
	if res := k.tryAdmit(p); !res.Admit {
		t.Fatalf("%s (%d GPUs, %d NICs) rejected: %s: %s", name, gpus, nics, res.Reason, res.Message)
	}
	return p
}

// rejected expects the Topology Manager to reject a pod asking for gpus
// GPUs and nics NICs with its TopologyAffinityError, with nothing
// allocated to it.
func (k *aligningKubelet) rejected(t *testing.T, name string, gpus, nics int64) {
	t.Helper()
	p := newPod(name, gpus, nics)
	res := k.tryAdmit(p)
	if res.Admit {
		t.Fatalf("%s (%d GPUs, %d NICs) admitted with %v; want a TopologyAffinityError", name, gpus, nics, k.deviceIDs(p))
	}
	wantMsg := topologymanager.NewTopologyAffinityError().Error()
	if res.Reason != topologymanager.ErrorTopologyAffinity || res.Message != wantMsg {
		t.Errorf("%s rejected with %q: %q; want %q: %q", name, res.Reason, res.Message, topologymanager.ErrorTopologyAffinity, wantMsg)
	}
	if devs := k.deviceIDs(p); len(devs) > 0 {
		t.Errorf("rejected %s holds devices %v", name, devs)
	}
	t.Logf("%s (%d GPUs, %d NICs) rejected: %s: %s", name, gpus, nics, res.Reason, res.Message)
}

// deviceIDs are the device IDs the device manager recorded for p, by
// resource.
func (k *aligningKubelet) deviceIDs(p *v1.Pod) map[string][]string {
	ids := map[string][]string{}
	for res, devs := range k.dm.GetDevices(string(p.UID), alignedContainer) {
		if len(devs) > 0 {
			ids[res] = slices.Sorted(maps.Keys(devs))
		}
	}
	return ids
}

// checkAligned checks that p got gpus GPUs and nics NICs all on one NUMA
// node (by the fixtures' numa), that the Topology Manager's affinity for
// it is that node, and that the container's environment, the plugin's
// Allocate answer, names the same devices. It returns the node.
func (k *aligningKubelet) checkAligned(t *testing.T, p *v1.Pod, numa map[string]int, gpus, nics int) int {
	t.Helper()
	devs := k.deviceIDs(p)
	gotGPUs, gotNICs := devs[resname.GPU], devs[rdmaAny]
	if len(gotGPUs) != gpus || len(gotNICs) != nics {
		t.Fatalf("%s got GPUs %v and NICs %v, want %d and %d", p.Name, gotGPUs, gotNICs, gpus, nics)
	}
	nodes := map[int][]string{}
	for _, id := range append(slices.Clone(gotGPUs), gotNICs...) {
		n, ok := numa[id]
		if !ok {
			t.Fatalf("%s got %s, which is no fixture device", p.Name, id)
		}
		nodes[n] = append(nodes[n], id)
	}
	if len(nodes) != 1 {
		t.Fatalf("%s's devices span NUMA nodes: %v", p.Name, nodes)
	}
	node := slices.Collect(maps.Keys(nodes))[0]
	aff := k.tm.GetAffinity(k.log, string(p.UID), alignedContainer)
	if bits := aff.NUMANodeAffinity.GetBits(); !slices.Equal(bits, []int{node}) || !aff.Preferred {
		t.Errorf("%s: Topology Manager affinity %v (preferred %v), want NUMA node %d preferred", p.Name, bits, aff.Preferred, node)
	}

	opts, err := k.dm.GetDeviceRunContainerOptions(k.ctx, p, &p.Spec.Containers[0])
	if err != nil {
		t.Fatalf("run options of %s: %v", p.Name, err)
	}
	env := map[string]string{}
	for _, e := range opts.Envs {
		env[e.Name] = e.Value
	}
	visible := strings.Split(env[gpu.VisibleDevicesEnv], ",")
	if !slices.Equal(slices.Sorted(slices.Values(visible)), gotGPUs) {
		t.Errorf("%s: %s=%q, want the GPUs %v", p.Name, gpu.VisibleDevicesEnv, env[gpu.VisibleDevicesEnv], gotGPUs)
	}
	const pciEnv = "PCIDEVICE_EXAMPLE_COM_RDMA"
	if got := strings.Split(env[pciEnv], ","); !slices.Equal(slices.Sorted(slices.Values(got)), gotNICs) {
		t.Errorf("%s: %s=%q, want the NICs %v", p.Name, pciEnv, env[pciEnv], gotNICs)
	}
	t.Logf("%s: NUMA node %d: GPUs %v, NICs %v", p.Name, node, gotGPUs, gotNICs)
	return node
}

// endAll ends every pod, as when they complete: the device manager frees
// their devices at its next look at the active pods.
func (k *aligningKubelet) endAll() {
	k.mu.Lock()
	k.pods = nil
	k.mu.Unlock()
}

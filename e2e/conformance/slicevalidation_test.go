package conformance

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	resourceinternal "k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install" // the resource.k8s.io conversions, as the API server has them
	resourceslicestrategy "k8s.io/kubernetes/pkg/registry/resource/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi/kubeapitest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
)

// validateSlice runs what a v1.37 API server runs on a ResourceSlice
// create (old nil) or update: the v1 object converted to the internal
// type through the API server's scheme, the registry strategy's
// PrepareForCreate/Update (which drops the fields of disabled features),
// its hand-written validation and the declarative one. A dropped field is
// an error too: the API server would store less than we published.
func validateSlice(obj, old *resourceapi.ResourceSlice) error {
	var in, prev resourceinternal.ResourceSlice
	if err := legacyscheme.Scheme.Convert(obj, &in, nil); err != nil {
		return fmt.Errorf("converting to the internal type: %w", err)
	}
	if in.Name == "" && in.GenerateName != "" {
		in.Name = names.SimpleNameGenerator.GenerateName(in.GenerateName)
	}
	ctx := genericapirequest.WithNamespace(context.Background(), metav1.NamespaceNone)
	info := &genericapirequest.RequestInfo{IsResourceRequest: true, APIGroup: resourceapi.GroupName, APIVersion: "v1", Resource: "resourceslices", Name: in.Name}
	var err error
	if old == nil {
		info.Verb = "create"
		rest.FillObjectMetaSystemFields(&in)
		err = rest.BeforeCreate(resourceslicestrategy.Strategy, genericapirequest.WithRequestInfo(ctx, info), &in)
	} else {
		info.Verb = "update"
		if err := legacyscheme.Scheme.Convert(old, &prev, nil); err != nil {
			return fmt.Errorf("converting the old slice: %w", err)
		}
		in.UID, in.CreationTimestamp, in.ResourceVersion = prev.UID, prev.CreationTimestamp, prev.ResourceVersion
		err = rest.BeforeUpdate(resourceslicestrategy.Strategy, genericapirequest.WithRequestInfo(ctx, info), &in, &prev)
	}
	if err != nil {
		return err
	}
	var back resourceapi.ResourceSlice
	if err := legacyscheme.Scheme.Convert(&in, &back, nil); err != nil {
		return fmt.Errorf("converting back: %w", err)
	}
	if !apiequality.Semantic.DeepEqual(back.Spec, obj.Spec) {
		return fmt.Errorf("the API server drops fields of slice %s: stored spec differs from the one sent", in.Name)
	}
	return nil
}

// validatingAPIServer is harness.FakeAPIServer refusing, as a v1.37 API
// server would, each ResourceSlice create or update that validateSlice
// rejects; the refusals are kept.
type validatingAPIServer struct {
	client *fake.Clientset
	mu     sync.Mutex
	errs   []error
	// refused is signalled at each refusal.
	refused chan struct{}
}

func newValidatingAPIServer(objs ...runtime.Object) *validatingAPIServer {
	v := &validatingAPIServer{client: harness.FakeAPIServer(objs...), refused: make(chan struct{}, 1)}
	check := func(a k8stesting.Action) (bool, runtime.Object, error) {
		var obj runtime.Object
		switch a := a.(type) {
		case k8stesting.CreateAction:
			obj = a.GetObject()
		case k8stesting.UpdateAction:
			obj = a.GetObject()
		default:
			return false, nil, nil
		}
		sl, ok := obj.(*resourceapi.ResourceSlice)
		if !ok {
			return false, nil, nil
		}
		var old *resourceapi.ResourceSlice
		if a.GetVerb() == "update" {
			o, err := v.client.Tracker().Get(a.GetResource(), "", sl.Name)
			if err != nil {
				return true, nil, err
			}
			old = o.(*resourceapi.ResourceSlice)
		}
		if err := validateSlice(sl, old); err != nil {
			v.mu.Lock()
			v.errs = append(v.errs, err)
			v.mu.Unlock()
			select {
			case v.refused <- struct{}{}:
			default:
			}
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		return false, nil, nil
	}
	v.client.PrependReactor("create", "resourceslices", check)
	v.client.PrependReactor("update", "resourceslices", check)
	return v
}

func (v *validatingAPIServer) refusals() []error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.errs)
}

// sliceProfile is a node as the driver is told it: GPUs, NIC pools, their
// health, and the GPUs evicting.
type sliceProfile struct {
	gpus   draslice.GPUs
	pools  []draslice.NICPool
	health map[string]string // unhealthy devices by model ID: the reason
	evict  []string          // GPU UUIDs
}

const validationNode = "validation-node"

// publishThroughAPIServer gives the driver the profile, publishes its
// Resources (what the plugin hands the publisher) through the
// plugin's own publisher (package slicepub) into a validating API server, and
// returns the slices stored there once every device and counter set is.
func publishThroughAPIServer(t *testing.T, p sliceProfile) []resourceapi.ResourceSlice {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := dra.New(dra.Options{
		DriverName: draDriver, NodeName: validationNode, SysfsRoot: pcieSysfs(t, p),
		GPUCDIID: func(uuid string) string { return draDriver + "/gpu=" + uuid },
		NICCDIID: func(pool, addr string) string { return "example.com/" + pool + "=" + addr },
		Sources:  1 + len(p.pools),
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, reason := range p.health {
		d.SetHealth(id, false, reason)
	}
	d.SetGPUs(ctx, p.gpus)
	for _, pool := range p.pools {
		var devs []device.Device
		for _, n := range pool.NICs {
			reason, bad := p.health[n.Address]
			devs = append(devs, device.Device{ID: n.Address, Healthy: !bad, Reason: reason})
		}
		d.SetNICPool(ctx, pool, devs, true)
	}
	for _, uuid := range p.evict {
		d.Evict(uuid, true)
	}
	res := d.Resources()
	wantDevices, wantSets := 0, 0
	for _, sl := range res.Pools[validationNode].Slices {
		wantDevices += len(sl.Devices)
		wantSets += len(sl.SharedCounters)
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: validationNode, UID: types.UID("node-uid")}}
	api := newValidatingAPIServer(node)
	var handled []error
	var hmu sync.Mutex
	failed := make(chan struct{}, 1)
	// Stored slices come as watch events, refusals and the controller's
	// errors on their channels: each wakes the check below.
	w, err := api.client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	kc, err := kubeapi.New(kubeapitest.Serve(t, api.client, nil))
	if err != nil {
		t.Fatal(err)
	}
	pub := slicepub.Start(ctx, slicepub.Options{
		Driver: draDriver, Node: validationNode, API: draapi.New(kc, 1e6, 1e6, "gpu-device-plugin"),
		OnError: func(_ context.Context, err error, msg string) {
			hmu.Lock()
			handled = append(handled, fmt.Errorf("%s: %w", msg, err))
			hmu.Unlock()
			select {
			case failed <- struct{}{}:
			default:
			}
		},
	})
	defer pub.Stop()
	if err := pub.PublishResources(ctx, res); err != nil {
		t.Fatal(err)
	}

	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		if errs := api.refusals(); len(errs) > 0 {
			t.Fatalf("the v1.37 API server refuses our ResourceSlices:\n%v", errs[0])
		}
		hmu.Lock()
		herrs := slices.Clone(handled)
		hmu.Unlock()
		if len(herrs) > 0 {
			t.Fatalf("the ResourceSlice controller failed: %v", herrs[0])
		}
		list, err := api.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		devs, sets := 0, 0
		for _, sl := range list.Items {
			devs += len(sl.Spec.Devices)
			sets += len(sl.Spec.SharedCounters)
		}
		if devs == wantDevices && sets == wantSets {
			return list.Items
		}
		select {
		case <-w.ResultChan():
		case <-api.refused:
		case <-failed:
		case <-deadline.C:
			t.Fatalf("the API server holds %d devices and %d counter sets in %d slices after %v, want %d and %d", devs, sets, len(list.Items), waitTimeout, wantDevices, wantSets)
		}
	}
}

// pcieSysfs is a sysfs where every GPU and NIC of p hangs under one of
// two PCIe root complexes, so the slices carry pcieRoot as on a real node.
func pcieSysfs(t *testing.T, p sliceProfile) string {
	t.Helper()
	root := t.TempDir()
	var addrs []string
	for _, g := range p.gpus.GPUs {
		addrs = append(addrs, g.PCIBusID)
	}
	for _, pool := range p.pools {
		for _, n := range pool.NICs {
			addrs = append(addrs, n.Address)
		}
	}
	for i, addr := range addrs {
		rc := fmt.Sprintf("pci0000:%02x", i%2*0x80)
		dev := filepath.Join(root, "devices", rc, "0000:00:01.0", addr)
		link := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dev, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "..", "devices", rc, "0000:00:01.0", addr), link); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// h100s are n H100 SXM GPUs, all joined by NVSwitch (one NVLink island).
func h100s(n int) draslice.GPUs {
	in := draslice.GPUs{DriverVersion: "580.65.06", CUDADriverVersion: 13000}
	nv := nvml.Link{NVLinks: 18, PCIe: nvml.LinkCrossCPU}
	for i := range n {
		in.GPUs = append(in.GPUs, nvml.GPU{
			Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08x-1b2c-4d5e-8f90-a1b2c3d4e5f6", i),
			Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
			NUMANode: i * 2 / n, MIGCapable: true, Brand: "nvidia", Architecture: "hopper", CUDAComputeCapability: "9.0",
		})
		row := make([]nvml.Link, n)
		for j := range row {
			if j != i {
				row[j] = nv
			}
		}
		in.Topology.Links = append(in.Topology.Links, row)
	}
	return in
}

// h100MIGLayout is what an H100 in MIG mode allows (the driver's profile
// IDs, placements in memory slices).
func h100MIGLayout() nvml.MIGLayout {
	l := nvml.MIGLayout{MemorySlices: 8, ComputeSlices: 7}
	add := func(index int, id uint32, name string, cs, size, instances int, mib uint64, sms int, starts ...int) {
		for _, s := range starts {
			l.Placements = append(l.Placements, nvml.MIGPlacement{ProfileIndex: index, ProfileID: id, Profile: name, Start: s, Size: size,
				ComputeSlices: cs, Instances: instances, MemoryBytes: mib << 20, Multiprocessors: sms})
		}
	}
	add(0, 19, "1g.10gb", 1, 1, 7, 9856, 16, 0, 1, 2, 3, 4, 5, 6)
	add(7, 20, "1g.10gb+me", 1, 1, 1, 9856, 16, 0, 1, 2, 3, 4, 5, 6)
	add(9, 15, "1g.20gb", 1, 2, 4, 20096, 26, 0, 2, 4, 6)
	add(1, 14, "2g.20gb", 2, 2, 3, 20096, 32, 0, 2, 4)
	add(2, 9, "3g.40gb", 3, 4, 2, 40320, 60, 0, 4)
	add(3, 5, "4g.40gb", 4, 4, 1, 40320, 64, 0)
	add(4, 0, "7g.80gb", 7, 8, 1, 80896, 132, 0)
	return l
}

// withMIG puts GPU i in MIG mode with a 3g.40gb and two 2g.20gb devices.
func withMIG(in draslice.GPUs, i int) {
	g := &in.GPUs[i]
	g.MIGEnabled = true
	for k, prof := range []struct {
		name string
		mem  uint64
		sms  int
	}{{"3g.40gb", 40320 << 20, 60}, {"2g.20gb", 20096 << 20, 32}, {"2g.20gb", 20096 << 20, 32}} {
		g.MIG = append(g.MIG, nvml.MIGDevice{
			UUID: fmt.Sprintf("MIG-%08x-0000-4000-8000-%012x", i, k), Index: k, GPUInstance: 1 + k, Profile: prof.name,
			MemoryBytes: prof.mem, Multiprocessors: prof.sms, CapMinors: []int{100 + 10*k, 101 + 10*k},
		})
	}
}

// partitioned partitions the GPUs idx (sharing.migPartitions).
func partitioned(in draslice.GPUs, idx ...int) draslice.GPUs {
	in.Partitions = map[string]draslice.Partition{}
	for _, i := range idx {
		in.GPUs[i].MIGEnabled = true
		in.Partitions[in.GPUs[i].UUID] = draslice.Partition{Layout: h100MIGLayout()}
	}
	return in
}

// connectX is a pool of n ConnectX-7 NICs, one netdev and RDMA device each.
func connectX(name string, first, n int) draslice.NICPool {
	p := draslice.NICPool{Name: name}
	for i := range n {
		p.NICs = append(p.NICs, sysfs.NIC{
			Address: fmt.Sprintf("0000:%02x:00.%d", 0xa0+first+i, 0), Vendor: "15b3", Device: "1021", Driver: "mlx5_core", NUMANode: i % 2,
			Netdevs: []string{fmt.Sprintf("ibp%ds0", 0xa0+first+i)}, LinkType: sysfs.LinkInfiniBand,
			IBDevices: []string{fmt.Sprintf("mlx5_%d", first+i)}, RDMADevices: []string{fmt.Sprintf("uverbs%d", first+i)},
		})
	}
	return p
}

// TestSlicesValidAgainstV137 publishes the richest nodes the driver
// knows through the plugin's own ResourceSlice publisher (package slicepub)
// into an API server that runs v1.37's ResourceSlice strategy and
// validation on every write: each must be stored whole, and within the
// API's limits.
func TestSlicesValidAgainstV137(t *testing.T) {
	dgx := func() draslice.GPUs { return h100s(8) }
	profiles := map[string]func() sliceProfile{
		"DGX H100 8 GPUs NVLink": func() sliceProfile { return sliceProfile{gpus: dgx()} },
		"MIG mixed": func() sliceProfile {
			in := dgx()
			for _, i := range []int{0, 3, 5} {
				withMIG(in, i)
			}
			return sliceProfile{gpus: in}
		},
		"memory shares (MPS)": func() sliceProfile {
			in := dgx()
			in.MemoryShares = func(g nvml.GPU) bool { return g.Index%2 == 0 }
			in.ShareMinimum = 1 << 30
			return sliceProfile{gpus: in}
		},
		"NIC pools": func() sliceProfile {
			return sliceProfile{gpus: dgx(), pools: []draslice.NICPool{connectX("rdma_numa0", 0, 4), connectX("rdma_numa1", 4, 4)}}
		},
		"partitioned MIG": func() sliceProfile { return sliceProfile{gpus: partitioned(dgx(), 1, 2, 6)} },
		"taints and eviction": func() sliceProfile {
			in := partitioned(dgx(), 2)
			withMIG(in, 5)
			p := connectX("rdma", 0, 2)
			return sliceProfile{gpus: in, pools: []draslice.NICPool{p}, health: map[string]string{
				in.GPUs[0].UUID:        "xid=79, gpu-lost",
				in.GPUs[1].UUID:        "thermal=95C>=slowdown 90C, hw-slowdown+hw-power-brake+sw-thermal, recovery-action=reset",
				in.GPUs[2].UUID:        "xid=48: double-bit ECC error",
				in.GPUs[5].MIG[1].UUID: "xid=94",
				in.GPUs[7].UUID:        draslice.RemediationPrefix + "draining: xid=48: double bit ECC, waiting for 2 pods",
				p.NICs[1].Address:      "RDMA port down: mlx5_1/1",
			}, evict: []string{in.GPUs[0].UUID, in.GPUs[2].UUID}}
		},
		// 16 partitioned GPUs: more devices than one slice takes and
		// more counter sets than one slice takes.
		"HGX 16 GPUs all partitioned, every device tainted": func() sliceProfile {
			in := h100s(16)
			idx := make([]int, 16)
			for i := range idx {
				idx[i] = i
			}
			in = partitioned(in, idx...)
			health := map[string]string{}
			for _, g := range in.GPUs {
				health[g.UUID] = "xid=31, thermal=88C>=slowdown 87C"
			}
			return sliceProfile{gpus: in, pools: []draslice.NICPool{connectX("rdma", 0, 8)}, health: health}
		},
	}
	for _, name := range slices.Sorted(maps.Keys(profiles)) {
		t.Run(name, func(t *testing.T) {
			stored := publishThroughAPIServer(t, profiles[name]())
			lim := limitsOf(stored)
			t.Logf("%d slices, %d devices; most per device: %d attributes+capacities (API: %d), %d taints (%d), %d counter consumptions (%d); most per slice: %d devices, %d counter sets (%d); most counters per set: %d (%d)",
				len(stored), lim.devices, lim.attrs, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice, lim.taints, resourceapi.DeviceTaintsMaxLength,
				lim.consumes, resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice, lim.sliceDevices, lim.sliceSets, resourceapi.ResourceSliceMaxCounterSets,
				lim.counters, resourceapi.ResourceSliceMaxCountersPerCounterSet)
			if lim.sliceDevices > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
				t.Errorf("a slice holds %d devices; with taints or counters the API takes %d", lim.sliceDevices, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
			}
			for _, sl := range stored {
				if ptr.Deref(sl.Spec.NodeName, "") != validationNode || sl.Spec.Driver != draDriver || sl.Spec.Pool.ResourceSliceCount != int64(len(stored)) {
					t.Errorf("slice %s: node %v driver %s pool %+v", sl.Name, sl.Spec.NodeName, sl.Spec.Driver, sl.Spec.Pool)
				}
			}
		})
	}
}

// sliceLimits are the largest figures of a node's slices that the API
// bounds.
type sliceLimits struct {
	devices, attrs, taints, consumes, sliceDevices, sliceSets, counters int
}

func limitsOf(stored []resourceapi.ResourceSlice) sliceLimits {
	var l sliceLimits
	for _, sl := range stored {
		l.devices += len(sl.Spec.Devices)
		l.sliceDevices = max(l.sliceDevices, len(sl.Spec.Devices))
		l.sliceSets = max(l.sliceSets, len(sl.Spec.SharedCounters))
		for _, cs := range sl.Spec.SharedCounters {
			l.counters = max(l.counters, len(cs.Counters))
		}
		for _, d := range sl.Spec.Devices {
			l.attrs = max(l.attrs, len(d.Attributes)+len(d.Capacity))
			l.taints = max(l.taints, len(d.Taints))
			l.consumes = max(l.consumes, len(d.ConsumesCounters))
		}
	}
	return l
}

// TestSliceValidationRefuses proves validateSlice is the API server's
// judgement and not a formality: slices the v1.37 API refuses are
// refused, each for the reason given.
func TestSliceValidationRefuses(t *testing.T) {
	ok := func() *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: validationNode + "-" + draDriver + "-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: draDriver, NodeName: ptr.To(validationNode),
				Pool: resourceapi.ResourcePool{Name: validationNode, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"uuid": {StringValue: ptr.To("GPU-0")},
				}}},
			},
		}
	}
	if err := validateSlice(ok(), nil); err != nil {
		t.Fatalf("a plain valid slice is refused: %v", err)
	}
	taint := resourceapi.DeviceTaint{Key: draDriver + "/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	for name, c := range map[string]struct {
		change func(*resourceapi.ResourceSlice)
		want   string
	}{
		"attribute name with a space": {func(s *resourceapi.ResourceSlice) {
			s.Spec.Devices[0].Attributes["product name"] = resourceapi.DeviceAttribute{StringValue: ptr.To("H100")}
		}, "attributes"},
		"attribute value over 64 characters": {func(s *resourceapi.ResourceSlice) {
			s.Spec.Devices[0].Attributes["netdev"] = resourceapi.DeviceAttribute{StringValue: ptr.To(strings.Repeat("ibp1s0,", 10))}
		}, "64"},
		"65 tainted devices in one slice": {func(s *resourceapi.ResourceSlice) {
			s.Spec.Devices = nil
			for i := range resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures + 1 {
				s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Taints: []resourceapi.DeviceTaint{taint}})
			}
		}, "devices"},
		"17 taints on a device": {func(s *resourceapi.ResourceSlice) {
			for i := range resourceapi.DeviceTaintsMaxLength + 1 {
				tt := taint
				tt.Key = fmt.Sprintf("%s/cond-%d", draDriver, i)
				s.Spec.Devices[0].Taints = append(s.Spec.Devices[0].Taints, tt)
			}
		}, "taints"},
		"33 attributes on a device": {func(s *resourceapi.ResourceSlice) {
			for i := range resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				s.Spec.Devices[0].Attributes[resourceapi.QualifiedName(fmt.Sprintf("a%d", i))] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
			}
		}, "attributes"},
		"devices and counter sets in one slice": {func(s *resourceapi.ResourceSlice) {
			s.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-slices", Counters: map[string]resourceapi.Counter{"compute-slices": {}}}}
		}, "sharedCounters"},
	} {
		t.Run(name, func(t *testing.T) {
			s := ok()
			c.change(s)
			err := validateSlice(s, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want a refusal naming %q", err, c.want)
			}
		})
	}
}

package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
)

// fakeMPS records what the driver asks of the daemons.
type fakeMPS struct {
	mu   sync.Mutex
	sets [][]mpsd.GPU
	down map[string]error // WaitUp fails for these
	spec []cdi.Device
	// slices are the time-slice levels set, "uuid=level" in order;
	// sliceErr fails them.
	slices   []string
	sliceErr error
	// gate, when set, holds WaitUp until closed; waiting is closed once
	// one waits there.
	gate, waiting chan struct{}
}

func (f *fakeMPS) setTimeSlice(_ context.Context, uuid string, level int) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sliceErr != nil {
		return "", f.sliceErr
	}
	f.slices = append(f.slices, fmt.Sprintf("%s=%d", uuid, level))
	return "set", nil
}

func (f *fakeMPS) Set(_ context.Context, gpus []mpsd.GPU) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, slices.Clone(gpus))
}

func (f *fakeMPS) WaitUp(ctx context.Context, uuid string) error {
	f.mu.Lock()
	gate, waiting := f.gate, f.waiting
	f.mu.Unlock()
	if gate != nil {
		close(waiting)
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.ContainsFunc(f.sets[len(f.sets)-1], func(g mpsd.GPU) bool { return g.UUID == uuid }) {
		return fmt.Errorf("no MPS control daemon is run for GPU %s", uuid)
	}
	return f.down[uuid]
}

func (f *fakeMPS) writeSpec(devs []cdi.Device) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.spec = slices.Clone(devs)
	return nil
}

func (f *fakeMPS) last() []mpsd.GPU {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets[len(f.sets)-1]
}

// env is the spec device's environment, by device name.
func (f *fakeMPS) env() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, d := range f.spec {
		out[d.Name] = strings.Join(d.Env, " ")
	}
	return out
}

// sharedGPUs are testGPUs with gpu-0 and gpu-1 shared by memory.
func sharedGPUs() (out []nvml.GPU, shared func(nvml.GPU) bool) {
	return testGPUs().GPUs, func(g nvml.GPU) bool { return g.Index < 2 }
}

// share is a result for a share of dev consuming mem of its memory.
func share(req, dev, id, mem string) resourceapi.DeviceRequestAllocationResult {
	r := result(req, dev)
	uid := types.UID(id)
	r.ShareID = &uid
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem)}
	return r
}

func withConfig(c *resourceapi.ResourceClaim, params string, requests ...string) *resourceapi.ResourceClaim {
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: testDriver, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	})
	return c
}

func mpsParams(sharing string) string {
	return fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"sharing":%s}`, ConfigAPIVersion, GPUConfigKind, sharing)
}

func newMPSDriver(t *testing.T, dir string) (*Driver, *fakeMPS) {
	t.Helper()
	d, _ := newTestDriver(t, dir, Options{Sources: 1})
	in := testGPUs()
	_, in.MemoryShares = sharedGPUs()
	in.ShareMinimum = 1 << 30
	d.SetGPUs(context.Background(), in)
	m := &fakeMPS{}
	d.SetMPS(context.Background(), m, "/run/mps", m.writeSpec, m.setTimeSlice)
	return d, m
}

func prepare(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) kubelet.PrepareResult {
	t.Helper()
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	return got[c.UID]
}

func TestSharedSlices(t *testing.T) {
	d, _ := newMPSDriver(t, t.TempDir())
	devs := byName(d.Resources().Pools[testNode].Slices[0].Devices)
	g0, g2 := devs["gpu-0"], devs["gpu-2"]
	if g0.AllowMultipleAllocations == nil || !*g0.AllowMultipleAllocations || g2.AllowMultipleAllocations != nil {
		t.Errorf("allowMultipleAllocations: gpu-0 %v, gpu-2 %v; want true, unset", g0.AllowMultipleAllocations, g2.AllowMultipleAllocations)
	}
	p := g0.Capacity["memory"].RequestPolicy
	if p == nil || p.Default.String() != "80Gi" || p.ValidRange == nil || p.ValidRange.Min.String() != "1Gi" {
		t.Errorf("memory request policy = %+v; want default 80Gi (a claim naming no memory takes the GPU whole), min 1Gi", p)
	}
	if g2.Capacity["memory"].RequestPolicy != nil {
		t.Error("gpu-2 is not shared but has a request policy")
	}
}

func TestMemorySharesAreMPSClients(t *testing.T) {
	dir := t.TempDir()
	d, m := newMPSDriver(t, dir)
	a := prepare(t, d, claim("uid-a", "a", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "10Gi")))
	b := prepare(t, d, claim("uid-b", "b", share("g", "gpu-0", "22222222-2222-2222-2222-222222222222", "20Gi")))
	if a.Err != nil || b.Err != nil {
		t.Fatalf("Prepare: %v, %v", a.Err, b.Err)
	}
	if dv := a.Devices[0]; dv.ShareID == nil || string(*dv.ShareID) != "11111111-1111-1111-1111-111111111111" ||
		!slices.Equal(dv.CDIDeviceIDs, []string{"gpu-device-plugin.github.io/gpu=GPU-a", cdi.MPSKind + "=uid-a-gpu-0"}) {
		t.Errorf("claim a's device = %+v; want its share ID, the GPU's and its MPS client's CDI devices", dv)
	}
	// One daemon for the GPU, holding every client to the largest share
	// (b's); each client's environment narrows it to its own.
	if got := m.last(); len(got) != 1 || got[0] != (mpsd.GPU{UUID: "GPU-a", Replicas: 1, MaxShares: 1, ThreadPercentage: 25, Memory: 20 << 30}) {
		t.Errorf("daemons = %+v", got)
	}
	env := m.env()
	for name, want := range map[string]string{
		"uid-a-gpu-0": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
		"uid-b-gpu-0": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
	} {
		if env[name] != want {
			t.Errorf("spec device %s env = %q, want %q", name, env[name], want)
		}
	}
	if len(m.spec) > 0 && (len(m.spec[0].Mounts) != 2 || m.spec[0].Mounts[0].HostPath != "/run/mps/GPU-a/pipe" || m.spec[0].Mounts[1].ContainerPath != "/dev/shm") {
		t.Errorf("mounts = %+v", m.spec[0].Mounts)
	}
	// The whole GPU is not free while shares are held; a third share is.
	if r := prepare(t, d, claim("uid-x", "whole", result("g", "gpu-0"))); r.Err == nil || !strings.Contains(r.Err.Error(), "is prepared for claim ns/") {
		t.Errorf("whole GPU over shares: %v", r.Err)
	}
	if r := prepare(t, d, claim("uid-y", "same", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "1Gi"))); r.Err == nil || !strings.Contains(r.Err.Error(), "share 11111111-1111-1111-1111-111111111111 of device gpu-0 is prepared for claim ns/a") {
		t.Errorf("same share twice: %v", r.Err)
	}

	// A restart restores the daemon and the spec from the checkpoint.
	d2, _ := newTestDriver(t, dir, Options{Sources: 1})
	d2.SetGPUs(context.Background(), testGPUs())
	m2 := &fakeMPS{}
	d2.SetMPS(context.Background(), m2, "/run/mps", m2.writeSpec, m2.setTimeSlice)
	if got := m2.last(); len(got) != 1 || got[0].UUID != "GPU-a" || len(m2.spec) != 2 {
		t.Errorf("after restart: daemons %+v, spec %d devices", got, len(m2.spec))
	}
	if r := prepare(t, d2, claim("uid-a", "a", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "10Gi"))); r.Err != nil || r.Devices[0].ShareID == nil {
		t.Errorf("prepared again after restart: %+v", r)
	}
	un := func(uid string) {
		if _, err := d2.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: types.UID(uid)}}); err != nil {
			t.Fatal(err)
		}
	}
	un("uid-a")
	if len(m2.spec) != 1 || len(m2.last()) != 1 {
		t.Errorf("after one Unprepare: spec %d devices, daemons %+v", len(m2.spec), m2.last())
	}
	un("uid-b")
	if len(m2.spec) != 0 || len(m2.last()) != 0 {
		t.Errorf("after the last Unprepare: spec %d devices, daemons %+v; want none", len(m2.spec), m2.last())
	}
}

// The daemon of a GPU shared by memory holds every client to the largest
// share prepared on it, recomputed as shares come and go.
func TestMemoryShareDaemonLimits(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	daemon := func(threads int, memory uint64) []mpsd.GPU {
		return []mpsd.GPU{{UUID: "GPU-a", Replicas: 1, MaxShares: 1, ThreadPercentage: threads, Memory: memory}}
	}
	prep := func(c *resourceapi.ResourceClaim) {
		t.Helper()
		if r := prepare(t, d, c); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	un := func(uid string) {
		t.Helper()
		if _, err := d.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: types.UID(uid)}}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		do   func()
		want []mpsd.GPU
	}{
		{"one share: held to it", func() {
			prep(claim("uid-s", "small", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "10Gi")))
		}, daemon(13, 10<<30)},
		{"a larger share: every client held to the larger", func() {
			prep(claim("uid-l", "large", share("g", "gpu-0", "22222222-2222-2222-2222-222222222222", "40Gi")))
		}, daemon(50, 40<<30)},
		{"the larger unprepared: back to the smaller", func() { un("uid-l") }, daemon(13, 10<<30)},
		{"a second share of the same size: each held to exactly its own", func() {
			prep(claim("uid-e", "equal", share("g", "gpu-0", "33333333-3333-3333-3333-333333333333", "10Gi")))
		}, daemon(13, 10<<30)},
		{"an activeThreadPercentage above the others: the threads follow it", func() {
			prep(withConfig(claim("uid-t", "threads", share("g", "gpu-0", "44444444-4444-4444-4444-444444444444", "10Gi")), mpsParams(`{"strategy":"MPS","mps":{"activeThreadPercentage":60}}`)))
		}, daemon(60, 10<<30)},
		{"the last share gone: no daemon", func() { un("uid-s"); un("uid-e"); un("uid-t") }, []mpsd.GPU{}},
	}
	for _, st := range steps {
		st.do()
		if got := m.last(); !slices.Equal(got, st.want) {
			t.Errorf("%s: daemons = %+v, want %+v", st.name, got, st.want)
		}
	}
}

// The log says "enforced by the daemon" only where the daemon holds the
// client to its own limits.
func TestDescribeMPS(t *testing.T) {
	share := &preparedMPS{GPU: "GPU-a", ThreadPercentage: 13, PinnedMemoryMiB: 10240}
	for _, tt := range []struct {
		name   string
		m      *preparedMPS
		daemon mpsd.GPU
		want   string
	}{
		{"held to its own", share, mpsd.GPU{Replicas: 1, MaxShares: 1, ThreadPercentage: 13, Memory: 10 << 30},
			"13% of the threads, 10240 MiB pinned, enforced by the daemon"},
		{"a larger share beside it", share, mpsd.GPU{Replicas: 1, MaxShares: 1, ThreadPercentage: 50, Memory: 40 << 30},
			"13% of the threads, 10240 MiB pinned through its environment only; the daemon holds every client of the GPU to 50% of the threads, 40960 MiB pinned, the largest share prepared on it"},
		{"whole, no memory limit", &preparedMPS{GPU: "GPU-c", ThreadPercentage: 100, Whole: true}, mpsd.GPU{Replicas: 1, MaxShares: 1, ThreadPercentage: 100},
			"100% of the threads, no pinned memory limit, enforced by the daemon"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := describeMPS(tt.m, tt.daemon); got != tt.want {
				t.Errorf("describeMPS = %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestMPSConfigOnWholeGPU(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	c := withConfig(claim("uid-w", "whole", result("g", "gpu-2")), mpsParams(`{"strategy":"MPS","mps":{"activeThreadPercentage":50,"pinnedMemoryLimit":"10Gi"}}`))
	if r := prepare(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	// Held whole: the daemon itself holds every client to the claim's limits.
	if got := m.last(); len(got) != 1 || got[0] != (mpsd.GPU{UUID: "GPU-c", Replicas: 1, MaxShares: 1, ThreadPercentage: 50, Memory: 10 << 30}) {
		t.Errorf("daemons = %+v", got)
	}
	if got := m.env()["uid-w-gpu-2"]; got != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" {
		t.Errorf("env = %q", got)
	}
	// Time-slicing with the default interval is what a claim gets anyway.
	ts := withConfig(claim("uid-t", "ts", result("g", "gpu-1")), mpsParams(`{"strategy":"TimeSlicing"}`))
	if r := prepare(t, d, ts); r.Err != nil || len(r.Devices[0].CDIDeviceIDs) != 1 || len(m.slices) != 0 {
		t.Errorf("time-slicing claim: %+v, intervals set %v", r, m.slices)
	}
}

// A claim's time-slice interval is set on its GPU, and put back to Default
// when the claim goes.
func TestTimeSliceInterval(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	long := withConfig(claim("uid-l", "long", result("g", "gpu-2")), mpsParams(`{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}`))
	if r := prepare(t, d, long); r.Err != nil {
		t.Fatal(r.Err)
	}
	if !slices.Equal(m.slices, []string{"GPU-c=3"}) || d.cp.Claims["uid-l"].Devices[0].TimeSlice != "Long" {
		t.Errorf("set %v, checkpoint %+v; want GPU-c=3 and Long recorded", m.slices, d.cp.Claims["uid-l"].Devices[0])
	}
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: "uid-l"}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.slices, []string{"GPU-c=3", "GPU-c=0"}) {
		t.Errorf("after Unprepare: set %v, want GPU-c back to 0", m.slices)
	}
	m.sliceErr = errors.New("nvidia-smi: Insufficient Permissions")
	r := prepare(t, d, withConfig(claim("uid-s", "short", result("g", "gpu-2")), mpsParams(`{"strategy":"TimeSlicing","timeSlicing":{"interval":"Short"}}`)))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "setting time-slice interval Short: nvidia-smi: Insufficient Permissions") {
		t.Errorf("failed setting: %v", r.Err)
	}
	if _, held := d.cp.Claims["uid-s"]; held {
		t.Error("a claim whose interval could not be set is in the checkpoint")
	}
}

func TestMPSRefusals(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	m.down = map[string]error{"GPU-b": errors.New("nvidia-cuda-mps-control -d: exit status 1")}
	for _, tc := range []struct {
		name string
		c    *resourceapi.ResourceClaim
		want string
	}{
		{"time-slicing a share", withConfig(claim("u1", "c1", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "10Gi")), mpsParams(`{"strategy":"TimeSlicing"}`)),
			"a share, served through MPS, which limits it; remove the TimeSlicing config"},
		{"interval", withConfig(claim("u2", "c2", result("g", "gpu-2")), mpsParams(`{"strategy":"TimeSlicing","timeSlicing":{"interval":"long"}}`)),
			`sharing.timeSlicing.interval: "long" is not an interval; use Default, Short, Medium or Long (as written)`},
		{"limit over the share", withConfig(claim("u3", "c3", share("g", "gpu-0", "33333333-3333-3333-3333-333333333333", "10Gi")), mpsParams(`{"strategy":"MPS","mps":{"pinnedMemoryLimit":"20Gi"}}`)),
			"sharing.mps.pinnedMemoryLimit 20Gi is more than the 10Gi of memory the claim was allocated"},
		{"two MPS GPUs", claim("u4", "c4", share("g", "gpu-0", "44444444-4444-4444-4444-444444444444", "10Gi"), share("h", "gpu-1", "55555555-5555-5555-5555-555555555555", "10Gi")),
			"a container reaches one MPS daemon"},
		{"unknown key", withConfig(claim("u5", "c5", result("g", "gpu-2")), mpsParams(`{"strategy":"MPS","mps":{"threads":50}}`)),
			`opaque config[0] (from the claim) for driver gpu-device-plugin.github.io: parameters do not decode (json: unknown field "threads")`},
		{"bad strategy", withConfig(claim("u6", "c6", result("g", "gpu-2")), mpsParams(`{"strategy":"mps"}`)),
			`sharing.strategy: "mps" is not a strategy; use MPS or TimeSlicing`},
		{"wrong kind", withConfig(claim("u7", "c7", result("g", "gpu-2")), `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`),
			`parameters are apiVersion "resource.nvidia.com/v1beta1" kind "GpuConfig"; this driver takes apiVersion gpu-device-plugin.github.io/v1alpha1 kind GPUConfig`},
		{"percentage", withConfig(claim("u8", "c8", result("g", "gpu-2")), mpsParams(`{"strategy":"MPS","mps":{"activeThreadPercentage":150}}`)),
			"sharing.mps.activeThreadPercentage: 150 is out of range; use 1 to 100"},
		{"daemon down", claim("u9", "c9", share("g", "gpu-1", "99999999-9999-9999-9999-999999999999", "10Gi")),
			"nvidia-cuda-mps-control -d: exit status 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := prepare(t, d, tc.c)
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) || !strings.Contains(r.Err.Error(), tc.c.Name) {
				t.Errorf("err = %v, want one naming the claim with %q", r.Err, tc.want)
			}
			if _, held := d.cp.Claims[tc.c.UID]; held {
				t.Error("refused claim is in the checkpoint")
			}
		})
	}
	// Nothing refused left a daemon or a spec device behind.
	if got := m.last(); len(got) != 0 || len(m.spec) != 0 {
		t.Errorf("after refusals: daemons %+v, spec %+v", got, m.spec)
	}

	// Before the GPUs are up, an MPS claim waits (the kubelet retries).
	early, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	early.SetGPUs(context.Background(), testGPUs())
	r := prepare(t, early, withConfig(claim("u10", "early", result("g", "gpu-2")), mpsParams(`{"strategy":"MPS"}`)))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "MPS control daemons are not running yet") {
		t.Errorf("MPS before SetMPS: %v", r.Err)
	}
}

// A prioritized list's result names the sub-request the scheduler chose
// ("gpu/one"): a config for the request applies to it, and the kubelet is
// answered with that name.
func TestSubRequestConfig(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	c := withConfig(claim("uid-p", "listed", result("gpu/one", "gpu-2")), mpsParams(`{"strategy":"MPS","mps":{"activeThreadPercentage":40}}`), "gpu")
	r := prepare(t, d, c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(r.Devices) != 1 || !slices.Equal(r.Devices[0].Requests, []string{"gpu/one"}) || len(r.Devices[0].CDIDeviceIDs) != 2 {
		t.Errorf("devices = %+v; want gpu/one's, with its MPS client", r.Devices)
	}
	if got := m.last(); len(got) != 1 || got[0].ThreadPercentage != 40 {
		t.Errorf("daemons = %+v; want the config of request gpu applied to gpu/one", got)
	}
	// A config naming another sub-request does not apply.
	other := withConfig(claim("uid-q", "other", result("gpu/two", "gpu-1")), mpsParams(`{"strategy":"MPS"}`), "gpu/one")
	if r := prepare(t, d, other); r.Err != nil || len(r.Devices[0].CDIDeviceIDs) != 1 {
		t.Errorf("config for gpu/one applied to gpu/two: %+v", r)
	}
}

// A claim waiting for its MPS daemon does not hold the driver: another
// claim is prepared meanwhile.
func TestMPSWaitOutsideTheLock(t *testing.T) {
	d, m := newMPSDriver(t, t.TempDir())
	m.mu.Lock()
	m.gate, m.waiting = make(chan struct{}), make(chan struct{})
	m.mu.Unlock()
	done := make(chan kubelet.PrepareResult, 1)
	go func() {
		done <- prepare(t, d, claim("u-mps", "mps", share("g", "gpu-0", "11111111-1111-1111-1111-111111111111", "10Gi")))
	}()
	<-m.waiting
	if r := prepare(t, d, claim("u-whole", "whole", result("g", "gpu-2"))); r.Err != nil {
		t.Errorf("a claim prepared while another waits for its daemon: %v", r.Err)
	}
	close(m.gate)
	if r := <-done; r.Err != nil {
		t.Errorf("the MPS claim, once its daemon is up: %v", r.Err)
	}
}

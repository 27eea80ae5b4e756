package dra

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// fakeClaims is the API server's ResourceClaims, by namespace/name.
type fakeClaims struct {
	mu     sync.Mutex
	claims map[string]*resourceapi.ResourceClaim
	errs   map[string]error
	gets   []string
}

func (f *fakeClaims) GetClaim(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := namespace + "/" + name
	f.gets = append(f.gets, key)
	if err := f.errs[key]; err != nil {
		return nil, err
	}
	c, ok := f.claims[key]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
	return c.DeepCopy(), nil
}

func (f *fakeClaims) getCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.gets)
}

func newFakeClaims(claims ...*resourceapi.ResourceClaim) *fakeClaims {
	f := &fakeClaims{claims: map[string]*resourceapi.ResourceClaim{}, errs: map[string]error{}}
	for _, c := range claims {
		f.claims[c.Namespace+"/"+c.Name] = c
	}
	return f
}

// holding is a pod whose one container holds claim ns/name, with the CDI
// device IDs the kubelet got for each device of this driver's pool.
func holding(pod, claimName string, devices map[string][]string) *podresourcesapi.PodResources {
	dr := &podresourcesapi.DynamicResource{ClaimNamespace: "ns", ClaimName: claimName}
	for _, dev := range slices.Sorted(func(yield func(string) bool) {
		for k := range devices {
			if !yield(k) {
				return
			}
		}
	}) {
		r := &podresourcesapi.ClaimResource{DriverName: testDriver, PoolName: testNode, DeviceName: dev}
		for _, id := range devices[dev] {
			r.CdiDevices = append(r.CdiDevices, &podresourcesapi.CDIDevice{Name: id})
		}
		dr.ClaimResources = append(dr.ClaimResources, r)
	}
	return podresourcestest.Pod("ns", pod, podresourcestest.ClaimContainer("main", dr))
}

const gpuA = "gpu-device-plugin.github.io/gpu=GPU-a"

// trainClaim is claim ns/train (UID uid-1) with GPU gpu-0.
func trainClaim() *resourceapi.ResourceClaim {
	return claim("uid-1", "train", result("gpus", "gpu-0"))
}

// A checkpoint that does not parse: the file is set aside and said once
// with both names, the claim the kubelet's pod holds comes back from
// PodResources and a GET, enters the checkpoint on disk, keeps its GPU
// from a second claim, is answered again as before, and is unprepared.
func TestCorruptCheckpointRebuildsClaims(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"claims":{"uid-1":`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The kubelet lists the helper's metadata CDI device too; it is the
	// helper's to add, not the checkpoint's to keep.
	kl := podresourcestest.Start(t, holding("trainer", "train", map[string][]string{"gpu-0": {gpuA, testDriver + "/metadata=uid-1_gpus"}}))
	api := newFakeClaims(trainClaim())
	var logs logtest.Buffer
	d, _ := newTestDriver(t, dir, Options{
		Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api,
		Log: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	d.Rebuild(ctx)

	if n := strings.Count(logs.String(), "does not parse"); n != 1 || !strings.Contains(logs.String(), path+".corrupt") {
		t.Errorf("the unreadable file was said %d times, want once naming %s.corrupt:\n%s", n, path, logs.String())
	}
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Errorf("the unreadable file was not set aside: %v", err)
	}
	cp, err := loadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := cp.Claims["uid-1"]
	if !ok || p.Namespace != "ns" || p.Name != "train" || len(p.Devices) != 1 ||
		p.Devices[0].Device != "gpu-0" || p.Devices[0].Pool != testNode || !slices.Equal(p.Devices[0].Requests, []string{"gpus"}) ||
		!slices.Equal(p.Devices[0].CDIDeviceIDs, []string{gpuA}) {
		t.Fatalf("checkpoint on disk after the rebuild: %+v", cp.Claims)
	}
	if !strings.Contains(logs.String(), "rebuilt prepared claims") {
		t.Errorf("the rebuild was not logged:\n%s", logs.String())
	}

	d.SetGPUs(ctx, testGPUs())
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "thief", result("g", "gpu-0"))})
	if e := got["uid-2"].Err; e == nil || !strings.Contains(e.Error(), "ns/train") {
		t.Errorf("a second claim got the rebuilt claim's GPU: err = %v", e)
	}
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{trainClaim()})
	if r := got["uid-1"]; r.Err != nil || len(r.Devices) != 1 || !slices.Equal(r.Devices[0].CDIDeviceIDs, []string{gpuA}) {
		t.Errorf("the rebuilt claim prepared again: %+v", r)
	}
	un, err := d.UnprepareResourceClaims(ctx, []kubelet.NamespacedObject{{UID: "uid-1"}})
	if err != nil || un["uid-1"] != nil {
		t.Fatalf("Unprepare = %v, %v", un, err)
	}
	if cp, err := loadCheckpoint(path); err != nil || len(cp.Claims) != 0 {
		t.Errorf("checkpoint after Unprepare: %+v, %v", cp.Claims, err)
	}
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "next", result("g", "gpu-0"))})
	if got["uid-2"].Err != nil {
		t.Errorf("GPU not free after the rebuilt claim was unprepared: %v", got["uid-2"].Err)
	}
	if n := kl.Lists(); n != 1 {
		t.Errorf("%d PodResources Lists, want 1: a rebuild that worked is not repeated", n)
	}
}

// A missing checkpoint while pods hold claims of this driver (the plugin
// directory wiped, a host path changed): the claims are rebuilt. Claims of
// other drivers and pools are not this driver's business; an admin-access
// device stays shareable.
func TestMissingCheckpointWithHeldClaimsRebuilds(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	admin := true
	monitor := claim("uid-m", "monitor", resourceapi.DeviceRequestAllocationResult{Request: "all", Driver: testDriver, Pool: testNode, Device: "gpu-1", AdminAccess: &admin})
	other := podresourcestest.Pod("ns", "fpga-user", podresourcestest.ClaimContainer("main",
		podresourcestest.Claim("ns", "fpga", "fpga.example.com", testNode, "fpga-0"),
		podresourcestest.Claim("ns", "elsewhere", testDriver, "node-b", "gpu-0")))
	kl := podresourcestest.Start(t,
		holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}),
		holding("dcgm", "monitor", map[string][]string{"gpu-1": {"gpu-device-plugin.github.io/gpu=GPU-b"}}),
		other)
	api := newFakeClaims(trainClaim(), monitor)
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api})
	d.Rebuild(ctx)
	if got := slices.Sorted(func(yield func(string) bool) {
		for uid := range d.cp.Claims {
			if !yield(string(uid)) {
				return
			}
		}
	}); !slices.Equal(got, []string{"uid-1", "uid-m"}) {
		t.Fatalf("rebuilt %v, want uid-1 and uid-m", got)
	}
	if !d.cp.Claims["uid-m"].Devices[0].AdminAccess {
		t.Error("the admin-access device lost its flag")
	}
	if slices.Contains(api.gets, "ns/fpga") || slices.Contains(api.gets, "ns/elsewhere") {
		t.Errorf("read claims that are not this driver's on this node: %v", api.gets)
	}
	d.SetGPUs(ctx, testGPUs())
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-3", "watcher", resourceapi.DeviceRequestAllocationResult{Request: "all", Driver: testDriver, Pool: testNode, Device: "gpu-1", AdminAccess: &admin})})
	if got["uid-3"].Err != nil {
		t.Errorf("admin access beside a rebuilt admin-access claim: %v", got["uid-3"].Err)
	}
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-4", "thief", result("g", "gpu-0"))})
	if got["uid-4"].Err == nil {
		t.Error("a second claim got the rebuilt claim's GPU")
	}
}

// The usual first start: no checkpoint and no claims held. The kubelet is
// asked once, the API server never, and nothing is written.
func TestMissingCheckpointNothingHeld(t *testing.T) {
	dir := t.TempDir()
	kl := podresourcestest.Start(t)
	api := newFakeClaims()
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api})
	d.Rebuild(context.Background())
	d.Rebuild(context.Background())
	if kl.Lists() != 1 || api.getCount() != 0 || len(d.cp.Claims) != 0 {
		t.Errorf("Lists %d, GETs %d, claims %v; want 1, 0, none", kl.Lists(), api.getCount(), d.cp.Claims)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a checkpoint was written with nothing in it: %v", err)
	}
}

// No checkpoint and no PodResources socket (not mounted): nothing to ask,
// said once, not tried again before each Prepare.
func TestMissingCheckpointWithoutTheSocket(t *testing.T) {
	ctx := context.Background()
	var logs logtest.Buffer
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1, PodResources: podresources.Client{Socket: filepath.Join(t.TempDir(), "kubelet.sock")},
		Claims: newFakeClaims(), Log: slog.New(slog.NewTextHandler(&logs, nil))})
	d.Rebuild(ctx)
	d.SetGPUs(ctx, testGPUs())
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{trainClaim()}); got["uid-1"].Err != nil {
		t.Fatal(got["uid-1"].Err)
	}
	if n := strings.Count(logs.String(), "PodResources API cannot say"); n != 1 || strings.Contains(logs.String(), "level=ERROR") || d.rebuild != "" {
		t.Errorf("said %d times (rebuild %q):\n%s", n, d.rebuild, logs.String())
	}
}

// A checkpoint that reads needs no rebuild: neither the kubelet nor the
// API server is asked.
func TestReadableCheckpointIsNotRebuilt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newTestDriver(t, dir, Options{Sources: 1})
	first.SetGPUs(ctx, testGPUs())
	if got, _ := first.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{trainClaim()}); got["uid-1"].Err != nil {
		t.Fatal(got["uid-1"].Err)
	}
	kl := podresourcestest.Start(t, holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}))
	api := newFakeClaims(trainClaim())
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api})
	d.Rebuild(ctx)
	if kl.Lists() != 0 || api.getCount() != 0 {
		t.Errorf("Lists %d, GETs %d; want none", kl.Lists(), api.getCount())
	}
}

// The kubelet or the API server unreachable at start: the rebuild is tried
// again before the next Prepare, which then finds the GPU held. A claim
// gone from the API server is said once and not asked for again.
func TestRebuildRetriesBeforePrepare(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	kl := podresourcestest.Start(t,
		holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}),
		holding("ghost", "gone", map[string][]string{"gpu-2": nil}))
	kl.Fail(status.Error(codes.Unavailable, "kubelet restarting"))
	api := newFakeClaims(trainClaim())
	var logs logtest.Buffer
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	d.Rebuild(ctx)
	if len(d.cp.Claims) != 0 || d.rebuild == "" {
		t.Fatalf("claims %v, rebuild %q after a failed List", d.cp.Claims, d.rebuild)
	}

	// The kubelet answers; the API server fails the one GET.
	kl.Set(holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}), holding("ghost", "gone", map[string][]string{"gpu-2": nil}))
	api.errs["ns/train"] = apierrors.NewServiceUnavailable("etcd leader changed")
	d.SetGPUs(ctx, testGPUs())
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-9", "other", result("g", "gpu-1"))})
	if got["uid-9"].Err != nil || d.rebuild == "" {
		t.Fatalf("Prepare during a failed rebuild: %v (rebuild %q)", got["uid-9"].Err, d.rebuild)
	}

	delete(api.errs, "ns/train")
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-2", "thief", result("g", "gpu-0"))})
	if e := got["uid-2"].Err; e == nil || !strings.Contains(e.Error(), "ns/train") {
		t.Errorf("Prepare after the rebuild worked gave away the held GPU: %v", e)
	}
	if d.rebuild != "" {
		t.Errorf("rebuild still due: %q", d.rebuild)
	}
	gone := 0
	for _, g := range api.gets {
		if g == "ns/gone" {
			gone++
		}
	}
	if gone != 1 {
		// Gone for good: not asked again in the round that retried.
		t.Errorf("ns/gone asked %d times, want once", gone)
	}
	if n := strings.Count(logs.String(), "trying again"); n != 1 {
		t.Errorf("the rebuild's failures were said %d times, want once:\n%s", n, logs.String())
	}
	before := api.getCount()
	d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-5", "later", result("g", "gpu-2"))})
	if api.getCount() != before {
		t.Error("the API server was asked again after the rebuild was done")
	}
}

// A claim of the same name made again after its pod started (another UID,
// other devices) is not taken for the one the pod holds.
func TestRebuildRefusesAClaimMadeAgain(t *testing.T) {
	dir := t.TempDir()
	kl := podresourcestest.Start(t, holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}))
	api := newFakeClaims(claim("uid-new", "train", result("gpus", "gpu-1")))
	var logs logtest.Buffer
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	d.Rebuild(context.Background())
	if len(d.cp.Claims) != 0 || !strings.Contains(logs.String(), "made again under the same name") {
		t.Errorf("claims %v; logs:\n%s", d.cp.Claims, logs.String())
	}
}

// An older kubelet that names no CDI device IDs: the claim is rebuilt
// (the guard and Unprepare need only its devices), and a repeated Prepare
// answers with the IDs of the device as discovered, written back.
func TestRebuiltClaimWithoutCDIIDs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kl := podresourcestest.Start(t, holding("trainer", "train", map[string][]string{"gpu-0": nil}))
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: newFakeClaims(trainClaim())})
	d.Rebuild(ctx)
	if p := d.cp.Claims["uid-1"]; len(p.Devices) != 1 || len(p.Devices[0].CDIDeviceIDs) != 0 {
		t.Fatalf("rebuilt %+v", p)
	}
	d.SetGPUs(ctx, testGPUs())
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{trainClaim()})
	if r := got["uid-1"]; r.Err != nil || len(r.Devices) != 1 || !slices.Equal(r.Devices[0].CDIDeviceIDs, []string{gpuA}) {
		t.Errorf("Prepare of the rebuilt claim: %+v", r)
	}
	if cp, err := loadCheckpoint(filepath.Join(dir, "checkpoint.json")); err != nil || !slices.Equal(cp.Claims["uid-1"].Devices[0].CDIDeviceIDs, []string{gpuA}) {
		t.Errorf("checkpoint: %+v, %v", cp.Claims, err)
	}
}

// Without the PodResources API nothing can be rebuilt: said as an error
// when claims were certainly lost, and the driver serves on.
func TestNoRebuildWithoutPodResources(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	d, _ := newTestDriver(t, dir, Options{Sources: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	d.Rebuild(context.Background())
	if !strings.Contains(logs.String(), "level=ERROR msg=\"DRA: prepared claims cannot be rebuilt") || d.rebuild != "" {
		t.Errorf("rebuild %q; logs:\n%s", d.rebuild, logs.String())
	}
}

// The file turns unreadable while the plugin runs (two processes share it
// during a rolling update): what this process knows is kept, and the
// claims only the other process knew are rebuilt.
func TestCheckpointCorruptedWhileRunning(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	kl := podresourcestest.Start(t)
	api := newFakeClaims(claim("uid-o", "others", result("g", "gpu-2")))
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api})
	d.Rebuild(ctx)
	d.SetGPUs(ctx, testGPUs())
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{trainClaim()}); got["uid-1"].Err != nil {
		t.Fatal(got["uid-1"].Err)
	}
	kl.Set(
		holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}),
		holding("other", "others", map[string][]string{"gpu-2": {"gpu-device-plugin.github.io/gpu=GPU-c"}}))
	if err := os.WriteFile(path, []byte(`{"version":1,"claims":{`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"gpu-0", "gpu-2"} {
		got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-x", "thief", result("g", dev))})
		if got["uid-x"].Err == nil {
			t.Errorf("%s given to a second claim after the checkpoint broke", dev)
		}
	}
	if cp, err := loadCheckpoint(path); err != nil || len(cp.Claims) != 2 {
		t.Errorf("checkpoint after the rebuild: %+v, %v", cp.Claims, err)
	}
	if slices.Contains(api.gets, "ns/train") {
		t.Error("asked the API server for a claim this process knew")
	}
}

// claimsThen runs then before answering the first GET: the other process
// of a rolling update preparing a claim while this one rebuilds.
type claimsThen struct {
	*fakeClaims
	once sync.Once
	then func()
}

func (c *claimsThen) GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	c.once.Do(c.then)
	return c.fakeClaims.GetClaim(ctx, namespace, name)
}

// A claim the other process writes to the checkpoint while this one
// rebuilds is kept when the rebuilt claims are written.
func TestRebuildKeepsWhatTheOtherProcessWrote(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kl := podresourcestest.Start(t, holding("trainer", "train", map[string][]string{"gpu-0": {gpuA}}))
	api := &claimsThen{fakeClaims: newFakeClaims(trainClaim()), then: func() {
		other, _ := newTestDriver(t, dir, Options{Sources: 1})
		other.SetGPUs(ctx, testGPUs())
		if got, _ := other.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("uid-o", "others", result("g", "gpu-1"))}); got["uid-o"].Err != nil {
			t.Error(got["uid-o"].Err)
		}
	}}
	d, _ := newTestDriver(t, dir, Options{Sources: 1, PodResources: podresources.Client{Socket: kl.Socket}, Claims: api})
	d.Rebuild(ctx)
	cp, err := loadCheckpoint(filepath.Join(dir, "checkpoint.json"))
	if _, ok := cp.Claims["uid-o"]; err != nil || !ok || len(cp.Claims) != 2 {
		t.Errorf("checkpoint after the rebuild: %+v, %v; want the rebuilt claim and the other process's", cp.Claims, err)
	}
}

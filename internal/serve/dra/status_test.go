package dra

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi/kubeapitest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

const (
	testNIC    = "0000:0c:00.0"
	testNICDev = "nic-0000-0c-00-0"
	testMAC    = "b8:3f:d2:a1:b2:c3"
	otherDrv   = "other.example.com"
)

// nicSysfs is fakeSysfs with an interface on the NIC, as sysfs links it
// from class/net.
func nicSysfs(t testing.TB) string {
	t.Helper()
	root := fakeSysfs(t)
	dev, err := filepath.EvalSymlinks(filepath.Join(root, "bus", "pci", "devices", testNIC))
	if err != nil {
		t.Fatal(err)
	}
	nd := filepath.Join(dev, "net", "ens1f0np0")
	if err := os.MkdirAll(nd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nd, "address"), []byte(testMAC+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "class", "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(nd, filepath.Join(root, "class", "net", "ens1f0np0")); err != nil {
		t.Fatal(err)
	}
	return root
}

// statusDriver is a driver with the test GPUs and one NIC pool, writing
// claim status through apiClaims on client.
func statusDriver(t testing.TB, client *fake.Clientset, o Options) (*Driver, *logtest.Buffer) {
	t.Helper()
	var logs logtest.Buffer
	o.Sources = 2
	o.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if o.SysfsRoot == "" {
		o.SysfsRoot = nicSysfs(t)
	}
	if o.ClaimStatus == nil {
		o.ClaimStatus = apiClaims{testAPI(t, client)}
	}
	d, _ := newTestDriver(t, t.TempDir(), o)
	ctx := context.Background()
	d.SetGPUs(ctx, testGPUs())
	nic := sysfs.NIC{Address: testNIC, Vendor: "15b3", Device: "1021", Driver: "mlx5_core", NUMANode: 0, Netdevs: []string{"ens1f0np0"}}
	d.SetNICPool(ctx, draslice.NICPool{Name: "example.com/rdma", NICs: []sysfs.NIC{nic}}, []device.Device{{ID: testNIC, Healthy: true}}, true)
	return d, &logs
}

// apiClaim is a claim as the API server has it: two GPUs and the NIC of
// ours, one device of another driver, and that driver's status entry.
func apiClaim() *resourceapi.ResourceClaim {
	c := claim("uid-s", "net", result("gpus", "gpu-0"), result("gpus", "gpu-1"), result("nic", testNICDev),
		resourceapi.DeviceRequestAllocationResult{Request: "other", Driver: otherDrv, Pool: "x", Device: "y"})
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{
		Driver: otherDrv, Pool: "x", Device: "y",
		Conditions:  []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Configuring", LastTransitionTime: metav1.Unix(1700000000, 0)}},
		NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.0.0.2/24"}},
	}}
	return c
}

func prepareOK(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) {
	t.Helper()
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || got[c.UID].Err != nil {
		t.Fatalf("Prepare: %v, %v", err, got[c.UID].Err)
	}
}

func getClaim(t *testing.T, client *fake.Clientset, c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	got, err := client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// entries are a claim's status entries by driver/device.
func entries(c *resourceapi.ResourceClaim) map[string]resourceapi.AllocatedDeviceStatus {
	out := map[string]resourceapi.AllocatedDeviceStatus{}
	for _, e := range c.Status.Devices {
		out[e.Driver+"/"+e.Device] = e
	}
	return out
}

func dataOf(t *testing.T, e resourceapi.AllocatedDeviceStatus) map[string]string {
	t.Helper()
	if e.Data == nil {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(e.Data.Raw, &m); err != nil {
		t.Fatalf("data %s: %v", e.Data.Raw, err)
	}
	return m
}

func condition(e resourceapi.AllocatedDeviceStatus, typ string) *metav1.Condition {
	for i := range e.Conditions {
		if e.Conditions[i].Type == typ {
			return &e.Conditions[i]
		}
	}
	return nil
}

func patches(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

// A prepared claim's status carries an entry per device of ours: Ready,
// identifying data, and the NIC's interface and address as sysfs has them
// at Prepare; the other driver's entry is left as it was, and the write is
// a server-side apply of the status alone, by our field manager.
func TestClaimStatusAfterPrepare(t *testing.T) {
	c := apiClaim()
	client := fake.NewClientset(c)
	d, _ := statusDriver(t, client, Options{})
	// Unhealthy, tolerated: prepared, and said in the status.
	d.SetHealth("GPU-b", false, "xid=79")
	prepareOK(t, d, c)

	got := getClaim(t, client, c)
	es := entries(got)
	if len(es) != 4 {
		t.Fatalf("status.devices = %+v, want the other driver's and three of ours", got.Status.Devices)
	}
	for _, dev := range []string{"gpu-0", "gpu-1", testNICDev} {
		e := es[testDriver+"/"+dev]
		if e.Pool != testNode || e.ShareID != nil {
			t.Errorf("%s: pool %q, shareID %v", dev, e.Pool, e.ShareID)
		}
		r := condition(e, ConditionReady)
		if r == nil || r.Status != metav1.ConditionTrue || r.Reason != ReasonPrepared || r.LastTransitionTime.IsZero() {
			t.Errorf("%s: Ready = %+v, want True, Prepared, with a transition time", dev, r)
		}
	}
	if h := condition(es[testDriver+"/gpu-0"], ConditionHealthy); h != nil {
		t.Errorf("gpu-0 is healthy and has %+v; want no Healthy condition", h)
	}
	h := condition(es[testDriver+"/gpu-1"], ConditionHealthy)
	if h == nil || h.Status != metav1.ConditionFalse || h.Reason != ReasonUnhealthy || !strings.Contains(h.Message, "xid=79: fallen off the bus") {
		t.Errorf("gpu-1, unhealthy when prepared: Healthy = %+v, want False naming xid 79", h)
	}
	if m := dataOf(t, es[testDriver+"/gpu-0"]); len(m) != 2 || m["uuid"] != "GPU-a" || m["pciBusID"] != "0000:07:00.0" {
		t.Errorf("gpu-0 data = %v", m)
	}
	nic := es[testDriver+"/"+testNICDev]
	if m := dataOf(t, nic); len(m) != 1 || m["pciBusID"] != testNIC {
		t.Errorf("NIC data = %v, want its pciBusID alone", m)
	}
	if nd := nic.NetworkData; nd == nil || nd.InterfaceName != "ens1f0np0" || nd.HardwareAddress != testMAC || len(nd.IPs) != 0 {
		t.Errorf("NIC networkData = %+v, want ens1f0np0, %s, no IPs", nd, testMAC)
	}
	if es[testDriver+"/gpu-0"].NetworkData != nil {
		t.Error("a GPU has networkData")
	}
	other := es[otherDrv+"/y"]
	want := apiClaim().Status.Devices[0]
	if other.NetworkData == nil || other.NetworkData.InterfaceName != "net1" || len(other.NetworkData.IPs) != 1 ||
		len(other.Conditions) != 1 || other.Conditions[0].Reason != want.Conditions[0].Reason {
		t.Errorf("the other driver's entry changed: %+v", other)
	}
	if got.Status.Allocation == nil || len(got.Status.Allocation.Devices.Results) != 4 {
		t.Errorf("allocation changed: %+v", got.Status.Allocation)
	}

	// One apply of the status subresource by our field manager.
	var applies []k8stesting.PatchAction
	for _, a := range client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			applies = append(applies, p)
		}
	}
	if len(applies) != 1 || applies[0].GetSubresource() != "status" || applies[0].GetPatchType() != types.ApplyPatchType {
		t.Fatalf("writes = %+v, want one apply of the status", client.Actions())
	}
	var sent resourceapi.ResourceClaim
	if err := json.Unmarshal(applies[0].GetPatch(), &sent); err != nil {
		t.Fatal(err)
	}
	if sent.UID != c.UID || len(sent.Status.Devices) != 3 || sent.Status.Allocation != nil || sent.Status.ReservedFor != nil || len(sent.Spec.Devices.Requests) != 0 {
		t.Errorf("apply sent %s; want the UID and our three entries alone", applies[0].GetPatch())
	}
	for _, e := range sent.Status.Devices {
		if e.Driver != testDriver {
			t.Errorf("apply names %s's entry", e.Driver)
		}
	}
	// (The fake clientset records no subresource in managed fields.)
	applied := false
	for _, m := range got.ManagedFields {
		applied = applied || m.Manager == testFieldManager && m.Operation == metav1.ManagedFieldsOperationApply
	}
	if !applied {
		t.Errorf("managed fields %+v: want an apply by %s", got.ManagedFields, testFieldManager)
	}
}

// testFieldManager is the plugin's field manager (config.FieldManager, as
// daemon.DRASettings passes it).
const testFieldManager = "gpu-device-plugin"

// The kubelet prepares a claim again at each pod start: a claim whose
// status is current is not written again, and one that lost its entries
// gets them back with nothing else changed.
func TestClaimStatusNotRewritten(t *testing.T) {
	c := apiClaim()
	client := fake.NewClientset(c)
	d, _ := statusDriver(t, client, Options{})
	prepareOK(t, d, c)
	first := getClaim(t, client, c)
	prepareOK(t, d, first)
	if n := patches(client); n != 1 {
		t.Errorf("%d status writes after preparing a current claim again, want 1", n)
	}
	// Entries missing (a write that failed): written on the next Prepare,
	// keeping the conditions' times.
	prepareOK(t, d, c)
	if n := patches(client); n != 2 {
		t.Errorf("%d status writes, want 2", n)
	}
	again := getClaim(t, client, c)
	a, b := entries(first)[testDriver+"/gpu-0"], entries(again)[testDriver+"/gpu-0"]
	if !condition(a, ConditionReady).LastTransitionTime.Equal(&condition(b, ConditionReady).LastTransitionTime) {
		t.Errorf("Ready's time moved: %v, then %v", condition(a, ConditionReady).LastTransitionTime, condition(b, ConditionReady).LastTransitionTime)
	}
}

// A NIC whose interface left the host's namespace (or was never there)
// gets an entry without networkData, and the claim is prepared.
func TestClaimStatusNetdevGone(t *testing.T) {
	c := apiClaim()
	client := fake.NewClientset(c)
	root := nicSysfs(t)
	d, logs := statusDriver(t, client, Options{SysfsRoot: root})
	dev, err := filepath.EvalSymlinks(filepath.Join(root, "bus", "pci", "devices", testNIC))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dev, "net")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "class", "net", "ens1f0np0")); err != nil {
		t.Fatal(err)
	}
	prepareOK(t, d, c)
	e, ok := entries(getClaim(t, client, c))[testDriver+"/"+testNICDev]
	if !ok || e.NetworkData != nil || condition(e, ConditionReady) == nil || dataOf(t, e)["pciBusID"] != testNIC {
		t.Errorf("NIC entry = %+v, want Ready and data, without networkData", e)
	}
	if !strings.Contains(logs.String(), "no network interface in the host's namespace") {
		t.Errorf("logs do not say the interface is gone:\n%s", logs)
	}
}

// A failed write never fails Prepare; it is logged once per claim, however
// often the claim is prepared, until a write for it succeeds.
func TestClaimStatusWriteFails(t *testing.T) {
	c := apiClaim()
	client := fake.NewClientset(c)
	var mu sync.Mutex
	failing := true
	client.PrependReactor("patch", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		return false, nil, nil
	})
	d, logs := statusDriver(t, client, Options{})
	warnings := func() int { return strings.Count(logs.String(), "writing the claim's device status failed") }
	for range 3 {
		prepareOK(t, d, c)
	}
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings for one claim's failed writes, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "claim=ns/net") || !strings.Contains(logs.String(), "unable to handle the request") {
		t.Errorf("the warning names neither the claim nor the error:\n%s", logs)
	}
	if n := patches(client); n != 3 {
		t.Errorf("%d writes tried, want one per Prepare (3)", n)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	prepareOK(t, d, c)
	if len(entries(getClaim(t, client, c))) != 4 {
		t.Error("no status after the API server came back")
	}
	mu.Lock()
	failing = true
	mu.Unlock()
	prepareOK(t, d, c) // the claim from before: no entries, so written again
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings, want a second one after a success", n)
	}
}

// blockingStatus blocks each write until its context ends.
type blockingStatus struct {
	d    *Driver
	errs chan error
}

func (b *blockingStatus) ApplyDeviceStatus(ctx context.Context, _ *resourceapi.ResourceClaim, _ []resourceapi.AllocatedDeviceStatus) error {
	// The driver's lock is free meanwhile: this would block forever if
	// Prepare held it.
	b.d.Resources()
	<-ctx.Done()
	b.errs <- ctx.Err()
	return ctx.Err()
}

// A slow API server delays Prepare by at most the status timeout, and
// holds no lock meanwhile.
func TestClaimStatusSlowAPIServer(t *testing.T) {
	c := apiClaim()
	bs := &blockingStatus{errs: make(chan error, 1)}
	d, _ := statusDriver(t, nil, Options{ClaimStatus: bs})
	d.statusTimeout = 1 // as good as expired: the write is cut short
	bs.d = d
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || got[c.UID].Err != nil || len(got[c.UID].Devices) != 3 {
		t.Fatalf("Prepare = %+v, %v", got[c.UID], err)
	}
	if err := <-bs.errs; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the write ended with %v, want its deadline", err)
	}
}

// Only prepared claims are written: a claim that failed to prepare writes
// nothing.
func TestClaimStatusOnlyPrepared(t *testing.T) {
	bad := claim("uid-bad", "bad", result("g", "gpu-9"))
	client := fake.NewClientset(bad)
	d, _ := statusDriver(t, client, Options{})
	got, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{bad})
	if got[bad.UID].Err == nil {
		t.Fatal("a device not on the node was prepared")
	}
	if n := patches(client); n != 0 {
		t.Errorf("%d status writes for a claim that failed", n)
	}
	un, _ := d.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: bad.UID}})
	if un[bad.UID] != nil {
		t.Error(un[bad.UID])
	}
}

// Refused for want of access (the node package's kubelet credentials, a
// chart without the rule): the warning says what to grant.
func TestClaimStatusForbidden(t *testing.T) {
	c := apiClaim()
	for _, tc := range []struct {
		name string
		err  error
		fix  bool
	}{
		{"RBAC", apierrors.NewForbidden(resourceapi.Resource("resourceclaims"), c.Name, errors.New("RBAC: no")), true},
		// As Kubernetes 1.36+ refuses an entry of a driver the writer may
		// not write (resourceclaims/driver).
		{"per-driver check", apierrors.NewInvalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaim"}, c.Name, field.ErrorList{
			field.Forbidden(field.NewPath("status", "devices"), `changing status.devices requires resource="resourceclaims/driver"`)}), true},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaim"}, c.Name, field.ErrorList{
			field.Invalid(field.NewPath("status", "devices"), "x", "must be an allocated device in the claim")}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(c)
			client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			d, logs := statusDriver(t, client, Options{})
			prepareOK(t, d, c)
			if got := strings.Contains(logs.String(), "grant resourceclaims/status patch"); got != tc.fix {
				t.Errorf("the warning says what to grant: %v, want %v:\n%s", got, tc.fix, logs)
			}
		})
	}
}

// Two claims on shares of one GPU: each claim's entry carries its share.
func TestClaimStatusShares(t *testing.T) {
	const idA, idB = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
	a := claim("uid-a", "a", share("g", "gpu-0", idA, "10Gi"))
	b := claim("uid-b", "b", share("g", "gpu-0", idB, "10Gi"))
	client := fake.NewClientset(a, b)
	d, _ := statusDriver(t, client, Options{})
	in := testGPUs()
	_, in.MemoryShares = sharedGPUs()
	in.ShareMinimum = 1 << 30
	d.SetGPUs(context.Background(), in)
	m := &fakeMPS{}
	d.SetMPS(context.Background(), m, "/run/mps", m.writeSpec, m.setTimeSlice)
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{a, b})
	if err != nil || got[a.UID].Err != nil || got[b.UID].Err != nil {
		t.Fatalf("Prepare: %v %+v", err, got)
	}
	for c, id := range map[*resourceapi.ResourceClaim]string{a: idA, b: idB} {
		es := getClaim(t, client, c).Status.Devices
		if len(es) != 1 || es[0].Device != "gpu-0" || es[0].ShareID == nil || *es[0].ShareID != id || condition(es[0], ConditionReady) == nil {
			t.Errorf("claim %s: status.devices %+v, want gpu-0's share %s, Ready", c.Name, es, id)
		}
	}
}

// A MIG instance made for the claim: its entry's uuid is the instance's,
// which only the checkpoint knows, and pciBusID its parent's.
func TestClaimStatusMIGPlacement(t *testing.T) {
	c := claim("uid-3g", "three", result("mig", "gpu-2-3g-40gb-4"))
	client := fake.NewClientset(c)
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1, ClaimStatus: apiClaims{testAPI(t, client)}})
	d.SetMIG(newFakeMIG(), (&migSpecs{}).write)
	d.SetGPUs(context.Background(), partitionedGPUs())
	prepareOK(t, d, c)
	es := getClaim(t, client, c).Status.Devices
	if len(es) != 1 || condition(es[0], ConditionReady) == nil {
		t.Fatalf("status.devices %+v", es)
	}
	if m := dataOf(t, es[0]); m["uuid"] != "MIG-GPU-c-2-1" || m["pciBusID"] != "0000:87:00.0" {
		t.Errorf("data = %v, want the instance's UUID and its parent's PCI address", m)
	}
}

// testAPI is a draapi.Client over client through an HTTP server, as the
// daemon reaches the API server.
func testAPI(t testing.TB, client *fake.Clientset) *draapi.Client {
	t.Helper()
	kc, err := kubeapi.New(kubeapitest.Serve(t, client, nil))
	if err != nil {
		t.Fatal(err)
	}
	return draapi.New(kc, 1e6, 1e6, testFieldManager)
}

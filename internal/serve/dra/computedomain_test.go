package dra

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// fakeDomains is the API server's ComputeDomains as the node sees them:
// entries applied by node name replace that node's entry, removed ones go.
type fakeDomains struct {
	mu sync.Mutex
	d  map[string]*Domain // namespace/name
}

func (f *fakeDomains) GetDomain(_ context.Context, ns, name string) (Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.d[ns+"/"+name]
	if d == nil {
		return Domain{}, ErrDomainGone
	}
	out := *d
	out.Status.Nodes = slices.Clone(d.Status.Nodes)
	return out, nil
}

func (f *fakeDomains) ApplyNode(_ context.Context, ns, name string, n cd.Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.d[ns+"/"+name]
	if d == nil {
		return ErrDomainGone
	}
	d.Status.Nodes = slices.DeleteFunc(d.Status.Nodes, func(x cd.Node) bool { return x.Name == n.Name })
	d.Status.Nodes = append(d.Status.Nodes, n)
	return nil
}

func (f *fakeDomains) RemoveNode(_ context.Context, ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.d[ns+"/"+name]
	if d == nil {
		return ErrDomainGone
	}
	d.Status.Nodes = slices.DeleteFunc(d.Status.Nodes, func(x cd.Node) bool { return x.Name == testNode })
	return nil
}

func (f *fakeDomains) entry(key string) (cd.Node, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.d[key].Status.Nodes {
		if n.Name == testNode {
			return n, true
		}
	}
	return cd.Node{}, false
}

func (f *fakeDomains) setStatus(key, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.d[key].Status.Status, f.d[key].Status.Reason = status, "DaemonsStarting"
}

// fakeDaemons is imexd as the driver sees it: daemons by domain, ready
// when told.
type fakeDaemons struct {
	mu      sync.Mutex
	peers   map[string][]string
	ready   map[string]bool
	stopped []string
	swept   [][]string
}

func newFakeDaemons() *fakeDaemons {
	return &fakeDaemons{peers: map[string][]string{}, ready: map[string]bool{}}
}

func (f *fakeDaemons) Ensure(_ context.Context, dom string, peers []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers[dom] = peers
	return nil
}

func (f *fakeDaemons) Ready(_ context.Context, dom string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.peers[dom]; !ok || !f.ready[dom] {
		return errors.New("not ready")
	}
	return nil
}

func (f *fakeDaemons) Stop(dom string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.peers, dom)
	f.stopped = append(f.stopped, dom)
	return nil
}

func (f *fakeDaemons) Sweep(keep []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.swept = append(f.swept, keep)
	return nil
}

func (f *fakeDaemons) running(dom string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.peers[dom]
	return p, ok
}

const (
	testClusterUUID = "11111111-2222-3333-4444-555555555555"
	domainKey       = "team/training"
	domainUID       = "dom-uid-1"
)

// fabricGPUs are testGPUs registered in clique 1 of the NVLink domain.
func fabricGPUs() draslice.GPUs {
	in := testGPUs()
	for i := range in.GPUs {
		in.GPUs[i].Fabric = &nvml.Fabric{ClusterUUID: testClusterUUID, CliqueID: 1, State: nvml.FabricCompleted}
	}
	return in
}

type cdFixture struct {
	d        *Driver
	pub      *fakePublisher
	api      *fakeDomains
	daemons  *fakeDaemons
	channels []int
}

// newCDFixture is a driver serving ComputeDomains on a node of clique 1,
// with domain team/training whose other nodes are others.
func newCDFixture(t *testing.T, others ...cd.Node) *cdFixture {
	t.Helper()
	f := &cdFixture{
		api:     &fakeDomains{d: map[string]*Domain{domainKey: {Namespace: "team", Name: "training", UID: domainUID, Status: cd.Status{Status: cd.NotReady, Nodes: others}}}},
		daemons: newFakeDaemons(),
	}
	f.d, f.pub = newTestDriver(t, t.TempDir(), Options{Sources: 1})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var mu sync.Mutex
	if err := f.d.SetComputeDomains(ctx, ComputeDomainOptions{API: f.api, Daemons: f.daemons, NodeIP: "10.0.0.1",
		Channel: func(id int) error { mu.Lock(); f.channels = append(f.channels, id); mu.Unlock(); return nil }}); err != nil {
		t.Fatal(err)
	}
	f.d.SetGPUs(ctx, fabricGPUs())
	return f
}

// channelClaim is a claim made from the domain's template: the channel
// device and the controller's opaque config.
func channelClaim(t *testing.T, uid string) *resourceapi.ResourceClaim {
	t.Helper()
	c := claim(uid, "worker-"+uid, result("channel", draslice.ChannelDeviceName))
	raw, err := json.Marshal(channelConfig{APIVersion: ConfigAPIVersion, Kind: ChannelConfigKind, DomainUID: domainUID, DomainName: "training", DomainNamespace: "team"})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"channel"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: testDriver, Parameters: runtime.RawExtension{Raw: raw}}},
	}}
	return c
}

func prepareOne(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) kubelet.PrepareResult {
	t.Helper()
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	return got[c.UID]
}

func TestChannelDevicePublishedWithClique(t *testing.T) {
	f := newCDFixture(t)
	dev, ok := byName(f.pub.last(t))[draslice.ChannelDeviceName]
	if !ok {
		t.Fatalf("no %s device published", draslice.ChannelDeviceName)
	}
	if got := str(dev.Attributes["cliqueID"]); got != testClusterUUID+".1" {
		t.Errorf("cliqueID = %s", got)
	}
	if got := str(dev.Attributes["type"]); got != draslice.TypeChannel {
		t.Errorf("type = %s", got)
	}
	// GPUs whose fabric registration is not complete: no channel.
	in := fabricGPUs()
	for i := range in.GPUs {
		in.GPUs[i].Fabric.State = nvml.FabricInProgress
	}
	f.d.SetGPUs(context.Background(), in)
	if _, ok := byName(f.pub.last(t))[draslice.ChannelDeviceName]; ok {
		t.Error("channel device published for GPUs in no NVLink domain")
	}
}

func TestChannelClaimOnWrongCliqueRefused(t *testing.T) {
	f := newCDFixture(t, cd.Node{Name: "node-b", IPAddress: "10.0.0.2", CliqueID: testClusterUUID + ".2", Status: cd.Ready})
	res := prepareOne(t, f.d, channelClaim(t, "c1"))
	if res.Err == nil || !errors.Is(res.Err, ErrWrongClique) || !strings.Contains(res.Err.Error(), testClusterUUID+".2 (node-b)") ||
		!strings.Contains(res.Err.Error(), "nvidia.com/gpu.clique="+testClusterUUID+".2") {
		t.Fatalf("err = %v, want the wrong clique named with the fix", res.Err)
	}
	if _, ok := f.daemons.running(domainUID); ok {
		t.Error("a daemon was started for a refused claim")
	}
	if _, ok := f.api.entry(domainKey); ok {
		t.Error("a refused node wrote its entry")
	}
}

func TestChannelClaimWaitsForReadyThenGetsChannel(t *testing.T) {
	peer := cd.Node{Name: "node-b", IPAddress: "10.0.0.2", CliqueID: testClusterUUID + ".1", Status: cd.Ready}
	f := newCDFixture(t, peer)
	c := channelClaim(t, "c1")

	res := prepareOne(t, f.d, c)
	if res.Err == nil || !strings.Contains(res.Err.Error(), "not ready yet") || !strings.Contains(res.Err.Error(), "kubelet retries") {
		t.Fatalf("not ready: err = %v, want a retryable not-ready error", res.Err)
	}
	if peers, ok := f.daemons.running(domainUID); !ok || !slices.Equal(peers, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("daemon peers = %v (running %v), want both nodes of the clique", peers, ok)
	}
	e, ok := f.api.entry(domainKey)
	if !ok || e.Status != cd.NotReady || e.Reason != cd.ReasonDaemonNotReady || e.IPAddress != "10.0.0.1" || e.CliqueID != testClusterUUID+".1" || e.Heartbeat == "" {
		t.Errorf("entry = %+v", e)
	}
	if _, held := f.d.cp.Claims[c.UID]; held {
		t.Error("a claim not ready is checkpointed as prepared")
	}

	// The daemon comes up, the controller says Ready: the channel.
	f.daemons.mu.Lock()
	f.daemons.ready[domainUID] = true
	f.daemons.mu.Unlock()
	f.api.setStatus(domainKey, cd.Ready)
	res = prepareOne(t, f.d, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	want := cdi.QualifiedName(cdi.ChannelKind, "channel0")
	if len(res.Devices) != 1 || !slices.Equal(res.Devices[0].CDIDeviceIDs, []string{want}) {
		t.Fatalf("devices = %+v, want %s", res.Devices, want)
	}
	if !slices.Equal(f.channels, []int{0}) {
		t.Errorf("channels made = %v, want [0]", f.channels)
	}
	if e, _ := f.api.entry(domainKey); e.Status != cd.Ready {
		t.Errorf("entry after ready = %+v", e)
	}
	if dm := f.d.cp.Claims[c.UID].Devices[0].Domain; dm == nil || dm.UID != domainUID || dm.Channel != 0 {
		t.Errorf("checkpointed domain = %+v", dm)
	}
}

func TestChannelUnprepareStopsDaemon(t *testing.T) {
	for _, ready := range []bool{true, false} {
		name := "prepared"
		if !ready {
			name = "never ready"
		}
		t.Run(name, func(t *testing.T) {
			f := newCDFixture(t)
			f.daemons.ready[domainUID] = ready
			if ready {
				f.api.setStatus(domainKey, cd.Ready)
			}
			c := channelClaim(t, "c1")
			if res := prepareOne(t, f.d, c); (res.Err == nil) != ready {
				t.Fatalf("prepare: %v", res.Err)
			}
			if _, ok := f.daemons.running(domainUID); !ok {
				t.Fatal("no daemon")
			}
			if _, err := f.d.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: c.UID}}); err != nil {
				t.Fatal(err)
			}
			if _, ok := f.daemons.running(domainUID); ok || !slices.Contains(f.daemons.stopped, domainUID) {
				t.Error("daemon still runs after the last claim went")
			}
			if _, ok := f.api.entry(domainKey); ok {
				t.Error("node's entry still in the domain's status")
			}
		})
	}
}

func TestDomainDeletedStopsDaemon(t *testing.T) {
	f := newCDFixture(t)
	c := channelClaim(t, "c1")
	prepareOne(t, f.d, c)
	if _, ok := f.daemons.running(domainUID); !ok {
		t.Fatal("no daemon")
	}
	f.api.mu.Lock()
	delete(f.api.d, domainKey)
	f.api.mu.Unlock()
	f.d.cd.resync(context.Background())
	if _, ok := f.daemons.running(domainUID); ok {
		t.Error("daemon still runs after its domain was deleted")
	}
	if got := f.d.cd.uids(); len(got) != 0 {
		t.Errorf("still in domains %v", got)
	}
	// A claim of the deleted domain is refused, saying so.
	if res := prepareOne(t, f.d, channelClaim(t, "c2")); res.Err == nil || !strings.Contains(res.Err.Error(), "gone") {
		t.Errorf("claim of a deleted domain: err = %v", res.Err)
	}
}

func TestChannelClaimsTakenUpAfterRestart(t *testing.T) {
	f := newCDFixture(t)
	f.daemons.ready[domainUID] = true
	f.api.setStatus(domainKey, cd.Ready)
	c := channelClaim(t, "c1")
	if res := prepareOne(t, f.d, c); res.Err != nil {
		t.Fatal(res.Err)
	}
	// A new process on the same checkpoint keeps the domain and sweeps the rest.
	d2, _ := newTestDriver(t, filepath.Dir(f.d.o.CheckpointPath), Options{Sources: 1})
	daemons := newFakeDaemons()
	if err := d2.SetComputeDomains(t.Context(), ComputeDomainOptions{API: f.api, Daemons: daemons, NodeIP: "10.0.0.1", Channel: func(int) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	if len(daemons.swept) != 1 || !slices.Equal(daemons.swept[0], []string{domainUID}) {
		t.Errorf("swept keeping %v, want [[%s]]", daemons.swept, domainUID)
	}
	if _, err := d2.UnprepareResourceClaims(context.Background(), []kubelet.NamespacedObject{{UID: types.UID("c1")}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(daemons.stopped, domainUID) {
		t.Error("the restarted process did not stop the domain's daemon at the last Unprepare")
	}
}

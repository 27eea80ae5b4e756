package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
)

const testDriver = "gpu.example.com"

// fakeClaims is the API server's claims, by "namespace/name".
type fakeClaims struct {
	claims map[string]*resourceapi.ResourceClaim
	err    error
}

func (f fakeClaims) GetClaim(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	if f.err != nil {
		return nil, f.err
	}
	c, ok := f.claims[namespace+"/"+name]
	if !ok {
		return nil, fmt.Errorf("resourceclaims.resource.k8s.io %q not found", name)
	}
	return c.DeepCopy(), nil
}

// fakePlugin answers with what a test sets and records what it was asked.
type fakePlugin struct {
	mu         sync.Mutex
	results    map[types.UID]PrepareResult
	prepareErr error
	prepared   [][]types.UID
	unprepared [][]NamespacedObject
	unResults  map[types.UID]error
	health     chan DeviceHealthReport
	healthErr  error
	errs       chan string // HandleError's messages, when set
}

func (p *fakePlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var uids []types.UID
	out := map[types.UID]PrepareResult{}
	for _, c := range claims {
		uids = append(uids, c.UID)
		out[c.UID] = p.results[c.UID]
	}
	p.prepared = append(p.prepared, uids)
	if p.prepareErr != nil {
		return nil, p.prepareErr
	}
	return out, nil
}

func (p *fakePlugin) UnprepareResourceClaims(_ context.Context, claims []NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unprepared = append(p.unprepared, claims)
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = p.unResults[c.UID]
	}
	return out, nil
}

func (p *fakePlugin) HandleError(_ context.Context, err error, msg string) {
	if p.errs != nil {
		select {
		case p.errs <- msg + ": " + err.Error():
		default:
		}
	}
}

func (p *fakePlugin) WatchHealthStatus(ctx context.Context, reports chan<- DeviceHealthReport) error {
	if p.healthErr != nil {
		return p.healthErr
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-p.health:
			select {
			case reports <- r:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func claim(ns, name, uid string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
}

func claimsOf(cs ...*resourceapi.ResourceClaim) fakeClaims {
	f := fakeClaims{claims: map[string]*resourceapi.ResourceClaim{}}
	for _, c := range cs {
		f.claims[c.Namespace+"/"+c.Name] = c
	}
	return f
}

// testDirs makes the kubelet's directories in a fresh temporary tree.
func testDirs(t testing.TB, o Options) Options {
	t.Helper()
	dir := t.TempDir()
	if o.DriverName == "" {
		o.DriverName = testDriver
	}
	o.RegistrarDir = filepath.Join(dir, "reg")
	o.PluginDir = filepath.Join(dir, "plugin")
	if o.CDIDir == "" {
		o.CDIDir = filepath.Join(dir, "cdi")
	}
	for _, d := range []string{o.RegistrarDir, o.PluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

func startHelper(t *testing.T, p DRAPlugin, c ClaimReader, o Options) (*Helper, *logtest.Buffer) {
	t.Helper()
	o = testDirs(t, o)
	var logs logtest.Buffer
	o.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := Start(t.Context(), p, c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h, &logs
}

func dial(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestRegistration(t *testing.T) {
	h, logs := startHelper(t, &fakePlugin{}, fakeClaims{}, Options{})
	c := registerapi.NewRegistrationClient(dial(t, h.regSocket))
	if got, want := filepath.Base(h.regSocket), testDriver+"-reg.sock"; got != want {
		t.Errorf("registration socket %s, want %s", got, want)
	}
	info, err := c.GetInfo(t.Context(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: testDriver, Endpoint: h.draSocket,
		SupportedVersions: []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService, "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}}
	if !proto.Equal(info, want) {
		t.Errorf("GetInfo = %v, want %v", info, want)
	}
	if filepath.Base(info.Endpoint) != "dra.sock" {
		t.Errorf("endpoint %s, want dra.sock", info.Endpoint)
	}
	if h.RegistrationStatus() != nil {
		t.Error("a registration status before the kubelet sent one")
	}
	registered := func() bool {
		select {
		case <-h.Registered():
			return true
		default:
			return false
		}
	}
	if registered() {
		t.Error("Registered closed before the kubelet registered the plugin")
	}

	t.Run("registered", func(t *testing.T) {
		if _, err := c.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			t.Fatal(err)
		}
		if st := h.RegistrationStatus(); st == nil || !st.PluginRegistered {
			t.Errorf("status %+v, want registered", st)
		}
		if !registered() {
			t.Error("Registered is not closed after the kubelet registered the plugin")
		}
		// The kubelet registers again after its own restart.
		if _, err := c.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refused is an error and logged", func(t *testing.T) {
		_, err := c.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{Error: "version not supported"})
		if err == nil || !strings.Contains(err.Error(), "failed registration process: version not supported") {
			t.Errorf("err %v, want the kubelet's reason", err)
		}
		if st := h.RegistrationStatus(); st == nil || st.PluginRegistered || st.Error != "version not supported" {
			t.Errorf("status %+v, want refused", st)
		}
		if !strings.Contains(logs.String(), "version not supported") {
			t.Errorf("the refusal is not logged:\n%s", logs)
		}
	})
}

// preparer is one version of the DRAPlugin service as the kubelet uses it
// (v1beta1 through k8s.io/kubelet's own conversion to v1).
type preparer struct {
	name    string
	client  func(*grpc.ClientConn) drapbv1.DRAPluginClient
	shareID bool
}

var versions = []preparer{
	{name: "v1", client: func(c *grpc.ClientConn) drapbv1.DRAPluginClient { return drapbv1.NewDRAPluginClient(c) }, shareID: true},
	{name: "v1beta1", client: func(c *grpc.ClientConn) drapbv1.DRAPluginClient {
		return drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(c)}
	}},
}

func TestPrepare(t *testing.T) {
	share := types.UID("share-1")
	devs := []Device{
		{Requests: []string{"gpu/big", "other"}, PoolName: "node1", DeviceName: "gpu-0", CDIDeviceIDs: []string{"example.com/gpu=0"}, ShareID: &share},
		{PoolName: "node1", DeviceName: "gpu-1"},
	}
	ok := claim("ns", "a", "uid-a")
	failing := claim("ns", "b", "uid-b")
	results := map[types.UID]PrepareResult{ok.UID: {Devices: devs}, failing.UID: {Err: errors.New("device gpu-3 is gone")}}
	tests := []struct {
		name     string
		claims   fakeClaims
		req      []*drapbv1.Claim
		plugErr  error
		wantErr  string // the call's error; empty: it answers
		wantCall bool
	}{
		{name: "devices and a per-claim error", claims: claimsOf(ok, failing),
			req: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}, {Namespace: "ns", Name: "b", Uid: "uid-b"}}, wantCall: true},
		{name: "a claim replaced under its name", claims: claimsOf(ok),
			req: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-old"}}, wantErr: "get resource claims: claim ns/a got replaced"},
		{name: "the API server's error", claims: fakeClaims{err: errors.New("connection refused")},
			req: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}}, wantErr: "get resource claims: retrieve claim ns/a: connection refused"},
		{name: "a claim not allocated", claims: claimsOf(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-a"}}),
			req: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}}, wantErr: "get resource claims: claim ns/a not allocated"},
		{name: "the plugin's error", claims: claimsOf(ok), plugErr: errors.New("checkpoint unreadable"),
			req: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}}, wantErr: "prepare resource claims: checkpoint unreadable", wantCall: true},
	}
	for _, v := range versions {
		for _, tt := range tests {
			t.Run(v.name+"/"+tt.name, func(t *testing.T) {
				p := &fakePlugin{results: results, prepareErr: tt.plugErr}
				h, _ := startHelper(t, p, tt.claims, Options{})
				resp, err := v.client(dial(t, h.draSocket)).NodePrepareResources(t.Context(), &drapbv1.NodePrepareResourcesRequest{Claims: tt.req})
				if (len(p.prepared) == 1) != tt.wantCall {
					t.Errorf("plugin called %d times, want called %v", len(p.prepared), tt.wantCall)
				}
				if tt.wantErr != "" {
					if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), tt.wantErr) {
						t.Errorf("err %v, want Unknown %q", err, tt.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				var shareID *string
				if v.shareID {
					s := string(share)
					shareID = &s
				}
				want := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{
					"uid-a": {Devices: []*drapbv1.Device{
						{RequestNames: []string{"gpu", "other"}, PoolName: "node1", DeviceName: "gpu-0", CdiDeviceIds: []string{"example.com/gpu=0"}, ShareId: shareID},
						{RequestNames: []string{}, PoolName: "node1", DeviceName: "gpu-1"},
					}},
					"uid-b": {Error: "device gpu-3 is gone"},
				}}
				if !proto.Equal(resp, want) {
					t.Errorf("response\n%v\nwant\n%v", resp, want)
				}
				if got := p.prepared[0]; !slices.Equal(got, []types.UID{"uid-a", "uid-b"}) {
					t.Errorf("plugin prepared %v", got)
				}
			})
		}
	}
}

func TestUnprepare(t *testing.T) {
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			p := &fakePlugin{unResults: map[types.UID]error{"uid-b": errors.New("still in use")}}
			// No claim on the API server: unprepare must not need one.
			h, _ := startHelper(t, p, fakeClaims{err: errors.New("must not be called")}, Options{})
			resp, err := v.client(dial(t, h.draSocket)).NodeUnprepareResources(t.Context(), &drapbv1.NodeUnprepareResourcesRequest{
				Claims: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}, {Namespace: "ns", Name: "b", Uid: "uid-b"}}})
			if err != nil {
				t.Fatal(err)
			}
			want := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{
				"uid-a": {}, "uid-b": {Error: "still in use"}}}
			if !proto.Equal(resp, want) {
				t.Errorf("response %v, want %v", resp, want)
			}
			wantClaims := []NamespacedObject{
				{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, UID: "uid-a"},
				{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "b"}, UID: "uid-b"},
			}
			if len(p.unprepared) != 1 || !slices.Equal(p.unprepared[0], wantClaims) {
				t.Errorf("plugin unprepared %v, want %v", p.unprepared, wantClaims)
			}
		})
	}
}

// rawMessage is a request's bytes as they came.
type rawMessage []byte

func (m rawMessage) AppendProto(b []byte) []byte { return append(b, m...) }

func TestBadRequests(t *testing.T) {
	h, _ := startHelper(t, &fakePlugin{}, fakeClaims{}, Options{})
	garbage := rawMessage{0x0a, 0xff, 0xff} // field 1, a length past the end
	noUID, err := proto.Marshal(&drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "ns", Name: "a"}}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		socket, method string
		req            rawMessage
		want           string
	}{
		{h.draSocket, methodPrepareV1, garbage, "NodePrepareResources: malformed message"},
		{h.draSocket, methodPrepareV1beta1, garbage, "NodePrepareResources: malformed message"},
		{h.draSocket, methodUnprepareV1, garbage, "NodeUnprepareResources: malformed message"},
		{h.draSocket, methodUnprepareV1beta1, garbage, "NodeUnprepareResources: malformed message"},
		{h.draSocket, methodPrepareV1, noUID, "claims[0] (ns/a) has no UID"},
		{h.draSocket, methodWatchHealthV1, garbage, "NodeWatchResources: malformed message"},
		{h.draSocket, methodWatchHealthV1alpha1, garbage, "NodeWatchResources: malformed message"},
		{h.regSocket, methodGetInfo, garbage, "GetInfo: malformed message"},
		{h.regSocket, methodNotifyRegistrationStatus, garbage, "NotifyRegistrationStatus: malformed message"},
		{h.regSocket, methodNotifyRegistrationStatus, rawMessage{0x0a, 0x01, 0x41}, "NotifyRegistrationStatus: field 1: wire type 2"},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			c := grpcwire.NewClient(tt.socket, 0)
			defer c.Close()
			_, err := c.Call(t.Context(), tt.method, tt.req)
			if grpcwire.CodeOf(err) != grpcwire.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want InvalidArgument %q", err, tt.want)
			}
		})
	}
}

func TestSockets(t *testing.T) {
	t.Run("a stale socket is replaced and ours go at Stop", func(t *testing.T) {
		o := testDirs(t, Options{})
		for _, stale := range []string{filepath.Join(o.PluginDir, "dra.sock"), filepath.Join(o.RegistrarDir, testDriver+"-reg.sock")} {
			if err := os.WriteFile(stale, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		h, err := Start(t.Context(), &fakePlugin{}, fakeClaims{}, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := registerapi.NewRegistrationClient(dial(t, h.regSocket)).GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil {
			t.Fatal(err)
		}
		h.Stop()
		for _, s := range []string{h.draSocket, h.regSocket} {
			if _, err := os.Lstat(s); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after Stop: %v", s, err)
			}
		}
	})
	t.Run("the context's end stops it", func(t *testing.T) {
		o := testDirs(t, Options{})
		ctx, cancel := context.WithCancel(t.Context())
		h, err := Start(ctx, &fakePlugin{}, fakeClaims{}, o)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		h.wg.Wait()
		if _, err := os.Lstat(h.regSocket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("registration socket after the context ended: %v", err)
		}
	})
}

func TestRollingUpdate(t *testing.T) {
	const uid = "6f1c2a3e-7a1b-4c8e-9d3f-0123456789ab"
	p := &fakePlugin{results: map[types.UID]PrepareResult{"uid-a": {}}}
	h, _ := startHelper(t, p, claimsOf(claim("ns", "a", "uid-a")), Options{RollingUpdateUID: uid})
	regDir := filepath.Dir(h.regSocket)
	if got, want := filepath.Base(h.regSocket), upstreamRollingUpdateSocket(regDir, testDriver, uid); got != want {
		t.Errorf("registration socket %s, want the helper's %s", got, want)
	}
	if got, want := filepath.Base(h.draSocket), "dra-"+uid+".sock"; got != want {
		t.Errorf("DRA socket %s, want %s", got, want)
	}
	if _, err := drapbv1.NewDRAPluginClient(dial(t, h.draSocket)).NodePrepareResources(t.Context(), &drapbv1.NodePrepareResourcesRequest{
		Claims: []*drapbv1.Claim{{Namespace: "ns", Name: "a", Uid: "uid-a"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(h.draSocket), "serialize.lock")); err != nil {
		t.Errorf("no lock file after a call: %v", err)
	}
}

func TestRollingUpdateSocketFile(t *testing.T) {
	for _, dir := range []string{
		"/var/lib/kubelet/plugins_registry",
		"/" + strings.Repeat("d", 40),
		"/" + strings.Repeat("d", 60),
		"/" + strings.Repeat("d", 90),
		"/" + strings.Repeat("d", 120),
	} {
		for _, driver := range []string{"gpu.example.com", "a-much-longer-driver-name.gpu-device-plugin.example.com"} {
			uid := types.UID("6f1c2a3e-7a1b-4c8e-9d3f-0123456789ab")
			if got, want := RollingUpdateRegistrarSocketFile(dir, driver, uid), upstreamRollingUpdateSocket(dir, driver, uid); got != want {
				t.Errorf("(%d-byte dir, %s): %s, want %s", len(dir), driver, got, want)
			}
		}
	}
}

func TestHealth(t *testing.T) {
	at := time.Unix(1700000000, 0)
	reports := []DeviceHealthReport{
		{Devices: []DeviceHealth{{PoolName: "node1", DeviceName: "gpu-0", Health: HealthStatusHealthy, LastUpdated: at, HealthCheckTimeout: time.Minute}}},
		{Devices: []DeviceHealth{
			{PoolName: "node1", DeviceName: "gpu-0", Health: HealthStatusUnhealthy, LastUpdated: at.Add(time.Second), Message: "xid=79: fallen off the bus"},
			{PoolName: "node1", DeviceName: "gpu-1", Health: HealthStatusUnknown},
		}},
	}
	for _, v := range healthVersions {
		t.Run(v.name, func(t *testing.T) {
			p := &fakePlugin{health: make(chan DeviceHealthReport)}
			h, _ := startHelper(t, p, fakeClaims{}, Options{})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			recv := v.watch(ctx, t, dial(t, h.draSocket))
			for i, r := range reports {
				p.health <- r
				got, err := recv()
				if err != nil {
					t.Fatal(err)
				}
				if want := upstreamHealth(r); !proto.Equal(got, want) {
					t.Errorf("report %d:\n%v\nwant\n%v", i, got, want)
				}
			}
		})
		t.Run(v.name+"/not supported is Unimplemented", func(t *testing.T) {
			p := &fakePlugin{healthErr: fmt.Errorf("driver: %w", ErrHealthNotSupported)}
			h, _ := startHelper(t, p, fakeClaims{}, Options{})
			_, err := v.watch(t.Context(), t, dial(t, h.draSocket))()
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("err %v, want Unimplemented", err)
			}
		})
	}
}

func TestHealthStale(t *testing.T) {
	p := &fakePlugin{health: make(chan DeviceHealthReport), errs: make(chan string, 1)}
	h, _ := startHelper(t, p, fakeClaims{}, Options{staleCheck: 5 * time.Millisecond})
	recv := healthVersions[0].watch(t.Context(), t, dial(t, h.draSocket))
	p.health <- DeviceHealthReport{Devices: []DeviceHealth{{PoolName: "node1", DeviceName: "gpu-0", Health: HealthStatusHealthy, HealthCheckTimeout: 10 * time.Millisecond}}}
	if _, err := recv(); err != nil {
		t.Fatal(err)
	}
	// The next report never comes: the plugin hears of it.
	select {
	case msg := <-p.errs:
		if !strings.Contains(msg, "device health reports are stale") || !strings.Contains(msg, "recoverable") {
			t.Errorf("HandleError got %q", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no word of stale reports")
	}
}

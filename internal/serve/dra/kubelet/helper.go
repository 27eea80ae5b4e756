package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// Options configure Start.
type Options struct {
	// DriverName is the DRA driver's name. Required.
	DriverName string
	// RegistrarDir is where the kubelet looks for registration sockets;
	// empty is KubeletRegistryDir. It must exist.
	RegistrarDir string
	// PluginDir holds the DRA socket, the lock file of a rolling update
	// and the metadata files; empty is KubeletPluginsDir/<driver>. It
	// must exist and belong to this driver alone.
	PluginDir string
	// RollingUpdateUID, the pod's UID, lets two pods serve side by side
	// in a rolling update: each has sockets of its own, and calls are
	// serialized across both by a file lock.
	RollingUpdateUID types.UID
	// DeviceMetadata writes each prepared request's metadata file and a
	// CDI spec that mounts it in the containers (KEP-5304), in each of
	// MetadataVersions (newest first, metadata v1beta1 among them).
	DeviceMetadata   bool
	MetadataVersions []schema.GroupVersion
	// CDIDir is where the metadata CDI specs go; empty is DefaultCDIDir.
	CDIDir string
	// Log gets the helper's log; nil discards it.
	Log *slog.Logger

	// staleCheck, when set, replaces staleCheckInterval (tests).
	staleCheck time.Duration
}

// Helper serves a DRAPlugin to the kubelet until Stop or its context ends.
type Helper struct {
	plugin     DRAPlugin
	claims     ClaimReader
	log        *slog.Logger
	driver     string
	draSocket  string
	regSocket  string
	lockPath   string // set with a rolling update
	metadata   *metadataWriter
	staleCheck time.Duration
	requestID  atomic.Int64
	// mu serializes prepare and unprepare calls without a rolling update.
	mu     sync.Mutex
	status atomic.Pointer[RegistrationStatus]
	// registered is closed at the kubelet's first successful
	// registration; once guards the close.
	registered chan struct{}
	once       sync.Once

	draServer, regServer *grpcwire.Server
	cancel               context.CancelFunc
	wg                   sync.WaitGroup
}

// Start serves plugin to the kubelet: the DRA services on the DRA socket
// first, then the registration socket the kubelet watches for, so the
// kubelet never dials a socket not yet served. claims reads the claims the
// kubelet names. The helper stops when ctx ends or at Stop.
func Start(ctx context.Context, plugin DRAPlugin, claims ClaimReader, o Options) (*Helper, error) {
	if o.DriverName == "" {
		return nil, errors.New("DRA kubelet plugin: the driver name must be set")
	}
	if plugin == nil || claims == nil {
		return nil, errors.New("DRA kubelet plugin: a plugin and a claim reader must be given")
	}
	if o.RegistrarDir == "" {
		o.RegistrarDir = KubeletRegistryDir
	}
	if o.PluginDir == "" {
		o.PluginDir = filepath.Join(KubeletPluginsDir, o.DriverName)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	h := &Helper{
		plugin: plugin, claims: claims, log: o.Log, driver: o.DriverName,
		draSocket: filepath.Join(o.PluginDir, "dra.sock"), regSocket: filepath.Join(o.RegistrarDir, o.DriverName+"-reg.sock"),
		staleCheck: staleCheckInterval,
		registered: make(chan struct{}),
	}
	if o.staleCheck > 0 {
		h.staleCheck = o.staleCheck
	}
	if o.RollingUpdateUID != "" {
		h.draSocket = filepath.Join(o.PluginDir, "dra-"+string(o.RollingUpdateUID)+".sock")
		h.regSocket = filepath.Join(o.RegistrarDir, RollingUpdateRegistrarSocketFile(o.RegistrarDir, o.DriverName, o.RollingUpdateUID))
		h.lockPath = filepath.Join(o.PluginDir, "serialize.lock")
	}
	if o.DeviceMetadata {
		w, err := newMetadataWriter(o.DriverName, o.PluginDir, o.CDIDir, o.MetadataVersions)
		if err != nil {
			return nil, fmt.Errorf("DRA kubelet plugin: device metadata: %w", err)
		}
		h.metadata = w
	}

	h.draServer = grpcwire.NewServer(o.Log)
	h.draServer.HandleUnary(methodPrepareV1, h.prepare(methodPrepareV1, false))
	h.draServer.HandleUnary(methodPrepareV1beta1, h.prepare(methodPrepareV1beta1, true))
	h.draServer.HandleUnary(methodUnprepareV1, h.unprepare(methodUnprepareV1))
	h.draServer.HandleUnary(methodUnprepareV1beta1, h.unprepare(methodUnprepareV1beta1))
	h.draServer.HandleStream(methodWatchHealthV1, h.watchHealth(methodWatchHealthV1))
	h.draServer.HandleStream(methodWatchHealthV1alpha1, h.watchHealth(methodWatchHealthV1alpha1))

	info := pluginInfo{Type: pluginTypeDRA, Name: o.DriverName, Endpoint: h.draSocket,
		SupportedVersions: []string{serviceDRAV1, serviceDRAV1beta1, serviceHealthV1, serviceHealthV1alpha1}}
	h.regServer = grpcwire.NewServer(o.Log)
	h.regServer.HandleUnary(methodGetInfo, func(_ context.Context, b []byte) (grpcwire.Marshaler, error) {
		if err := checkEmpty(b); err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "GetInfo: %v", err)
		}
		return info, nil
	})
	h.regServer.HandleUnary(methodNotifyRegistrationStatus, h.notifyRegistrationStatus)

	ctx, h.cancel = context.WithCancel(ctx)
	draLn, err := listenUnix(ctx, h.draSocket)
	if err != nil {
		h.cancel()
		return nil, fmt.Errorf("DRA kubelet plugin: %w", err)
	}
	regLn, err := listenUnix(ctx, h.regSocket)
	if err != nil {
		draLn.Close()
		h.cancel()
		return nil, fmt.Errorf("DRA kubelet plugin: registration: %w", errors.Join(err, removeSocket(h.draSocket)))
	}
	h.serve(ctx, h.draServer, draLn, "DRA gRPC server failed")
	h.serve(ctx, h.regServer, regLn, "registrar gRPC server failed")
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		<-ctx.Done()
		// The registration socket first: the kubelet forgets the plugin
		// before its DRA socket goes.
		h.regServer.Stop()
		h.draServer.Stop()
		removeSocket(h.regSocket)
		removeSocket(h.draSocket)
	}()
	h.log.Info("DRA: serving the kubelet", "driver", o.DriverName, "socket", h.draSocket, "registration", h.regSocket)
	return h, nil
}

func (h *Helper) serve(ctx context.Context, s *grpcwire.Server, ln net.Listener, msg string) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := s.Serve(ln); err != nil {
			h.plugin.HandleError(ctx, err, msg)
		}
	}()
}

// Stop stops serving, removes the sockets and waits for the servers to
// end. Calls in flight see their context end.
func (h *Helper) Stop() {
	if h == nil {
		return
	}
	h.cancel()
	h.wg.Wait()
}

// RegistrationStatus is what the kubelet last said of the registration,
// nil before it has said anything.
func (h *Helper) RegistrationStatus() *RegistrationStatus {
	return h.status.Load()
}

// Registered is closed once the kubelet has said the registration
// succeeded: from then on it prepares this driver's claims.
func (h *Helper) Registered() <-chan struct{} { return h.registered }

func (h *Helper) notifyRegistrationStatus(_ context.Context, b []byte) (grpcwire.Marshaler, error) {
	var st RegistrationStatus
	if err := st.unmarshal(b); err != nil {
		return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "NotifyRegistrationStatus: %v", err)
	}
	h.status.Store(&st)
	if !st.PluginRegistered {
		h.log.Error("DRA: the kubelet refused the plugin's registration", "driver", h.driver, "err", st.Error)
		return nil, fmt.Errorf("failed registration process: %s", st.Error)
	}
	h.log.Info("DRA: registered with the kubelet", "driver", h.driver)
	h.once.Do(func() { close(h.registered) })
	return empty{}, nil
}

// serialize makes prepare and unprepare calls one at a time, across both
// pods of a rolling update through the lock file. It returns the unlock.
func (h *Helper) serialize() (func(), error) {
	if h.lockPath == "" {
		h.mu.Lock()
		return h.mu.Unlock, nil
	}
	f, err := lockFile(h.lockPath)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

// checkClaims vets the kubelet's claim references.
func checkClaims(refs []claimRef) error {
	for i, c := range refs {
		switch {
		case c.Namespace == "":
			return fmt.Errorf("claims[%d] (%s) has no namespace", i, c.Name)
		case c.Name == "":
			return fmt.Errorf("claims[%d] has no name", i)
		case c.UID == "":
			return fmt.Errorf("claims[%d] (%s/%s) has no UID", i, c.Namespace, c.Name)
		}
	}
	return nil
}

func (h *Helper) prepare(method string, v1beta1 bool) grpcwire.UnaryFunc {
	return func(ctx context.Context, b []byte) (grpcwire.Marshaler, error) {
		refs, err := readClaims(b)
		if err == nil {
			err = checkClaims(refs)
		}
		if err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "NodePrepareResources: %v", err)
		}
		id := h.requestID.Add(1)
		h.log.Debug("DRA: handling request", "method", method, "requestID", id, "claims", len(refs))
		resp, err := h.prepareClaims(ctx, refs)
		if err != nil {
			h.log.Error("DRA: handling request failed", "method", method, "requestID", id, "err", err)
			return nil, err
		}
		resp.v1beta1 = v1beta1
		return resp, nil
	}
}

func (h *Helper) prepareClaims(ctx context.Context, refs []claimRef) (prepareResponse, error) {
	// The API server first, outside the lock, as the helper does.
	claims, err := h.readClaims(ctx, refs)
	if err != nil {
		return prepareResponse{}, fmt.Errorf("get resource claims: %w", err)
	}
	unlock, err := h.serialize()
	if err != nil {
		return prepareResponse{}, fmt.Errorf("serialize gRPC: %w", err)
	}
	defer unlock()
	results, err := h.plugin.PrepareResourceClaims(ctx, claims)
	if err != nil {
		return prepareResponse{}, fmt.Errorf("prepare resource claims: %w", err)
	}
	// Each request's metadata CDI device, by claim and request name.
	var metaIDs map[types.UID]map[string]string
	if h.metadata != nil {
		metaIDs = map[types.UID]map[string]string{}
		for _, c := range claims {
			r, ok := results[c.UID]
			if !ok || r.Err != nil {
				continue
			}
			ids, err := h.metadata.writeClaim(c, r.Devices)
			if err != nil {
				h.log.Error("DRA: writing device metadata", "claim", c.Namespace+"/"+c.Name, "err", err)
				continue
			}
			metaIDs[c.UID] = ids
		}
	}
	resp := prepareResponse{claims: make(map[string]claimPrepared, len(results))}
	for uid, r := range results {
		var cp claimPrepared
		if r.Err != nil {
			cp.err = r.Err.Error()
		}
		// The metadata device goes with the first device of its request.
		added := map[string]bool{}
		for _, d := range r.Devices {
			wd := wireDevice{RequestNames: baseRequestNames(d.Requests), PoolName: d.PoolName, DeviceName: d.DeviceName,
				CDIDeviceIDs: d.CDIDeviceIDs, ShareID: (*string)(d.ShareID)}
			for _, req := range wd.RequestNames {
				if id, ok := metaIDs[uid][req]; ok && !added[req] {
					wd.CDIDeviceIDs = append(wd.CDIDeviceIDs[:len(wd.CDIDeviceIDs):len(wd.CDIDeviceIDs)], id)
					added[req] = true
				}
			}
			cp.devices = append(cp.devices, wd)
		}
		resp.claims[string(uid)] = cp
	}
	return resp, nil
}

// readClaims reads each claim, allocated and of the UID the kubelet
// names; a claim deleted and made again under its name is not the one.
func (h *Helper) readClaims(ctx context.Context, refs []claimRef) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, r := range refs {
		c, err := h.claims.GetClaim(ctx, r.Namespace, r.Name)
		if err != nil {
			return nil, fmt.Errorf("retrieve claim %s/%s: %w", r.Namespace, r.Name, err)
		}
		if c == nil {
			return nil, fmt.Errorf("retrieve claim %s/%s: no claim returned", r.Namespace, r.Name)
		}
		if c.Status.Allocation == nil {
			return nil, fmt.Errorf("claim %s/%s not allocated", r.Namespace, r.Name)
		}
		if c.UID != types.UID(r.UID) {
			return nil, fmt.Errorf("claim %s/%s got replaced", r.Namespace, r.Name)
		}
		out = append(out, c)
	}
	return out, nil
}

// baseRequestNames are names without their "/subrequest": the kubelet
// knows requests only.
func baseRequestNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i], _, _ = strings.Cut(n, "/")
	}
	return out
}

func (h *Helper) unprepare(method string) grpcwire.UnaryFunc {
	return func(ctx context.Context, b []byte) (grpcwire.Marshaler, error) {
		refs, err := readClaims(b)
		if err == nil {
			err = checkClaims(refs)
		}
		if err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "NodeUnprepareResources: %v", err)
		}
		id := h.requestID.Add(1)
		h.log.Debug("DRA: handling request", "method", method, "requestID", id, "claims", len(refs))
		resp, err := h.unprepareClaims(ctx, refs)
		if err != nil {
			h.log.Error("DRA: handling request failed", "method", method, "requestID", id, "err", err)
			return nil, err
		}
		return resp, nil
	}
}

func (h *Helper) unprepareClaims(ctx context.Context, refs []claimRef) (unprepareResponse, error) {
	unlock, err := h.serialize()
	if err != nil {
		return nil, fmt.Errorf("serialize gRPC: %w", err)
	}
	defer unlock()
	claims := make([]NamespacedObject, len(refs))
	for i, r := range refs {
		claims[i] = NamespacedObject{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: r.Name}, UID: types.UID(r.UID)}
	}
	results, err := h.plugin.UnprepareResourceClaims(ctx, claims)
	if err != nil {
		return nil, fmt.Errorf("unprepare resource claims: %w", err)
	}
	if h.metadata != nil {
		for _, c := range claims {
			if err, ok := results[c.UID]; !ok || err != nil {
				continue
			}
			if err := h.metadata.removeClaim(c); err != nil {
				results[c.UID] = fmt.Errorf("clean up device metadata: %w", err)
			}
		}
	}
	resp := make(unprepareResponse, len(results))
	for uid, err := range results {
		resp[string(uid)] = ""
		if err != nil {
			resp[string(uid)] = err.Error()
		}
	}
	return resp, nil
}

package dra

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/imex"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
)

// CheckpointFile, in the plugin directory (draPluginDir), keeps prepared
// claims.
const CheckpointFile = "checkpoint.json"

// Settings are what the front-end takes of the configuration, as plain
// values (dramode.Settings builds them).
type Settings struct {
	// DriverName is the driver's name: the ResourceSlices', the kubelet
	// registration's.
	DriverName string
	// FieldManager names the plugin in its API writes: the client's user
	// agent, the claims' status entries.
	FieldManager string
	// Node is this node's name: the pool the slices publish.
	Node string
	// Kubeconfig is the API client's kubeconfig; empty: the pod's service
	// account.
	Kubeconfig string
	// PluginDir is the kubelet's directory for this driver's socket and
	// checkpoint (draPluginDir); PluginRegistryDir its registration
	// directory (pluginRegistryDir).
	PluginDir, PluginRegistryDir string
	// PodUID is the plugin's pod, for rolling updates; empty: none.
	PodUID string
	// DeviceMetadata gives containers their devices' attributes in a
	// metadata file (KEP-5304), mounted through a CDI spec the helper
	// writes in CDISpecDir.
	DeviceMetadata bool
	CDISpecDir     string
	// PodResourcesSocket is the kubelet's PodResources API; empty: not
	// asked.
	PodResourcesSocket string
	// The host's roots.
	SysfsRoot, DevRoot, ProcRoot, MPSRoot string
	// NICPools is how many NIC pools are configured: each reports before
	// the slices are first published.
	NICPools int
	// IgnoredTimeSlicing is how many sharing.timeSlicing entries are set,
	// which DRA mode ignores and says so.
	IgnoredTimeSlicing int
	// MemoryShares are the GPUs whose memory claims share.
	MemoryShares draslice.MemoryShares
	// MIGPartitioned says whether a GPU in MIG mode is partitioned for
	// claims (sharing.migPartitions).
	MIGPartitioned func(nvml.GPU) bool
	// IMEXDaemons, when set, serves ComputeDomain channel claims
	// (imex.computeDomains) with this node's address IMEXNodeIP: the
	// wiring makes them (internal/node/imexd).
	IMEXDaemons IMEXDaemons
	IMEXNodeIP  string
}

// FrontEndOption changes how NewFrontEnd reaches the API server.
type FrontEndOption func(*frontEndOptions)

type frontEndOptions struct {
	api *kubeapi.Config
}

// WithAPIConfig reaches the API server as c says instead of through the
// kubeconfig setting or the pod's service account: a test's server.
func WithAPIConfig(c kubeapi.Config) FrontEndOption {
	return func(o *frontEndOptions) { o.api = &c }
}

// NewFrontEnd is the DRA front-end that dramode.With gives daemon: the model's
// sources feed a Driver, package kubelet carries it to the kubelet
// (registration, Prepare/Unprepare, health) and package slicepub to the API
// server (ResourceSlices).
func NewFrontEnd(opts ...FrontEndOption) func(context.Context, Settings, *ondisk.Store, *slog.Logger) (*FrontEnd, error) {
	var o frontEndOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(ctx context.Context, s Settings, specs *ondisk.Store, log *slog.Logger) (*FrontEnd, error) {
		return startFrontEnd(ctx, s, specs, o, log)
	}
}

// FrontEnd serves the model through DRA; daemon drives it.
type FrontEnd struct {
	drv    *Driver
	helper *kubelet.Helper
	pub    *slicepub.Publisher
	specs  *ondisk.Store
	ctx    context.Context
	s      Settings

	mu     sync.Mutex
	gspecs gpu.CDISpecs
	pools  map[string]*nic.Pool
	inv    *nvml.Inventory
	parts  *nvml.Partitioner
}

// startFrontEnd registers the driver with the kubelet. Slices are
// published once the GPUs and every NIC pool have reported.
func startFrontEnd(ctx context.Context, s Settings, specs *ondisk.Store, fo frontEndOptions, log *slog.Logger) (*FrontEnd, error) {
	api, err := apiClient(s, fo)
	if err != nil {
		return nil, err
	}
	node := s.Node
	if s.IgnoredTimeSlicing > 0 {
		log.Warn("sharing.timeSlicing is ignored in DRA mode: pods share a device by referencing one ResourceClaim",
			"resources", s.IgnoredTimeSlicing)
	}
	if err := makePluginDirs(s); err != nil {
		return nil, err
	}
	f := &FrontEnd{specs: specs, pools: map[string]*nic.Pool{}, s: s}
	var held PodResources
	if s.PodResourcesSocket != "" {
		held = podresources.Client{Socket: s.PodResourcesSocket}
	}
	claims := apiClaims{api: api}
	drv, err := New(Options{
		DriverName:     s.DriverName,
		NodeName:       node,
		SysfsRoot:      s.SysfsRoot,
		DevRoot:        s.DevRoot,
		CheckpointPath: filepath.Join(s.PluginDir, CheckpointFile),
		GPUCDIID:       func(uuid string) string { return cdi.QualifiedName(cdi.GPUKind, uuid) },
		NICCDIID:       f.nicCDIID,
		Specs:          f,
		PodResources:   held,
		Claims:         claims,
		ClaimStatus:    claims,
		Sources:        1 + s.NICPools,
		DeviceMetadata: s.DeviceMetadata,
		Log:            log,
	})
	if err != nil {
		return nil, err
	}
	f.drv = drv
	if s.IMEXDaemons != nil {
		if err := f.useComputeDomains(ctx, api); err != nil {
			return nil, err
		}
	}
	// Before the kubelet can call: a claim prepared before a checkpoint
	// that no longer reads must guard its devices from the first Prepare.
	drv.Rebuild(ctx)
	f.ctx = ctx
	ko := kubelet.Options{
		DriverName:   s.DriverName,
		RegistrarDir: s.PluginRegistryDir,
		PluginDir:    s.PluginDir,
		Log:          log,
	}
	if s.PodUID != "" {
		// Two pods of a rolling update serve side by side; the kubelet
		// moves to the newer one.
		ko.RollingUpdateUID = types.UID(s.PodUID)
	}
	if s.DeviceMetadata {
		// Each request's file is written under PluginDir and a CDI spec
		// mounting it beside ours; the kubelet only passes the CDI ID on,
		// so no kubelet feature gate is involved.
		ko.DeviceMetadata, ko.MetadataVersions, ko.CDIDir = true, metadataVersions(), s.CDISpecDir
	}
	if f.helper, err = kubelet.Start(ctx, drv, claims, ko); err != nil {
		return nil, fmt.Errorf("starting the DRA kubelet plugin: %w", err)
	}
	log.Info("serving through DRA", "driver", s.DriverName, "node", node, "pluginDir", s.PluginDir)
	seedTaints(ctx, api, drv, log)
	f.pub = slicepub.Start(ctx, slicepub.Options{
		Driver: s.DriverName, Node: node, API: api, Log: log,
		OnError: drv.HandleError,
	})
	go f.publishOnceRegistered(ctx, log)
	return f, nil
}

// registrationWait bounds how long the first slices wait for the kubelet
// to register the driver. The kubelet's plugin watcher looks every second;
// a pod scheduled on slices published before it has, fails its Prepare
// ("not registered") and waits out the kubelet's backoff, up to a minute.
// A node without a kubelet (the scale lane) publishes after the wait.
const registrationWait = 3 * time.Second

// publishOnceRegistered hands the driver its publisher once the kubelet
// has registered it, or after registrationWait.
func (f *FrontEnd) publishOnceRegistered(ctx context.Context, log *slog.Logger) {
	t := time.NewTimer(registrationWait)
	defer t.Stop()
	select {
	case <-f.helper.Registered():
	case <-t.C:
		log.Info("DRA: the kubelet has not registered the driver yet; publishing the ResourceSlices now", "waited", registrationWait)
	case <-ctx.Done():
		return
	}
	f.drv.SetPublisher(ctx, f.pub)
}

// makePluginDirs creates the driver's plugin directory (its socket and
// checkpoint) and the kubelet's registration directory where they are
// missing: the kubelet makes neither for a driver, and on a node package or
// host run nothing else does. 0750, as the kubelet's own: root reads them.
func makePluginDirs(s Settings) error {
	for _, d := range []struct{ dir, key string }{
		{s.PluginDir, "draPluginDir (--dra-plugin-dir)"},
		{s.PluginRegistryDir, "pluginRegistryDir (--plugin-registry-dir)"},
	} {
		if err := os.MkdirAll(d.dir, 0o750); err != nil {
			return fmt.Errorf("DRA: creating %s %s: %w", d.key, d.dir, err)
		}
	}
	return nil
}

// The DRA executable's client-side request limit, as client-go's token
// bucket was set. Its requests are the ResourceSlice writes (debounced to
// one a second at most), a ResourceClaim read and a status write per claim
// prepared (none for a claim prepared again whose status is current) and
// the slices' watch: bursts of Prepare fit in the burst, and no bug of
// ours can make one node send more than kubeQPS requests a second for long.
const (
	kubeQPS   = 5
	kubeBurst = 10
)

// apiClient reaches the API server as fo says, else through s.Kubeconfig,
// else the pod's service account.
func apiClient(s Settings, fo frontEndOptions) (*draapi.Client, error) {
	var kc kubeapi.Config
	var err error
	switch {
	case fo.api != nil:
		kc = *fo.api
	case s.Kubeconfig != "":
		kc, err = kubeapi.LoadKubeconfig(s.Kubeconfig)
	default:
		kc, err = kubeapi.InCluster()
	}
	if err != nil {
		return nil, fmt.Errorf("DRA mode needs API access for ResourceSlices: set kubeconfig (--kubeconfig) or run in a pod with a service account: %w", err)
	}
	// The API server takes the field manager from the user agent when a
	// write names none; every write here names s.FieldManager.
	kc.UserAgent, kc.FieldManager = s.FieldManager, s.FieldManager
	c, err := kubeapi.New(kc)
	if err != nil {
		return nil, fmt.Errorf("DRA: API client: %w", err)
	}
	return draapi.New(c, kubeQPS, kubeBurst, s.FieldManager), nil
}

// apiClaims reads ResourceClaims through the API server, one namespaced
// GET each: the RBAC the chart grants (resourceclaims get) and no more.
type apiClaims struct {
	api *draapi.Client
}

func (a apiClaims) GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return a.api.GetClaim(ctx, namespace, name)
}

// seedReadTimeout bounds the read of the node's slices at start: it only
// keeps taints' times, and must not hold the first publication for long.
const seedReadTimeout = 10 * time.Second

// seedTaints gives drv the taints this node's slices carry, as the
// previous process published them (Driver.SeedTaints). A read that fails
// costs only fresh timeAdded values: it is said once, and nothing else
// changes.
func seedTaints(ctx context.Context, api *draapi.Client, drv *Driver, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, seedReadTimeout)
	defer cancel()
	seeds, err := publishedTaints(ctx, api, drv.o.DriverName, drv.o.NodeName)
	if err != nil {
		log.Info("DRA: could not read this node's ResourceSlices; device taints kept across the restart get a new timeAdded", "err", err)
		return
	}
	drv.SeedTaints(seeds)
}

// publishedTaints reads the taints on this node's devices, by device name,
// from its ResourceSlices of driver: one LIST narrowed by field selector to
// the driver and the node (never the cluster's slices; the Node authorizer
// requires the node too), served from the API server's cache
// (resourceVersion 0), as a slightly stale answer only costs a timestamp.
func publishedTaints(ctx context.Context, api *draapi.Client, driver, node string) (map[string][]draslice.Taint, error) {
	sel := draapi.SliceSelector(driver, node)
	list, err := api.ListSlices(ctx, sel, true)
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices (%s): %w", sel, err)
	}
	out := map[string][]draslice.Taint{}
	for _, sl := range list.Items {
		if sl.Spec.Driver != driver || sl.Spec.Pool.Name != node {
			continue
		}
		for _, dv := range sl.Spec.Devices {
			for _, t := range dv.Taints {
				if t.TimeAdded == nil {
					continue
				}
				at := t.TimeAdded.Time
				out[dv.Name] = append(out[dv.Name], draslice.Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect), TimeAdded: &at})
			}
		}
	}
	return out, nil
}

// PodUID is the UID of pod namespace/name, from the reservations of the
// claims the driver prepared for it; "" when unknown.
func (f *FrontEnd) PodUID(namespace, name string) string { return f.drv.PodUID(namespace, name) }

// Run stops the kubelet's services and the publisher when ctx ends.
// Prepared claims stay in the checkpoint, and the ResourceSlices for the
// next start to update.
func (f *FrontEnd) Run(ctx context.Context) error {
	<-ctx.Done()
	f.helper.Stop()
	f.pub.Stop()
	return nil
}

// Ensure is CDISpecs: the GPU spec is checked against the control nodes
// present, as before an Allocate; a NIC pool's spec must be on disk.
func (f *FrontEnd) Ensure(kind string) error {
	if kind == cdi.GPUKind {
		f.mu.Lock()
		g := f.gspecs
		f.mu.Unlock()
		if g == nil {
			return fmt.Errorf("%w: no GPU CDI spec yet", device.ErrNotReady)
		}
		return g.Ensure()
	}
	return f.specs.Ready(kind)
}

func (f *FrontEnd) nicCDIID(pool, address string) string {
	f.mu.Lock()
	p := f.pools[pool]
	f.mu.Unlock()
	if p == nil {
		return ""
	}
	return p.CDIName(address)
}

func (f *FrontEnd) TakeNICPools(pools []*nic.Pool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range pools {
		f.pools[p.Resource()] = p
	}
	return nil
}

func (f *FrontEnd) SetNICDevices(p *nic.Pool, devs []device.Device, first bool) {
	f.drv.SetNICPool(f.ctx, draslice.NICPool{Name: p.Resource(), NICs: p.NICs()}, devs, first)
}

// ServeNICs waits: SetNICDevices publishes each pool.
func (f *FrontEnd) ServeNICs(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (f *FrontEnd) TakeGPUs(inv *nvml.Inventory, specs gpu.CDISpecs) (health.Notifier, error) {
	f.mu.Lock()
	f.gspecs, f.inv = specs, inv
	f.mu.Unlock()
	return f.drv, nil
}

// ServeGPUs publishes the GPUs (their health polled once already, so the
// first slice carries their taints) and waits.
func (f *FrontEnd) ServeGPUs(ctx context.Context) error {
	f.mu.Lock()
	inv, parts := f.inv, f.parts
	f.mu.Unlock()
	in := draslice.GPUsOf(inv, f.s.MemoryShares)
	if parts != nil {
		in.Partitions = draslice.Partitions(inv.GPUs, f.s.MIGPartitioned, parts.Layout, f.drv.o.Log)
		f.drv.SetMIG(nvmlInstances{p: parts, devRoot: f.s.DevRoot, procRoot: f.s.ProcRoot}, f.specWriter(cdi.MIGKind))
	}
	f.drv.SetGPUs(f.ctx, in)
	<-ctx.Done()
	return nil
}

// UsePartitions creates the MIG instances of claims on the GPUs
// sharing.migPartitions selects through p.
func (f *FrontEnd) UsePartitions(p *nvml.Partitioner) {
	f.mu.Lock()
	f.parts = p
	f.mu.Unlock()
}

// UseSharing runs the MPS daemons of the claims' MPS clients through m
// until ctx ends, and sets the time-slice intervals they ask for through
// timeSlice (see Driver.SetMPS).
func (f *FrontEnd) UseSharing(ctx context.Context, m *mpsd.Manager, timeSlice func(ctx context.Context, uuid string, level int) (string, error)) {
	f.drv.SetMPS(ctx, m, f.s.MPSRoot, f.specWriter(cdi.MPSKind), timeSlice)
}

// specWriter writes the spec of kind, one the DRA driver keeps (MPS
// clients, MIG instances), holding devs; with none, removes it.
func (f *FrontEnd) specWriter(kind string) func(devs []cdi.Device) error {
	return func(devs []cdi.Device) error {
		if len(devs) == 0 {
			f.specs.Publish(kind, nil)
			return nil
		}
		spec, err := cdi.Spec(kind, devs, cdi.Edits{})
		if err != nil {
			return err
		}
		f.specs.Publish(kind, spec)
		return f.specs.Ready(kind)
	}
}

// UseReadiness has the front-end say whether its ResourceSlices were
// published (the plugin's readiness), as gate "ResourceSlices".
func (f *FrontEnd) UseReadiness(ready func(name, why string)) {
	f.drv.UseReadiness(func(why string) { ready("ResourceSlices", why) })
}

// NoGPUs publishes none, so the NIC pools need not wait for a driver.
func (f *FrontEnd) NoGPUs(context.Context) { f.drv.SetGPUs(f.ctx, draslice.GPUs{}) }

// Evict makes the taints of a GPU's devices NoExecute while on (see
// Driver.Evict): the remediation's eviction, found by type assertion.
func (f *FrontEnd) Evict(uuid string, on bool) { f.drv.Evict(uuid, on) }

// useComputeDomains serves ComputeDomain channel claims: the channel's
// CDI spec, the domains through api, channel nodes made from the driver's
// major.
func (f *FrontEnd) useComputeDomains(ctx context.Context, api *draapi.Client) error {
	s := f.s
	spec, err := cdi.ChannelSpec(s.DevRoot, []int{domainChannel})
	if err != nil {
		return err
	}
	f.specs.Publish(cdi.ChannelKind, spec)
	channel := func(id int) error {
		major, ok, err := imex.Major(s.ProcRoot)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("the driver lists no %s device in %s/devices: it has no IMEX support", imex.DeviceName, s.ProcRoot)
		}
		_, err = imex.EnsureChannel(s.DevRoot, major, id)
		return err
	}
	return f.drv.SetComputeDomains(ctx, ComputeDomainOptions{
		API: NewDomainAPI(api, s.Node), Daemons: s.IMEXDaemons, NodeIP: s.IMEXNodeIP, Channel: channel,
	})
}

package dra

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
)

// CDISpecs is asked before Prepare hands out a CDI device ID: nil when the
// spec defining kind's devices is on disk and current, else why not. The
// daemon's spec store implements it.
type CDISpecs interface {
	Ensure(kind string) error
}

// Publisher publishes the node's ResourceSlices; *slicepub.Publisher is
// one.
type Publisher interface {
	PublishResources(ctx context.Context, r slicepub.DriverResources) error
}

// Options configure a Driver.
type Options struct {
	// DriverName is the DRA driver name, also the domain of attributes
	// and taint keys.
	DriverName string
	// NodeName names the node and its pool.
	NodeName string
	// SysfsRoot is where sysfs is mounted (PCIe roots are read there).
	SysfsRoot string
	// DevRoot is the host's /dev, for the CDI devices of MIG instances
	// claims create; "" is /dev.
	DevRoot string
	// CheckpointPath keeps prepared claims across restarts; empty makes
	// a driver that only previews its devices (list) and prepares none.
	CheckpointPath string
	// GPUCDIID and NICCDIID name a device's CDI device ID; NICCDIID
	// returns "" for a NIC without one.
	GPUCDIID func(uuid string) string
	NICCDIID func(pool, address string) string
	// DeviceMetadata fills each prepared device's Metadata (metadata.go),
	// which the helper writes to the containers' metadata files when
	// kubelet.Options.DeviceMetadata is on.
	DeviceMetadata bool
	// Specs, when set, gates Prepare on each CDI kind's spec being on disk.
	Specs CDISpecs
	// PodResources and Claims rebuild the prepared claims when the
	// checkpoint does not parse or is missing (see Rebuild); without
	// either, such claims are logged as lost.
	PodResources PodResources
	Claims       ClaimGetter
	// ClaimStatus, when set, writes the prepared claims' status.devices
	// entries (status.go).
	ClaimStatus ClaimStatuses
	// Sources is how many device sources (GPUs, NIC pools) report before
	// the first publication, so a restart does not briefly publish a
	// slice without the devices of a slower source.
	Sources int
	// HealthResend is how often health is re-sent unchanged; the kubelet
	// takes health not refreshed in HealthTimeout as unknown.
	HealthResend, HealthTimeout time.Duration
	// PublishQuiet and PublishMaxDelay debounce the ResourceSlice
	// updates that health changes make: a change is published once no
	// other came for PublishQuiet, at most PublishMaxDelay after the first
	// change of the burst, and health changes publish at most once per
	// PublishMaxDelay. Zero is DefaultPublishQuiet, DefaultPublishMaxDelay.
	PublishQuiet, PublishMaxDelay time.Duration
	Log                           *slog.Logger
	Now                           func() time.Time
	// AfterFunc runs f in its own goroutine after d, as time.AfterFunc
	// does (the default); tests pass their own clock's.
	AfterFunc func(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc; *time.Timer is one.
type Timer interface {
	Stop() bool
}

// Driver implements kubelet.DRAPlugin over the node's model.
type Driver struct {
	o Options

	// pods are the pods each prepared claim is reserved for, by claim
	// UID, for the UIDs of their Events (PodUID).
	pods reservations

	mu       sync.Mutex
	gpus     []draslice.Device
	counters []draslice.CounterSet
	nics     map[string][]draslice.Device // by pool name
	byName   map[string]*draslice.Device
	// health is by model ID (GPU UUID, NIC PCI address): the watcher may
	// report before the devices are set.
	health map[string]*devHealth
	// evict are the GPUs whose devices' taints are NoExecute (Evict).
	evict    map[string]bool
	reported map[string]bool // sources that have reported
	cp       checkpoint
	// rebuild says why the checkpoint's claims must be rebuilt from the
	// kubelet and the API server; empty when they need not be.
	rebuild string
	// rebuildTries counts rebuilds tried, so a failure is said once;
	// rebuildSkip are the claims (namespace/name) that cannot be rebuilt
	// for good, not asked for again while a rebuild is retried.
	rebuildTries int
	rebuildSkip  map[string]bool
	// seeds are the taints this node's slices carried when the process
	// started, by device name (SeedTaints); published tells they are
	// spent: the first publication carries their times into health.
	seeds     map[string][]draslice.Taint
	published bool
	// changed is closed and replaced at every health change, waking
	// every WatchHealthStatus stream at once.
	changed chan struct{}

	// mps runs the MPS daemons of the prepared MPS clients, their
	// directories under mpsRoot, until mpsCtx ends; nil until SetMPS.
	mps     MPSDaemons
	mpsRoot string
	mpsSpec MPSSpec
	mpsCtx  context.Context
	// timeSlice sets a GPU's time-slice interval; nil until SetMPS.
	timeSlice TimeSlicer

	// mig creates the MIG instances of claims on the partitioned GPUs
	// (parents, by UUID), their CDI spec written through migSpec; nil
	// until SetMIG. migReconciled: the instances an interrupted Prepare
	// left were destroyed.
	mig           MIGInstances
	migSpec       MIGSpec
	migReconciled bool
	parents       map[string]nvml.GPU

	// cd is the node's part in ComputeDomains; nil unless
	// SetComputeDomains.
	cd *domains

	pubMu   sync.Mutex // orders publications
	pub     Publisher
	pubCtx  context.Context
	lastPub *slicepub.DriverResources // as last published
	ready   func(why string)          // readiness: "" once published

	deb debounce

	statusLog     statusLog
	statusTimeout time.Duration // statusWriteTimeout; tests shorten it
}

var _ kubelet.DRAPlugin = (*Driver)(nil)

// New makes a driver and loads its checkpoint. A checkpoint that does not
// parse is set aside and logged, and a missing one may have lost claims
// too: Rebuild then brings back the claims the kubelet's pods still hold.
func New(o Options) (*Driver, error) {
	if o.DriverName == "" || o.NodeName == "" {
		return nil, errors.New("dra: driver and node names are required")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = 30 * time.Second
	}
	if o.HealthResend <= 0 {
		o.HealthResend = o.HealthTimeout / 3
	}
	if o.GPUCDIID == nil || o.NICCDIID == nil {
		return nil, errors.New("dra: CDI naming functions are required")
	}
	if o.PublishQuiet <= 0 {
		o.PublishQuiet = DefaultPublishQuiet
	}
	if o.PublishMaxDelay <= 0 {
		o.PublishMaxDelay = DefaultPublishMaxDelay
	}
	if o.AfterFunc == nil {
		o.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	cp, found, err := readCheckpoint(o.CheckpointPath)
	var rebuild string
	switch {
	case errors.Is(err, errCorrupt):
		o.Log.Error("DRA checkpoint", "err", err)
		rebuild = whyCorrupt
	case err != nil:
		o.Log.Error("DRA checkpoint", "err", err)
	case !found && o.CheckpointPath != "":
		rebuild = whyMissing
	case len(cp.Claims) > 0:
		o.Log.Info("restored prepared claims", "count", len(cp.Claims), "path", o.CheckpointPath)
	}
	return &Driver{
		rebuild:       rebuild,
		o:             o,
		nics:          map[string][]draslice.Device{},
		byName:        map[string]*draslice.Device{},
		health:        map[string]*devHealth{},
		evict:         map[string]bool{},
		reported:      map[string]bool{},
		cp:            cp,
		changed:       make(chan struct{}),
		statusLog:     statusLog{failed: map[types.UID]bool{}},
		statusTimeout: statusWriteTimeout,
	}, nil
}

// NodeName is the node, and the name of its pool.
func (d *Driver) NodeName() string { return d.o.NodeName }

// HandleError logs background errors (publishing slices). The helper
// retries them; none is a reason to stop serving prepared claims.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.o.Log.Error("DRA: "+msg, "err", err)
}

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/snapshot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// SnapshotOptions says how far Snapshot looks. The zero value discovers
// and selects the GPUs only.
type SnapshotOptions struct {
	// Layout lays the GPUs out as the device-plugin API serves them.
	Layout bool
	// Observe lays them out and adds the rest of snapshot.Node: the
	// node's name, MIG partitions, one health poll, holders, node labels,
	// the CDI hook, the runtime door, the DRA preview, the MPS daemons'
	// word and the NICs.
	Observe bool
	// QuietDRA logs what the DRA preview finds wanting (a PCIe root) at
	// debug level: it is said in DRA's words, which only DRA mode should
	// hear above debug.
	QuietDRA bool
}

// Snapshot looks at the node once, for the commands that show it, through
// the steps serve takes: NVML is loaded, read and shut down before it
// returns. Each MIG device gets its capability minors from procfs, as
// serve's do; one without them is left out.
func Snapshot(ctx context.Context, cfg config.Config, open OpenFunc, log *slog.Logger, o SnapshotOptions) (*snapshot.Node, error) {
	lib, _, err := nvml.Load(open, cfg.DriverRoot, cfg.NVMLLibrary)
	if err != nil {
		return nil, err
	}
	defer lib.Shutdown()
	inv, err := nvml.Discover(lib, cfg.SysfsRoot, log)
	if err != nil {
		return nil, fmt.Errorf("discovering GPUs: %w", err)
	}
	n := &snapshot.Node{Inventory: inv}
	n.Excluded, n.Unmatched = selectGPUs(cfg, inv, log)
	if !o.Layout && !o.Observe {
		return n, nil
	}
	if o.Observe {
		if n.Name, err = cfg.Node(); err != nil {
			return nil, err
		}
	}
	if n.Layout, err = layout.GPUs(LayoutOptions(cfg), inv, nil, log); err != nil {
		return nil, err
	}
	if o.Observe {
		err = observeNode(ctx, cfg, lib, n, o.QuietDRA, log)
	}
	return n, err
}

// observeNode fills in what the layout does not say of n.
func observeNode(ctx context.Context, cfg config.Config, lib nvml.Library, n *snapshot.Node, quietDRA bool, log *slog.Logger) error {
	inv := n.Inventory
	draLog := log
	if quietDRA {
		draLog = slog.New(debugOnly{log.Handler()})
	}
	dra, partitioned := partitions(cfg, lib, inv, log)
	st, err := pollHealth(cfg, lib, inv, n.Layout, partitioned, log)
	if err != nil {
		return err
	}
	holders := holdersOf(ctx, cfg, log)
	n.Hook = cdiHook(cfg)
	if cfg.RuntimeConfigRoot != "" {
		d := runtimes.Inspect(cfg.RuntimeConfigRoot)
		n.Door = &d
	}
	n.Labels = nodelabels.Of(LabelFacts(cfg), inv)
	// What DRA mode would publish: the same devices, with taints for the
	// unhealthy (without times: when a condition began is the running
	// plugin's to say). DRA publishes a MIG GPU's MIG devices, so theirs
	// are the reasons that count there.
	gpuCDIName := func(uuid string) string { return cdi.QualifiedName(cdi.GPUKind, uuid) }
	reasons := map[string]string{}
	for i, g := range inv.GPUs {
		healthy, reason := st.gpu(i)
		if partitioned[i] {
			// As the DRA front-end watches it: one part for every instance.
			healthy, reason = st.mig(g.UUID)
		}
		if !healthy {
			reasons[g.UUID] = reason
		}
		for _, m := range g.MIG {
			if healthy, reason := st.mig(m.UUID); !healthy {
				reasons[m.UUID] = reason
			}
		}
	}
	n.DRA = withTaints(draslice.GPUDevices(dra, cfg.SysfsRoot, gpuCDIName, draLog), reasons)
	// A unit's holders through the device-plugin API (any of its device
	// IDs under the resource it is served as) and through DRA.
	state := func(uuid, draName string, healthy bool, reason string) snapshot.State {
		sv, _ := n.Layout.Of(uuid)
		return snapshot.State{Healthy: healthy, Reason: reason, Served: sv, Sharing: sharingOf(sv.Unit),
			Holders: holders.Of(podresources.Names{Resource: sv.Resource, IDs: sv.IDs, Driver: config.DRADriverName, Pool: n.Name, DRADevice: draName})}
	}
	n.GPUs = make([]snapshot.GPU, 0, len(inv.GPUs))
	for i, g := range inv.GPUs {
		healthy, reason := st.gpu(i)
		sg := snapshot.GPU{Device: g, State: state(g.UUID, draslice.GPUDeviceName(g), healthy, reason), MIG: []snapshot.MIG{}}
		for _, m := range g.MIG {
			healthy, reason := st.mig(m.UUID)
			sg.MIG = append(sg.MIG, snapshot.MIG{Device: m, State: state(m.UUID, draslice.MIGDeviceName(g, m), healthy, reason)})
		}
		n.GPUs = append(n.GPUs, sg)
	}
	addMPS(cfg, n.GPUs, log)
	addRemediation(cfg, n.GPUs, time.Now(), log)
	// NICs come last: a sysfs without PCI devices (a container without
	// /sys mounted) must not hide the GPUs.
	heldNIC := func(pool, address string) []podresources.Holder {
		return holders.Of(podresources.Names{Resource: pool, IDs: []string{address}, Driver: config.DRADriverName, Pool: n.Name, DRADevice: draslice.NICDeviceName(address)})
	}
	if err := observeNICs(cfg, n, heldNIC, log, draLog); err != nil {
		log.Warn("NICs not listed", "err", err)
	}
	return nil
}

func sharingOf(u gpu.Unit) string {
	switch {
	case u.MPS:
		return snapshot.SharingMPS
	case u.Replicas > 1:
		return snapshot.SharingTimeSlicing
	}
	return ""
}

// cdiHook is the CDI hook as the GPU CDI spec would run it.
func cdiHook(cfg config.Config) snapshot.Hook {
	h := snapshot.Hook{Path: cfg.CDIHookPath, InUse: cfg.UsesCDI()}
	if h.Path != "" {
		if err := cdi.CheckHook(h.Path); err != nil {
			h.Problem = err.Error()
		} else {
			h.Installed = true
		}
	}
	return h
}

// observeNICs scans the NICs once and judges them as serve would, adds
// each pool to n's DRA preview and sets n's NICs. held says who holds a
// pooled NIC.
func observeNICs(cfg config.Config, n *snapshot.Node, held func(pool, address string) []podresources.Holder, log, draLog *slog.Logger) error {
	scan, updates, err := scanNICs(cfg, log)
	if err != nil {
		return err
	}
	type member struct {
		pool    string
		healthy bool
		reason  string
	}
	members := map[string]member{}
	for _, u := range updates {
		devs := draslice.NICDevices(draslice.NICPool{Name: u.Pool.Resource(), NICs: u.Pool.NICs()}, cfg.SysfsRoot, noCDIName, draLog)
		reasons := map[string]string{}
		for _, d := range u.Devices {
			if !d.Healthy {
				reasons[d.ID] = d.Reason
			}
		}
		n.DRA = append(n.DRA, withTaints(devs, reasons)...)
		for _, d := range u.Devices {
			m := member{pool: u.Pool.Resource(), healthy: true}
			if !d.Healthy {
				m.healthy, m.reason = false, d.Reason
			}
			members[d.ID] = m
		}
	}
	n.NICs = make([]snapshot.NIC, 0, len(scan))
	for _, s := range scan {
		m := members[s.Address]
		var holders []podresources.Holder
		if m.pool != "" {
			holders = held(m.pool, s.Address)
		}
		n.NICs = append(n.NICs, snapshot.NIC{Device: s, Pool: m.pool, Healthy: m.healthy, Reason: m.reason, Holders: holders})
	}
	return nil
}

// scanNICs scans the NICs once and folds them into cfg's pools.
func scanNICs(cfg config.Config, log *slog.Logger) ([]sysfs.NIC, []nic.Update, error) {
	scan, err := sysfs.NewNICScanner(sysfs.NICOptions{SysfsRoot: cfg.SysfsRoot, ProcRoot: cfg.ProcRoot, Log: log}).Scan()
	if err != nil {
		return nil, nil, fmt.Errorf("scanning NICs: %w", err)
	}
	pools, err := nic.NewPools(cfg.NICResources, nic.Options{DevRoot: cfg.DevRoot, Log: log})
	if err != nil {
		return nil, nil, err
	}
	return scan, pools.Rescan(scan), nil
}

// healthStates is one poll's health of the GPUs and their MIG devices.
type healthStates struct {
	// served watches as serve does: MIG devices the layout serves as
	// parts, every other GPU whole (so a MIG GPU served whole under
	// strategy none is Unhealthy, mig-enabled).
	served *health.Watcher
	// all has every MIG device as a part, as the DRA front-end watches
	// them; nil when served already does.
	all *health.Watcher
}

func (h healthStates) gpu(i int) (bool, string) { return h.served.State(i) }

func (h healthStates) mig(uuid string) (bool, string) {
	if healthy, reason, ok := h.served.PartState(uuid); ok || h.all == nil {
		return healthy, reason
	}
	healthy, reason, _ := h.all.PartState(uuid)
	return healthy, reason
}

// pollHealth polls once through the same policy serve uses; events need
// a watch over time, so a snapshot has what the polled state says now.
func pollHealth(cfg config.Config, lib nvml.Library, inv *nvml.Inventory, served *layout.Node, partitioned []bool, log *slog.Logger) (healthStates, error) {
	var every []servedUnit
	for i, g := range inv.GPUs {
		for j := range g.MIG {
			every = append(every, servedUnit{unit: gpu.Unit{GPU: g, Pos: i, MIG: &g.MIG[j]}})
		}
	}
	units := laidOutUnits(served.Units())
	parts := healthParts(units, len(inv.GPUs))
	all := withPartitioned(healthParts(every, len(inv.GPUs)), partitioned, inv.GPUs)
	count := func(parts [][]health.Part) (n int) {
		for _, p := range parts {
			n += len(p)
		}
		return n
	}
	poll := func(parts [][]health.Part, log *slog.Logger) (*health.Watcher, error) {
		w, err := health.NewWatcher(HealthPolicy(cfg), gpuUUIDs(inv.GPUs), nvml.NewMonitor(lib, inv, log), discard{}, nil, log, health.WithParts(parts))
		if err != nil {
			return nil, err
		}
		w.Poll()
		return w, nil
	}
	var h healthStates
	var err error
	if h.served, err = poll(parts, log); err != nil || count(parts) == count(all) {
		return h, err
	}
	// The second poll reads the same GPUs: its warnings would repeat.
	h.all, err = poll(all, slog.New(slog.DiscardHandler))
	return h, err
}

// partitions is what DRA mode publishes of the GPUs, with the GPUs
// sharing.migPartitions selects as every placement they allow (whoever
// made the instances on them: a snapshot does not read the claims), and
// which GPUs (by position) are partitioned. A GPU whose placements cannot
// be read is said and published as without the setting.
func partitions(cfg config.Config, lib nvml.Library, inv *nvml.Inventory, log *slog.Logger) (draslice.GPUs, []bool) {
	in := draslice.GPUsOf(inv, MemoryShares(cfg))
	partitioned := make([]bool, len(inv.GPUs))
	if !cfg.Sharing.MIGPartitions.Enabled {
		return in, partitioned
	}
	p, err := nvml.NewPartitioner(lib, log)
	if err != nil {
		log.Warn("sharing.migPartitions is set, and no GPU is partitioned", "err", err)
		return in, partitioned
	}
	in.Partitions = draslice.Partitions(inv.GPUs, MIGPartitioned(cfg), p.Layout, log)
	for i, g := range inv.GPUs {
		_, partitioned[i] = in.Partitions[g.UUID]
	}
	return in, partitioned
}

// addMPS asks the MPS control daemons of the GPUs shared through MPS,
// which the serving plugin runs, what they say of themselves; a healthy
// GPU whose daemon is down is Unhealthy, mps-daemon-down, as serve
// reports it. In DRA mode a GPU is shared through MPS while claims hold
// it: while its daemon's directory is there.
func addMPS(cfg config.Config, gpus []snapshot.GPU, log *slog.Logger) {
	var uuids []string
	for i, g := range gpus {
		if cfg.KubeletAPI == config.KubeletAPIDRA {
			if _, err := os.Stat(sharing.MPSDir(cfg.MPSRoot, g.Device.UUID, sharing.MPSPipe)); err == nil {
				gpus[i].Sharing = snapshot.SharingMPS
			}
		}
		if gpus[i].Sharing == snapshot.SharingMPS {
			uuids = append(uuids, g.Device.UUID)
		}
	}
	if len(uuids) == 0 {
		return
	}
	st, err := MPSStatus(cfg, uuids, log)
	if err != nil {
		log.Warn("MPS control daemons not asked", "err", err)
		return
	}
	for i, g := range gpus {
		s, ok := st[g.Device.UUID]
		if !ok {
			continue
		}
		gpus[i].MPS = &snapshot.MPS{Up: s.Up, Servers: s.Servers, Clients: s.Clients, Err: s.Err}
		if !s.Up && gpus[i].Healthy {
			// As serve has it: a GPU's shares are withheld while its
			// daemon is down.
			gpus[i].Healthy, gpus[i].Reason = false, mpsd.ReasonDown
		}
	}
}

// addRemediation gives each GPU its remediation as the running plugin
// saved it, read as the plugin reads it (this boot's file only). With
// remediation off the plugin neither reads nor acts on the file, so
// nothing is shown: a file it left would be stale.
func addRemediation(cfg config.Config, gpus []snapshot.GPU, now time.Time, log *slog.Logger) {
	if remediationOff(cfg) != "" {
		return
	}
	var saved remedy.Saved
	found, err := remediationStore(cfg).Load(&saved)
	if err != nil {
		log.Warn("GPU remediation not shown", "err", err)
	}
	if !found {
		return
	}
	for _, st := range saved.Status(RemediationPolicy(cfg).Window, now) {
		if st.State == remedy.StateServing && st.Resets == 0 {
			continue
		}
		for i := range gpus {
			if gpus[i].Device.UUID == st.GPU {
				gpus[i].Remediation = &st
			}
		}
	}
}

// holdersOf asks the kubelet who holds the devices. Holders are extra:
// without them (no kubelet here, or no access to its socket) the snapshot
// is complete but for them, with one note saying why.
func holdersOf(ctx context.Context, cfg config.Config, log *slog.Logger) podresources.Holders {
	if cfg.PodResourcesSocket == "" {
		return podresources.Holders{} // asked not to read any (off the node, say)
	}
	h, err := podresources.Client{Socket: cfg.PodResourcesSocket}.Holders(ctx)
	switch {
	case errors.Is(err, podresources.ErrUnavailable):
		log.Warn("kubelet PodResources API unavailable; device holders not shown", "socket", cfg.PodResourcesSocket, "setting", "podResourcesSocket (--pod-resources-socket)", "err", err)
	case err != nil:
		log.Warn("reading the kubelet PodResources API failed; device holders not shown", "socket", cfg.PodResourcesSocket, "setting", "podResourcesSocket (--pod-resources-socket)", "err", err)
	}
	return h
}

// noCDIName: NIC CDI names need the pool's scan state; a snapshot has the
// attributes, and CDI IDs appear only in Prepare's answers.
func noCDIName(string, string) string { return "" }

// withTaints gives each device whose model ID has a reason its taints.
func withTaints(devs []draslice.Device, reasons map[string]string) []draslice.Device {
	for i, d := range devs {
		if r, ok := reasons[d.ID]; ok {
			devs[i].Taints = draslice.TaintsOf(config.DRADriverName, r)
		}
	}
	return devs
}

// debugOnly logs every record at debug level.
type debugOnly struct{ slog.Handler }

func (h debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.Handler.Enabled(ctx, slog.LevelDebug)
}

func (h debugOnly) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return h.Handler.Handle(ctx, r)
}

func (h debugOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugOnly{h.Handler.WithAttrs(attrs)}
}

func (h debugOnly) WithGroup(name string) slog.Handler { return debugOnly{h.Handler.WithGroup(name)} }

// discard takes health transitions nobody serves.
type discard struct{}

func (discard) SetHealth(string, bool, string) bool { return false }

// CDISpecs are the CDI specs of n's GPUs, as serve writes them, and, with
// NIC pools set, of each pool as a fresh scan fills it.
func CDISpecs(cfg config.Config, n *snapshot.Node, log *slog.Logger) ([]*specs.Spec, error) {
	gpuSpec, err := ondisk.GPUSpec(CDIOptions(cfg), n.Inventory.GPUs, log)
	if err != nil {
		return nil, fmt.Errorf("building the %s CDI spec: %w", resname.GPU, err)
	}
	all := []*specs.Spec{gpuSpec}
	if len(cfg.NICResources) == 0 {
		return all, nil
	}
	_, updates, err := scanNICs(cfg, log)
	if err != nil {
		return nil, err
	}
	for _, u := range updates {
		spec, err := u.Pool.CDISpec()
		if err != nil {
			return nil, fmt.Errorf("building the %s CDI spec: %w", u.Pool.Resource(), err)
		}
		if spec != nil {
			all = append(all, spec)
		}
	}
	return all, nil
}

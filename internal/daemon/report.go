package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// reporting carries device health to the API server (cfg.Events,
// cfg.NodeCondition): the GPU front-end's notifier and the NIC scans feed
// a report.Reporter, which sends on its own goroutine.
type reporting struct {
	rep     *report.Reporter
	holders *podHolders

	// The NIC scans' state; nicScan runs on the rescan goroutine only.
	nicIDs  map[*nic.Pool]map[string]bool
	nicSeen bool
}

// newReporting is nil when neither events nor nodeCondition is on; api
// is then not nil (newAPIAccess).
func newReporting(cfg config.Config, api *apiAccess, log *slog.Logger) (*reporting, error) {
	if !cfg.Events && !cfg.NodeCondition {
		return nil, nil
	}
	client, node := api.client, api.node
	h := &podHolders{client: podresources.Client{Socket: cfg.PodResourcesSocket}, pool: node, dra: map[string]string{}, log: log}
	if cfg.KubeletAPI != config.KubeletAPIDRA && cfg.DevicePluginDir != "" {
		h.checkpoint = filepath.Join(cfg.DevicePluginDir, podresources.CheckpointFile)
	}
	var holders report.Holders = h
	if cfg.PodResourcesSocket == "" {
		holders = nil // Events go to the Node only
	}
	rep, err := report.New(client, report.Options{
		Node:          node,
		Events:        cfg.Events,
		NodeCondition: cfg.NodeCondition,
		NICs:          len(cfg.NICResources) > 0,
		Holders:       holders,
		Log:           log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("reporting device health to the API server", "node", node, "events", cfg.Events, "nodeCondition", cfg.NodeCondition, "server", api.server)
	return &reporting{rep: rep, holders: h, nicIDs: map[*nic.Pool]map[string]bool{}}, nil
}

func (r *reporting) run(ctx context.Context) { _ = r.rep.Run(ctx) }

// takeGPUs registers every unit (whole GPU or MIG device), healthy until
// the watcher says otherwise, so the condition can count them, and has
// their health reported after next, the front-end's notifier.
func (r *reporting) takeGPUs(units []servedUnit, next health.Notifier) health.Notifier {
	labels := make(map[string]string, len(units))
	for _, su := range units {
		u := su.unit
		id := u.UUID()
		labels[id] = fmt.Sprintf("%s (index %d)", id, u.GPU.Index)
		if u.MIG != nil {
			labels[id] = fmt.Sprintf("%s (%s)", id, u.Describe())
		}
		r.holders.setUnit(id, su.draName, su.resource, su.ids)
		r.rep.Transition(resname.GPU, id, labels[id], true, "")
	}
	return reportingNotifier{next, labels, r.rep}
}

// reportingNotifier tells the front-end first (the kubelet must hear at
// once), then the reporter, which never blocks.
type reportingNotifier struct {
	next   health.Notifier
	labels map[string]string
	rep    *report.Reporter
}

func (n reportingNotifier) SetHealth(id string, healthy bool, reason string) bool {
	changed := n.next.SetHealth(id, healthy, reason)
	n.rep.Transition(resname.GPU, id, n.labels[id], healthy, reason)
	return changed
}

// nicScan reports every pool's devices after a successful scan: each
// device's health (the reporter keeps changes only), and NICs that left
// their pool as gone.
func (r *reporting) nicScan(updates []nic.Update) {
	for _, u := range updates {
		res := u.Pool.Resource()
		ids := make(map[string]bool, len(u.Devices))
		for _, d := range u.Devices {
			ids[d.ID] = true
			r.rep.Transition(res, d.ID, d.ID, d.Healthy, d.Reason)
		}
		for id := range r.nicIDs[u.Pool] {
			if !ids[id] {
				r.rep.Forget(res, id)
			}
		}
		r.nicIDs[u.Pool] = ids
	}
	if !r.nicSeen {
		r.nicSeen = true
		r.rep.Synced(report.NIC)
	}
}

// podHolders finds the pods holding a device through the kubelet's
// PodResources API: by device ID (device-plugin API), and by its name in
// this node's pool (DRA).
type podHolders struct {
	client podresources.Client
	pool   string
	log    *slog.Logger
	// checkpoint is the kubelet device manager's checkpoint (device-plugin
	// mode), for the holders' pod UIDs; "" reads none.
	checkpoint string
	// draPodUID is a pod's UID from the reservations of the DRA claims the
	// front-end prepared (DRA mode); nil without.
	draPodUID func(namespace, name string) string

	mu  sync.Mutex
	dra map[string]string // resource + "/" + id: a GPU's DRA device name
	// served maps a GPU unit's UUID to the resource and device IDs the
	// kubelet knows it by (replicas of a shared GPU, a MIG profile's
	// resource).
	served map[string]layout.Served
	last   podresources.Holders
	cp     podresources.Checkpoint
	at     time.Time
	// cpLogged: a checkpoint that could not be read was logged.
	cpLogged bool
}

// holdersFresh is how long one List answers for: a burst of transitions
// (every GPU at an NVML failure) asks the kubelet once.
const holdersFresh = time.Second

// setUnit records how GPU unit uuid is served.
func (h *podHolders) setUnit(uuid, draName, resource string, ids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dra[resname.GPU+"/"+uuid] = draName
	if h.served == nil {
		h.served = map[string]layout.Served{}
	}
	h.served[uuid] = layout.Served{Resource: resource, IDs: ids}
}

// HoldersOf implements report.Holders.
func (h *podHolders) HoldersOf(ctx context.Context, resource, id string) ([]report.Pod, error) {
	h.mu.Lock()
	all, at := h.last, h.at
	draName, ok := h.dra[resource+"/"+id]
	as, isUnit := h.served[id]
	h.mu.Unlock()
	if !ok && resource != resname.GPU {
		draName = draslice.NICDeviceName(id)
	}
	h.mu.Lock()
	cp := h.cp
	h.mu.Unlock()
	if at.IsZero() || time.Since(at) > holdersFresh {
		var err error
		if all, err = h.client.Holders(ctx); err != nil {
			return nil, fmt.Errorf("pods holding %s %s: %w", resource, id, err)
		}
		cp = h.readCheckpoint()
		h.mu.Lock()
		h.last, h.cp, h.at = all, cp, time.Now()
		h.mu.Unlock()
	}
	names := podresources.Names{Resource: resource, IDs: []string{id}, Driver: config.DRADriverName, Pool: h.pool, DRADevice: draName}
	list := all.Of(names)
	if isUnit && resource == resname.GPU {
		// A GPU unit is also known by its replicas' IDs under the resource it is served as.
		list = podresources.Merge(list, all.Of(podresources.Names{Resource: as.Resource, IDs: as.IDs}))
	}
	var pods []report.Pod
	for _, c := range list {
		uid := cp.PodUID(c.Container, all.DevicesOf(c))
		if uid == "" && h.draPodUID != nil {
			uid = h.draPodUID(c.Namespace, c.Pod)
		}
		p := report.Pod{Namespace: c.Namespace, Name: c.Pod, UID: uid}
		if n := len(pods); n > 0 && pods[n-1].Namespace == p.Namespace && pods[n-1].Name == p.Name {
			if pods[n-1].UID == "" {
				pods[n-1].UID = uid
			}
			continue
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// readCheckpoint reads the kubelet's device checkpoint; one that cannot be
// read is logged once and taken as empty: Events then go without pod UIDs.
func (h *podHolders) readCheckpoint() podresources.Checkpoint {
	if h.checkpoint == "" {
		return podresources.Checkpoint{}
	}
	cp, err := podresources.ReadCheckpoint(h.checkpoint)
	if err != nil {
		h.mu.Lock()
		logged := h.cpLogged
		h.cpLogged = true
		h.mu.Unlock()
		if !logged {
			h.log.Warn("cannot read the kubelet's device checkpoint for the UIDs of the pods holding a device; their Events go without them (logged once)",
				"path", h.checkpoint, "err", err)
		}
	}
	return cp
}

// useDRAPodUIDs takes pod UIDs from the DRA front-end; called before
// reporting runs.
func (h *podHolders) useDRAPodUIDs(f func(namespace, name string) string) { h.draPodUID = f }

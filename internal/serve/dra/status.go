package dra

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// The claim's status.devices entries of this driver (docs/dra.md, Device
// status in the claim).
//
// After Prepare, each prepared claim gets one entry per device of ours,
// written by server-side apply of the status subresource under the
// plugin's field manager: the apply names only our entries, so other drivers'
// entries and every other field of the claim stay as they are. Nothing is
// cleared at Unprepare: the claim is deallocated (or deleted) once no pod
// holds it, and the API server drops the entries of devices no longer
// allocated along with the allocation (resourceclaim status strategy,
// dropDeallocatedStatusDevices).
const (
	// ConditionReady is True on every prepared device: its CDI devices
	// were handed to the kubelet and the container can start with it.
	ConditionReady = "Ready"
	ReasonPrepared = "Prepared"
	// ConditionHealthy is written only for a device that was unhealthy
	// when prepared (the claim tolerated its taint): False, with the
	// health reason spelled out. It is not kept up to date afterwards;
	// live health is the pod's allocatedResourcesStatus and the slice's
	// taints. Ready stays True: the container starts with the device.
	ConditionHealthy = "Healthy"
	ReasonUnhealthy  = "Unhealthy"
)

// statusWriteTimeout bounds the status writes of one Prepare call, all
// claims together: a slow API server delays the pods' start by at most
// this much, and never fails it.
const statusWriteTimeout = 5 * time.Second

// ClaimStatuses writes a claim's status.devices entries of this driver;
// apiClaims does it through the API server.
type ClaimStatuses interface {
	ApplyDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error
}

// deviceStatusData is an entry's data: what identifies the device on the
// node, keys as docs/dra.md documents them.
type deviceStatusData struct {
	// PCIBusID is the device's PCI address (a GPU's, a MIG device's
	// parent's, a NIC's), as the resource.kubernetes.io/pciBusID attribute.
	PCIBusID string `json:"pciBusID,omitempty"`
	// UUID is a GPU's or MIG device's UUID; for a MIG instance made for
	// the claim, the instance's.
	UUID string `json:"uuid,omitempty"`
}

// statusDevice is what one entry is made of, read under the driver's lock.
type statusDevice struct {
	key       resourceapi.AllocatedDeviceStatus // driver, pool, device, shareID
	typ       string
	id        string // the model's ID: a NIC's PCI address
	data      deviceStatusData
	unhealthy string // the health message; "" when healthy
}

// statusPlan is one prepared claim's entries to write.
type statusPlan struct {
	claim   *resourceapi.ResourceClaim
	devices []statusDevice
}

// statusLog remembers the claims whose status write failed and was
// logged, so a claim prepared again is not logged again until a write
// for it succeeds.
type statusLog struct {
	mu     sync.Mutex
	failed map[types.UID]bool
}

// writeClaimStatus writes the status entries of the claims out says were
// prepared, outside the driver's lock and within statusWriteTimeout. A
// claim whose entries are already what they would be is not written: the
// kubelet prepares a claim again at every pod start. A failure is logged
// and changes nothing else: the pod runs without the status.
func (d *Driver) writeClaimStatus(ctx context.Context, claims []*resourceapi.ResourceClaim, out map[types.UID]kubelet.PrepareResult) {
	if d.o.ClaimStatus == nil {
		return
	}
	plans := d.statusPlans(claims, out)
	if len(plans) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d.statusTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range plans {
		wg.Go(func() { d.writeStatus(ctx, p) })
	}
	wg.Wait()
}

// statusPlans reads, under the lock, what the entries of each prepared
// claim are made of, and forgets the logged failures of claims no longer
// prepared.
func (d *Driver) statusPlans(claims []*resourceapi.ResourceClaim, out map[types.UID]kubelet.PrepareResult) []statusPlan {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.statusLog.mu.Lock()
	for uid := range d.statusLog.failed {
		if _, ok := d.cp.Claims[uid]; !ok {
			delete(d.statusLog.failed, uid)
		}
	}
	d.statusLog.mu.Unlock()
	var plans []statusPlan
	for _, c := range claims {
		r, ok := out[c.UID]
		if !ok || r.Err != nil || len(r.Devices) == 0 {
			continue
		}
		p := statusPlan{claim: c}
		prepared := d.cp.Claims[c.UID]
		for _, dv := range r.Devices {
			sd := statusDevice{key: resourceapi.AllocatedDeviceStatus{Driver: d.o.DriverName, Pool: dv.PoolName, Device: dv.DeviceName}}
			if dv.ShareID != nil {
				s := string(*dv.ShareID)
				sd.key.ShareID = &s
			}
			if e := d.byName[dv.DeviceName]; e != nil {
				sd.typ, sd.id = e.Type, e.ID
				sd.data = deviceStatusData{PCIBusID: attrString(e, draslice.AttrPCIBusID)}
				if e.Type != draslice.TypeNIC {
					sd.data.UUID = attrString(e, "uuid")
				}
				// A MIG instance made for the claim (a placement) has its
				// UUID in the checkpoint, not in the slice.
				for _, pd := range prepared.Devices {
					if pd.Device == dv.DeviceName && pd.MIG != nil && pd.MIG.UUID != "" {
						sd.data.UUID = pd.MIG.UUID
					}
				}
				if h := d.health[e.ID]; h != nil && !h.healthy {
					sd.unhealthy = h.reason
					if e.Type == draslice.TypeGPU || e.Type == draslice.TypeMIG {
						sd.unhealthy = health.Describe(h.reason)
					}
				}
			}
			p.devices = append(p.devices, sd)
		}
		plans = append(plans, p)
	}
	return plans
}

func attrString(e *draslice.Device, name string) string {
	if a, ok := e.Attributes[name]; ok && a.String != nil {
		return *a.String
	}
	return ""
}

// writeStatus writes one claim's entries unless the claim carries them
// already.
func (d *Driver) writeStatus(ctx context.Context, p statusPlan) {
	c := p.claim
	log := d.o.Log.With("claim", c.Namespace+"/"+c.Name, "uid", c.UID)
	have := d.ourEntries(c)
	want := make([]resourceapi.AllocatedDeviceStatus, 0, len(p.devices))
	now := metav1.NewTime(d.o.Now().Truncate(time.Second))
	for _, sd := range p.devices {
		want = append(want, d.entry(sd, have, now, log))
	}
	sortEntries(want)
	if apiequality.Semantic.DeepEqual(want, have) {
		return
	}
	start := time.Now()
	err := d.o.ClaimStatus.ApplyDeviceStatus(ctx, c, want)
	d.statusLog.mu.Lock()
	first := !d.statusLog.failed[c.UID]
	if err != nil {
		d.statusLog.failed[c.UID] = true
	} else {
		delete(d.statusLog.failed, c.UID)
	}
	d.statusLog.mu.Unlock()
	switch {
	case err == nil:
		log.Debug("claim status written", "devices", len(want), "took", time.Since(start))
	case first:
		// Said once per claim: the kubelet prepares it again at each pod
		// start, and a later success or Unprepare resets this.
		args := []any{"devices", len(want), "took", time.Since(start), "err", err}
		if refused(err) {
			args = append(args, "fix", "grant resourceclaims/status patch, and resourceclaims/driver associated-node:patch for "+d.o.DriverName+" (docs/security.md)")
		}
		log.Warn("writing the claim's device status failed; its pods run without it", args...)
	}
}

// entry is the status entry of one device: Ready, Healthy when it was
// unhealthy, data, and for a NIC its interface as it is now. A condition
// whose status is what the claim has keeps its lastTransitionTime.
func (d *Driver) entry(sd statusDevice, have []resourceapi.AllocatedDeviceStatus, now metav1.Time, log *slog.Logger) resourceapi.AllocatedDeviceStatus {
	e := sd.key
	e.Conditions = []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPrepared, Message: "prepared on node " + d.o.NodeName, LastTransitionTime: now}}
	if sd.unhealthy != "" {
		e.Conditions = append(e.Conditions, metav1.Condition{Type: ConditionHealthy, Status: metav1.ConditionFalse, Reason: ReasonUnhealthy, Message: "when prepared: " + sd.unhealthy, LastTransitionTime: now})
	}
	if i := slices.IndexFunc(have, func(h resourceapi.AllocatedDeviceStatus) bool { return sameEntry(h, e) }); i >= 0 {
		for j := range e.Conditions {
			for _, old := range have[i].Conditions {
				if old.Type == e.Conditions[j].Type && old.Status == e.Conditions[j].Status {
					e.Conditions[j].LastTransitionTime = old.LastTransitionTime
				}
			}
		}
	}
	if sd.data != (deviceStatusData{}) {
		b, err := json.Marshal(sd.data)
		if err == nil {
			e.Data = &runtime.RawExtension{Raw: b}
		}
	}
	if sd.typ == draslice.TypeNIC {
		nd, err := sysfs.FirstNetdev(d.o.SysfsRoot, sd.id)
		switch {
		case errors.Is(err, sysfs.ErrNoNetdev):
			log.Info("the claim's NIC has no network interface in the host's namespace now; its status carries no networkData", "device", sd.key.Device, "err", err)
		case err != nil:
			log.Info("the claim's NIC status carries no hardwareAddress", "device", sd.key.Device, "err", err)
		}
		if nd.Name != "" {
			e.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: nd.Name, HardwareAddress: nd.HardwareAddress}
		}
	}
	return e
}

// ourEntries are c's status entries of this driver and node, sorted.
func (d *Driver) ourEntries(c *resourceapi.ResourceClaim) []resourceapi.AllocatedDeviceStatus {
	out := []resourceapi.AllocatedDeviceStatus{}
	for _, e := range c.Status.Devices {
		if e.Driver == d.o.DriverName && e.Pool == d.o.NodeName {
			out = append(out, e)
		}
	}
	sortEntries(out)
	return out
}

func sameEntry(a, b resourceapi.AllocatedDeviceStatus) bool {
	return a.Driver == b.Driver && a.Pool == b.Pool && a.Device == b.Device && shareOf(a) == shareOf(b)
}

func shareOf(e resourceapi.AllocatedDeviceStatus) string {
	if e.ShareID == nil {
		return ""
	}
	return *e.ShareID
}

func sortEntries(es []resourceapi.AllocatedDeviceStatus) {
	slices.SortFunc(es, func(a, b resourceapi.AllocatedDeviceStatus) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device), cmp.Compare(shareOf(a), shareOf(b)))
	})
}

// ApplyDeviceStatus applies devices as the claim's status.devices entries
// of a.manager: one PATCH of the status subresource (RBAC:
// resourceclaims/status patch, and resourceclaims/driver
// associated-node:patch for the driver's name). The claim's UID is part of
// the apply, so a claim deleted and made again under the same name is not
// written.
func (a apiClaims) ApplyDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error {
	st := claimStatusApply{Devices: make([]deviceStatusApply, 0, len(devices))}
	for _, s := range devices {
		st.Devices = append(st.Devices, deviceStatusOf(s))
	}
	return a.api.ApplyClaimStatus(ctx, claim.Namespace, claim.Name, claim.UID, st)
}

// claimStatusApply is the status an apply sends: only the fields this
// driver owns, each named, so the apply takes no others.
type claimStatusApply struct {
	Devices []deviceStatusApply `json:"devices"`
}

type deviceStatusApply struct {
	Driver      string                `json:"driver"`
	Pool        string                `json:"pool"`
	Device      string                `json:"device"`
	ShareID     *string               `json:"shareID,omitempty"`
	Conditions  []conditionApply      `json:"conditions,omitempty"`
	Data        *runtime.RawExtension `json:"data,omitempty"`
	NetworkData *networkDataApply     `json:"networkData,omitempty"`
}

type conditionApply struct {
	Type               string                 `json:"type"`
	Status             metav1.ConditionStatus `json:"status"`
	Reason             string                 `json:"reason"`
	Message            string                 `json:"message"`
	LastTransitionTime metav1.Time            `json:"lastTransitionTime"`
}

type networkDataApply struct {
	InterfaceName   string `json:"interfaceName,omitempty"`
	HardwareAddress string `json:"hardwareAddress,omitempty"`
}

func deviceStatusOf(s resourceapi.AllocatedDeviceStatus) deviceStatusApply {
	out := deviceStatusApply{Driver: s.Driver, Pool: s.Pool, Device: s.Device, ShareID: s.ShareID, Data: s.Data}
	for _, c := range s.Conditions {
		out.Conditions = append(out.Conditions, conditionApply{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, LastTransitionTime: c.LastTransitionTime})
	}
	if n := s.NetworkData; n != nil {
		out.NetworkData = &networkDataApply{InterfaceName: n.InterfaceName, HardwareAddress: n.HardwareAddress}
	}
	return out
}

// refused says the API server turned the write down for want of access:
// RBAC on resourceclaims/status (403), or its per-driver check of
// status.devices on resourceclaims/driver, which comes back as an invalid
// claim (422) with a Forbidden cause.
func refused(err error) bool {
	if apierrors.IsForbidden(err) {
		return true
	}
	var st apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &st) || st.Status().Details == nil {
		return false
	}
	for _, c := range st.Status().Details.Causes {
		if c.Type == metav1.CauseTypeForbidden {
			return true
		}
	}
	return false
}

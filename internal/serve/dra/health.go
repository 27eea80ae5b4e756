package dra

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
)

// devHealth is one device's health as last reported by the model.
type devHealth struct {
	healthy bool
	reason  string
	since   time.Time
	taints  []draslice.Taint
}

// SetHealth records a GPU's or MIG device's health (by its UUID, which is
// the device's model ID) and, on a change, wakes the health streams at
// once and publishes its taints, debounced (schedulePublish). It is
// health.Notifier. The health of a MIG-enabled GPU itself reaches no
// device: it is published as its MIG devices.
func (d *Driver) SetHealth(uuid string, healthy bool, reason string) bool {
	d.mu.Lock()
	changed := d.setHealthLocked(uuid, healthy, reason)
	d.mu.Unlock()
	if changed {
		d.schedulePublish()
	}
	return changed
}

func (d *Driver) setHealthLocked(id string, healthy bool, reason string) bool {
	h := d.health[id]
	if h == nil {
		h = &devHealth{healthy: true}
		d.health[id] = h
	}
	if h.healthy == healthy && h.reason == reason {
		return false
	}
	now := d.o.Now()
	var ts []draslice.Taint
	if !healthy {
		ts = draslice.TaintsOf(d.o.DriverName, reason)
	}
	h.healthy, h.reason, h.since, h.taints = healthy, reason, now, draslice.Stamp(ts, h.taints, now)
	close(d.changed)
	d.changed = make(chan struct{})
	return true
}

// Evict makes the taints of the GPU with uuid, and of its MIG devices and
// placements, NoExecute while on: Kubernetes' device-taint eviction then
// evicts the pods whose claims allocate them, honouring their
// tolerations. The remediation asks it, after the grace period; the
// plugin itself evicts nothing.
func (d *Driver) Evict(uuid string, on bool) {
	d.mu.Lock()
	if d.evict[uuid] == on {
		d.mu.Unlock()
		return
	}
	if on {
		d.evict[uuid] = true
	} else {
		delete(d.evict, uuid)
	}
	d.mu.Unlock()
	d.schedulePublish()
}

// gpuOf is the UUID of the GPU a device is (of): its own ID, or a MIG
// device's parent's.
func gpuOf(e draslice.Device) string {
	if a, ok := e.Attributes["parentUUID"]; ok && a.String != nil {
		return *a.String
	}
	return e.ID
}

// WatchHealthStatus sends every device's health now, at every change, and
// at least every HealthResend, until ctx ends. The message is the reason,
// spelled out (xid=79: fallen off the bus).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubelet.DeviceHealthReport) error {
	for {
		d.mu.Lock()
		rep, changed := d.healthReportLocked(), d.changed
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- rep:
		}
		t := time.NewTimer(d.o.HealthResend)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

func (d *Driver) healthReportLocked() kubelet.DeviceHealthReport {
	var rep kubelet.DeviceHealthReport
	add := func(es []draslice.Device) {
		for _, e := range es {
			dh := kubelet.DeviceHealth{
				PoolName: d.o.NodeName, DeviceName: e.Name, Health: kubelet.HealthStatusHealthy,
				HealthCheckTimeout: d.o.HealthTimeout,
			}
			if h := d.health[e.ID]; h != nil {
				dh.LastUpdated = h.since
				if !h.healthy {
					dh.Health = kubelet.HealthStatusUnhealthy
					dh.Message = h.reason
					if e.Type == draslice.TypeGPU || e.Type == draslice.TypeMIG {
						dh.Message = health.Describe(h.reason)
					}
				}
			}
			rep.Devices = append(rep.Devices, dh)
		}
	}
	add(d.gpus)
	for _, pool := range slices.Sorted(maps.Keys(d.nics)) {
		add(d.nics[pool])
	}
	return rep
}

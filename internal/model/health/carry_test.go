package health

import (
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// relaidOut builds the Watcher for a new layout of migWatcher's GPUs, GPU
// 0's MIG devices now parts, from the stopped Watcher w.
func relaidOut(t *testing.T, w *Watcher, s *fakeSampler, c *clock, parts []Part) (*Watcher, *recorder) {
	t.Helper()
	r := &recorder{}
	next, err := NewWatcher(policy.Default(), []string{"GPU-0", "GPU-1"}, s, r, nil, nil, WithParts([][]Part{parts}), WithCarried(w.Carry()))
	if err != nil {
		t.Fatal(err)
	}
	next.now = c.now
	return next, r
}

func TestCarriedAcrossARelayout(t *testing.T) {
	w, s, r, c := migWatcher(t)
	w.Poll()
	// A transient XID on MIG-b's instance, a sticky one on the whole GPU 1.
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 61, MIG: &nvml.Instance{GPUInstance: 1, ComputeInstance: 1}})
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 79})
	expect(t, r.take(), change{"MIG-b", false, "xid=61"}, change{"GPU-1", false, "xid=79"})

	// MIG-a and MIG-c destroyed, MIG-d created: MIG-b and GPU 1 keep what
	// the kubelet was told, and MIG-d is reported from ReasonRelaidOut.
	next, r2 := relaidOut(t, w, s, c, []Part{{ID: "MIG-b", GPUInstance: 1, ComputeInstance: 1}, {ID: "MIG-d", GPUInstance: 3}})
	expect(t, r2.take(), change{"MIG-d", true, ""})
	if h, reason, _ := next.PartState("MIG-b"); h || reason != "xid=61" {
		t.Errorf("MIG-b = %v %q, want the transient XID carried", h, reason)
	}
	if got := next.Sticky(); len(got) != 1 || got[0].Device != "GPU-1" || got[0].XID != 79 {
		t.Errorf("sticky = %+v, want GPU-1's XID 79", got)
	}
	next.Poll()
	expect(t, r2.take())
	// The transient XID still expires when it would have.
	c.t = c.t.Add(time.Hour)
	next.Poll()
	expect(t, r2.take(), change{"MIG-b", true, ""})
}

func TestNewMIGDeviceStartsFromItsGPU(t *testing.T) {
	w, s, r, c := migWatcher(t)
	w.Poll()
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	expect(t, r.take(), change{"MIG-a", false, "xid=79"}, change{"MIG-b", false, "xid=79"}, change{"MIG-c", false, "xid=79"})
	next, r2 := relaidOut(t, w, s, c, []Part{{ID: "MIG-a", GPUInstance: 1}, {ID: "MIG-d", GPUInstance: 3}})
	expect(t, r2.take(), change{"MIG-d", false, "xid=79"})
	next.Poll()
	expect(t, r2.take())
}

func TestMIGTurnedOffServesTheGPUFromItsConditions(t *testing.T) {
	w, s, r, c := migWatcher(t)
	w.Poll()
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	r.take()
	s.set(0, func(x *nvml.Sample) { x.MIGEnabled = false })
	next, r2 := relaidOut(t, w, s, c, nil)
	expect(t, r2.take(), change{"GPU-0", false, "xid=79"})
	next.Poll()
	expect(t, r2.take())
}

package health

import (
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// migWatcher watches two GPUs: GPU 0 in MIG mode with three MIG devices
// (GPU instance 1 with compute instances 0 and 1, GPU instance 2 with 0),
// GPU 1 whole.
func migWatcher(t *testing.T, opts ...Option) (*Watcher, *fakeSampler, *recorder, *clock) {
	t.Helper()
	s, r := newSampler(2), &recorder{}
	s.set(0, func(x *nvml.Sample) { x.MIGEnabled = true })
	parts := [][]Part{{{ID: "MIG-a", GPUInstance: 1, ComputeInstance: 0}, {ID: "MIG-b", GPUInstance: 1, ComputeInstance: 1}, {ID: "MIG-c", GPUInstance: 2, ComputeInstance: 0}}}
	w, err := NewWatcher(policy.Default(), []string{"GPU-0", "GPU-1"}, s, r, nil, nil, append(opts, WithParts(parts))...)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_000_000, 0)}
	w.now = c.now
	return w, s, r, c
}

func TestPartsReportInsteadOfTheirGPU(t *testing.T) {
	w, _, r, _ := migWatcher(t)
	// MIG mode is how the GPU is served here, not a fault.
	w.Poll()
	expect(t, r.take())
	// An XID naming no instance hits every MIG device of the GPU.
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79})
	expect(t, r.take(),
		change{"MIG-a", false, "xid=79"}, change{"MIG-b", false, "xid=79"}, change{"MIG-c", false, "xid=79"})
}

func TestXIDOnAnInstanceHitsOnlyIt(t *testing.T) {
	w, _, r, c := migWatcher(t)
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 43}) // ignored by default
	expect(t, r.take())
	// A compute instance: only that MIG device.
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 61, MIG: &nvml.Instance{GPUInstance: 1, ComputeInstance: 1}})
	expect(t, r.take(), change{"MIG-b", false, "xid=61"})
	// A GPU instance without a compute instance: all of its compute
	// instances, and not the other GPU instance.
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79, MIG: &nvml.Instance{GPUInstance: 1, ComputeInstance: -1}})
	expect(t, r.take(), change{"MIG-a", false, "xid=79"}, change{"MIG-b", false, "xid=79"})
	// An instance not served changes nothing.
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79, MIG: &nvml.Instance{GPUInstance: 9, ComputeInstance: -1}})
	expect(t, r.take())
	// The transient XID 61 was overtaken by the sticky 79 on MIG-b: it
	// stays after the recovery period, as on a whole GPU.
	c.t = c.t.Add(time.Hour)
	w.Poll()
	expect(t, r.take())
	sticky := w.Sticky()
	if len(sticky) != 2 || sticky[0].Device != "MIG-a" || sticky[1].Device != "MIG-b" || sticky[0].XID != 79 {
		t.Fatalf("sticky = %+v", sticky)
	}
}

func TestLostParentTakesAllItsParts(t *testing.T) {
	w, s, r, _ := migWatcher(t)
	s.set(0, func(x *nvml.Sample) { x.Lost, x.Failed, x.Err = true, nvml.AllSignals, gonvml.ERROR_GPU_IS_LOST })
	w.Poll()
	expect(t, r.take(),
		change{"MIG-a", false, "gpu-lost"}, change{"MIG-b", false, "gpu-lost"}, change{"MIG-c", false, "gpu-lost"})
}

func TestPartStickyRestoredAndClearedByTheDriver(t *testing.T) {
	saved := []StickyCondition{{Device: "MIG-c", Kind: StickyXID, XID: 79, Since: time.Unix(5, 0)}}
	w, _, r, _ := migWatcher(t, WithSticky(saved))
	expect(t, r.take(), change{"MIG-c", false, "xid=79"})
	// The driver asks for a reset, then reports none: the GPU was reset.
	w.applyRecovery(0, nvml.RecoveryReset)
	w.publish(0)
	r.take()
	w.applyRecovery(0, nvml.RecoveryNone)
	w.publish(0)
	expect(t, r.take(), change{"MIG-a", true, ""}, change{"MIG-b", true, ""}, change{"MIG-c", true, ""})
}

// A GPU partitioned on demand reports as one part standing for every
// instance: MIG mode is no fault there, and an XID on any instance, or on
// the GPU, reaches it.
func TestAnyInstancePart(t *testing.T) {
	s, r := newSampler(1), &recorder{}
	s.set(0, func(x *nvml.Sample) { x.MIGEnabled = true })
	w, err := NewWatcher(policy.Default(), []string{"GPU-0"}, s, r, nil, nil, WithParts([][]Part{{{ID: "GPU-0", GPUInstance: AnyInstance}}}))
	if err != nil {
		t.Fatal(err)
	}
	w.now = (&clock{t: time.Unix(1_000_000, 0)}).now
	w.Poll()
	expect(t, r.take())
	w.Event(nvml.Event{GPU: 0, Kind: nvml.EventXID, XID: 79, MIG: &nvml.Instance{GPUInstance: 5, ComputeInstance: 0}})
	expect(t, r.take(), change{"GPU-0", false, "xid=79"})
}

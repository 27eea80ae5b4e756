package dra

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/kubelet"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// BenchmarkPrepare is one claim's Prepare and Unprepare for 1 and 8 GPUs:
// the checkpoint written durably (fsync) twice, in the test's directory.
func BenchmarkPrepare(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			d, err := New(Options{
				DriverName: testDriver, NodeName: testNode, SysfsRoot: b.TempDir(),
				CheckpointPath: b.TempDir() + "/checkpoint.json",
				GPUCDIID:       func(uuid string) string { return "gpu-device-plugin.github.io/gpu=" + uuid },
				NICCDIID:       func(string, string) string { return "" },
				Specs:          &testSpecs{},
			})
			if err != nil {
				b.Fatal(err)
			}
			in := draslice.GPUs{DriverVersion: "580.65.06"}
			var results []resourceapi.DeviceRequestAllocationResult
			for i := range 8 {
				in.GPUs = append(in.GPUs, nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), PCIBusID: fmt.Sprintf("0000:%02x:00.0", i+1), NUMANode: -1})
				if i < n {
					results = append(results, result("gpus", fmt.Sprintf("gpu-%d", i)))
				}
			}
			ctx := context.Background()
			d.SetGPUs(ctx, in)
			c := claim("uid", "bench", results...)
			claims := []*resourceapi.ResourceClaim{c}
			objs := []kubelet.NamespacedObject{{UID: types.UID("uid")}}
			b.ReportAllocs()
			for b.Loop() {
				got, err := d.PrepareResourceClaims(ctx, claims)
				if err != nil || got["uid"].Err != nil || len(got["uid"].Devices) != n {
					b.Fatalf("Prepare: %v %+v", err, got)
				}
				if _, err := d.UnprepareResourceClaims(ctx, objs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPrepareAgain is the kubelet asking again for a claim already
// prepared (after its restart): answered from memory, nothing written.
func BenchmarkPrepareAgain(b *testing.B) {
	d, err := New(Options{
		DriverName: testDriver, NodeName: testNode, SysfsRoot: b.TempDir(),
		CheckpointPath: b.TempDir() + "/checkpoint.json",
		GPUCDIID:       func(uuid string) string { return "gpu-device-plugin.github.io/gpu=" + uuid },
		NICCDIID:       func(string, string) string { return "" },
	})
	if err != nil {
		b.Fatal(err)
	}
	in := draslice.GPUs{}
	var results []resourceapi.DeviceRequestAllocationResult
	for i := range 8 {
		in.GPUs = append(in.GPUs, nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), NUMANode: -1})
		results = append(results, result("gpus", fmt.Sprintf("gpu-%d", i)))
	}
	ctx := context.Background()
	d.SetGPUs(ctx, in)
	claims := []*resourceapi.ResourceClaim{claim("uid", "bench", results...)}
	if got, _ := d.PrepareResourceClaims(ctx, claims); got["uid"].Err != nil {
		b.Fatal(got["uid"].Err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, _ := d.PrepareResourceClaims(ctx, claims); len(got["uid"].Devices) != 8 {
			b.Fatal("lost the claim")
		}
	}
}

// BenchmarkPrepareMIG is one claim's Prepare and Unprepare of a MIG
// placement, NVML left out (the fake creates and destroys at once): the
// checkpoint written durably three times (the instance recorded before it
// is created, then the claim, then its removal) and the MIG spec twice.
// What NVML's creation takes on a GPU comes on top (docs/dra.md).
func BenchmarkPrepareMIG(b *testing.B) {
	d, _ := newTestDriver(b, b.TempDir(), Options{Sources: 1})
	d.SetMIG(newFakeMIG(), (&migSpecs{}).write)
	ctx := context.Background()
	d.SetGPUs(ctx, partitionedGPUs())
	claims := []*resourceapi.ResourceClaim{claim("uid", "bench", result("mig", "gpu-2-3g-40gb-4"))}
	objs := []kubelet.NamespacedObject{{UID: types.UID("uid")}}
	b.ReportAllocs()
	for b.Loop() {
		got, err := d.PrepareResourceClaims(ctx, claims)
		if err != nil || got["uid"].Err != nil {
			b.Fatalf("Prepare: %v %+v", err, got)
		}
		if res, err := d.UnprepareResourceClaims(ctx, objs); err != nil || res["uid"] != nil {
			b.Fatal(err, res)
		}
	}
}

// countingStatus counts writes and keeps the last, so a claim can be given
// its current status.
type countingStatus struct {
	n    int
	last []resourceapi.AllocatedDeviceStatus
}

func (c *countingStatus) ApplyDeviceStatus(_ context.Context, _ *resourceapi.ResourceClaim, devs []resourceapi.AllocatedDeviceStatus) error {
	c.n++
	c.last = devs
	return nil
}

// BenchmarkClaimStatus is the status write after Prepare for a claim of
// two GPUs and a NIC, less the API server: the entries made (the NIC's
// interface and address read from sysfs) and handed to a writer that
// keeps them ("new"); the same claim prepared again with its status
// current, compared and not written ("current"); and the whole client
// path, the apply encoded and merged by the fake clientset ("fake-apply").
func BenchmarkClaimStatus(b *testing.B) {
	for _, mode := range []string{"new", "current", "fake-apply"} {
		b.Run(mode, func(b *testing.B) {
			c := apiClaim()
			cs := &countingStatus{}
			o := Options{ClaimStatus: cs, SysfsRoot: nicSysfs(b)}
			var client *fake.Clientset
			if mode == "fake-apply" {
				client = fake.NewClientset(c)
				o.ClaimStatus = apiClaims{testAPI(b, client)}
			}
			d, _ := statusDriver(b, client, o)
			ctx := context.Background()
			claims := []*resourceapi.ResourceClaim{c}
			out, _, err := d.prepareClaims(ctx, claims, nil)
			if err != nil || out[c.UID].Err != nil {
				b.Fatal(err, out[c.UID].Err)
			}
			if mode == "current" {
				d.writeClaimStatus(ctx, claims, out)
				c.Status.Devices = append(c.Status.Devices, cs.last...)
				cs.n = 0
			}
			b.ReportAllocs()
			for b.Loop() {
				if mode == "fake-apply" {
					// Entries absent each time, as on a first Prepare.
					c.Status.Devices = nil
				}
				d.writeClaimStatus(ctx, claims, out)
			}
			if mode == "current" && cs.n != 0 {
				b.Fatalf("%d writes of a current status", cs.n)
			}
		})
	}
}

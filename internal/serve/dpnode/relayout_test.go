package dpnode

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
)

// migInventory is one H100, in MIG mode with migs (profile by UUID) or,
// with none, served whole.
func migInventory(migs ...[2]string) *nvml.Inventory {
	g := nvml.GPU{UUID: "GPU-0", Name: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:10:00.0", NUMANode: 0, MIGCapable: true, MIGEnabled: len(migs) > 0}
	for k, m := range migs {
		g.MIG = append(g.MIG, nvml.MIGDevice{UUID: m[0], Index: k, GPUInstance: k + 1, Profile: m[1], CapMinors: []int{10 + k, 20 + k}})
	}
	return &nvml.Inventory{GPUs: []nvml.GPU{g}}
}

type dev struct {
	id      string
	healthy bool
	reason  string
}

func devicesOf(t *testing.T, f *FrontEnd, resource string) []dev {
	t.Helper()
	g, ok := f.gpus[resource]
	if !ok {
		t.Fatalf("no server for %s", resource)
	}
	var out []dev
	for _, d := range g.srv.Devices() {
		out = append(out, dev{d.ID, d.Healthy, d.Reason})
	}
	return out
}

func wantDevices(t *testing.T, f *FrontEnd, resource string, want ...dev) {
	t.Helper()
	if got := devicesOf(t, f, resource); !slices.Equal(got, want) {
		t.Errorf("%s devices = %+v, want %+v", resource, got, want)
	}
}

// heldSet is a Held over resource/id pairs.
func heldSet(pairs ...string) Held {
	return func(resource, id string) bool { return slices.Contains(pairs, resource+"/"+id) }
}

// TestRelayoutKeepsHeldDevicesUntilFreed pins the held-device rule: a
// device a new MIG layout drops stays listed Unhealthy while a pod holds
// it and goes once it is free, a device both layouts serve keeps its
// health, a new one waits for health, and a resource name the new layout
// lacks is served with no devices.
func TestRelayoutKeepsHeldDevicesUntilFreed(t *testing.T) {
	const mig1g, mig3g, whole = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/gpu"
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	f := New(Options{Layout: layout.Options{MIGStrategy: gpu.MIGMixed}, DevicePluginDir: t.TempDir()}, nil, nil, log)
	n, err := f.TakeGPUs(migInventory([2]string{"MIG-a", "1g.10gb"}, [2]string{"MIG-b", "1g.10gb"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	n.SetHealth("MIG-a", false, "xid=61")
	wantDevices(t, f, mig1g, dev{"MIG-a", false, "xid=61"}, dev{"MIG-b", true, ""})
	if len(f.start) != 1 {
		t.Fatalf("servers to start = %d, want 1", len(f.start))
	}
	f.start = nil

	// MIG-b destroyed while a pod holds it; a 3g instance created.
	n, err = f.Relayout(migInventory([2]string{"MIG-a", "1g.10gb"}, [2]string{"MIG-c", "3g.40gb"}), nil, heldSet(mig1g+"/MIG-b"))
	if err != nil {
		t.Fatal(err)
	}
	wantDevices(t, f, mig1g, dev{"MIG-a", false, "xid=61"}, dev{"MIG-b", false, ReasonGone})
	wantDevices(t, f, mig3g, dev{"MIG-c", false, health.ReasonRelaidOut})
	if len(f.start) != 1 || f.start[0].Resource() != mig3g {
		t.Errorf("servers to start = %v, want the new %s", f.start, mig3g)
	}
	// Health reaches the devices the new layout serves, not the kept one.
	n.SetHealth("MIG-c", true, "")
	n.SetHealth("MIG-b", true, "")
	wantDevices(t, f, mig3g, dev{"MIG-c", true, ""})
	wantDevices(t, f, mig1g, dev{"MIG-a", false, "xid=61"}, dev{"MIG-b", false, ReasonGone})

	if left := f.Prune(heldSet(mig1g + "/MIG-b")); left != 1 {
		t.Errorf("still held = %d, want 1", left)
	}
	if left := f.Prune(heldSet()); left != 0 {
		t.Errorf("still held after the pod ended = %d, want 0", left)
	}
	wantDevices(t, f, mig1g, dev{"MIG-a", false, "xid=61"})

	// MIG mode off, nothing known held (no PodResources): the MIG
	// resources are withdrawn, their devices dropped at once.
	if _, err := f.Relayout(migInventory(), nil, nil); err != nil {
		t.Fatal(err)
	}
	wantDevices(t, f, mig1g)
	wantDevices(t, f, mig3g)
	wantDevices(t, f, whole, dev{"GPU-0", false, health.ReasonRelaidOut})
}

// A device kept for its pod that a later layout serves again is new to
// health, not Healthy by what the kubelet was last told.
func TestRelayoutDeviceBackFromGone(t *testing.T) {
	f := New(Options{Layout: layout.Options{MIGStrategy: gpu.MIGMixed}, DevicePluginDir: t.TempDir()}, nil, nil, slog.New(slog.NewTextHandler(t.Output(), nil)))
	inv := migInventory([2]string{"MIG-a", "1g.10gb"})
	if _, err := f.TakeGPUs(inv, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Relayout(migInventory([2]string{"MIG-x", "1g.10gb"}), nil, heldSet("nvidia.com/mig-1g.10gb/MIG-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Relayout(inv, nil, nil); err != nil {
		t.Fatal(err)
	}
	wantDevices(t, f, "nvidia.com/mig-1g.10gb", dev{"MIG-a", false, health.ReasonRelaidOut})
	if len(f.gpus["nvidia.com/mig-1g.10gb"].gone) != 0 {
		t.Error("MIG-a still marked gone")
	}
}

package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config/configtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// nicConfig serves docs/nic-pools.md's pools from a DGX-H100-like tree
// (returned), with CDI specs in a temporary directory.
func nicConfig(t *testing.T) (string, config.Config) {
	t.Helper()
	return configtest.NICPools(t, testConfig(t))
}

// GPUs and NIC pools from one process, with CDI specs written while it
// serves and removed when it stops.
func TestServesNICPoolsAndCDISpecs(t *testing.T) {
	_, cfg := nicConfig(t)
	stale := filepath.Join(cfg.CDISpecDir, "gpu-device-plugin_example.com-old.json")
	other := filepath.Join(cfg.CDISpecDir, "other-vendor.yaml")
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	infoDir := cfg.DeviceInfoDir
	k := startKubelet(t, cfg.DevicePluginDir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return nvmltest.NewDGXA100(), nil }, nil)
	}()

	registered := map[string]string{}
	for len(registered) < 3 {
		select {
		case r := <-k.reqs:
			registered[r.ResourceName] = r.Endpoint
		case <-time.After(10 * time.Second):
			t.Fatalf("registered only %v", registered)
		}
	}
	for _, want := range []string{"nvidia.com/gpu", "example.com/rdma_numa0", "example.com/rdma_numa1"} {
		if _, ok := registered[want]; !ok {
			t.Fatalf("%s not registered: %v", want, registered)
		}
	}

	client := dialPlugin(t, filepath.Join(cfg.DevicePluginDir, registered["example.com/rdma_numa0"]))
	c := client
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 4 {
		t.Fatalf("rdma_numa0 lists %d NICs, want 4", len(list.Devices))
	}
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{list.Devices[0].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	if cd := resp.ContainerResponses[0].CdiDevices; len(cd) != 1 || cd[0].Name != "example.com/rdma_numa0="+list.Devices[0].ID {
		t.Errorf("CDI devices = %v", cd)
	}
	// Allocate answered, so the CNI device-information file is there.
	if _, err := os.Stat(filepath.Join(infoDir, "example.com-rdma_numa0-"+list.Devices[0].ID+"-device.json")); err != nil {
		t.Errorf("no device-information file for the allocated NIC: %v", err)
	}

	specFiles := func() []string {
		entries, _ := os.ReadDir(cfg.CDISpecDir)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	want := []string{"gpu-device-plugin_example.com-rdma_numa0.json", "gpu-device-plugin_example.com-rdma_numa1.json", "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json", "other-vendor.yaml"}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(specFiles(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("CDI dir holds %v, want %v", specFiles(), want)
		}
		time.Sleep(10 * time.Millisecond) // polling the file system: nothing to wait on
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The kubelet restarts containers with the names it kept, so the
	// specs outlive the plugin.
	if got := specFiles(); !slices.Equal(got, want) {
		t.Errorf("after shutdown the CDI dir holds %v, want %v", got, want)
	}
}

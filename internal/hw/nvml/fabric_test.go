package nvml_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// Discovery reads each GPU's fabric registration as NVML gives it; a GPU
// outside an NVLink domain, a state NVML calls not supported and a failing
// call all leave Fabric nil, and only the failure is logged.
func TestFabricInfo(t *testing.T) {
	uuid := [16]uint8{0x8f, 0x1c, 0x2b, 0x3d, 0x4e, 0x5f, 0x40, 0x61, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7, 0xe8, 0xf9}
	ok := uint32(gonvml.SUCCESS)
	s := nvmltest.NewDGXA100()
	nvmltest.WithFabric(s, 0, gonvml.GpuFabricInfo{ClusterUuid: uuid, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: ok}, gonvml.SUCCESS)
	nvmltest.WithFabric(s, 1, gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_IN_PROGRESS, Status: uint32(gonvml.ERROR_NOT_READY)}, gonvml.SUCCESS)
	nvmltest.WithFabric(s, 2, gonvml.GpuFabricInfo{ClusterUuid: uuid, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.ERROR_INSUFFICIENT_RESOURCES)}, gonvml.SUCCESS)
	nvmltest.WithFabric(s, 3, gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, gonvml.SUCCESS)
	nvmltest.WithFabric(s, 4, gonvml.GpuFabricInfo{}, gonvml.ERROR_UNKNOWN)
	nvmltest.WithFabric(s, 5, gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: ok}, gonvml.SUCCESS)
	var buf bytes.Buffer
	inv, err := nvml.Discover(s, t.TempDir(), slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	want := []*nvml.Fabric{
		{ClusterUUID: "8f1c2b3d-4e5f-4061-8293-a4b5c6d7e8f9", CliqueID: 7, State: nvml.FabricCompleted},
		{State: nvml.FabricInProgress, Status: gonvml.ERROR_NOT_READY.Error()},
		{ClusterUUID: "8f1c2b3d-4e5f-4061-8293-a4b5c6d7e8f9", CliqueID: 7, State: nvml.FabricCompleted, Status: gonvml.ERROR_INSUFFICIENT_RESOURCES.Error()},
		nil, nil,
		{State: nvml.FabricCompleted},
		nil, nil, // NOT_SUPPORTED: no NVLink domain
	}
	registered := []bool{true, false, false, false, false, false, false, false}
	for i, g := range inv.GPUs {
		switch got := g.Fabric; {
		case (got == nil) != (want[i] == nil):
			t.Errorf("GPU %d: fabric %+v, want %+v", i, got, want[i])
		case got != nil && *got != *want[i]:
			t.Errorf("GPU %d: fabric %+v, want %+v", i, *got, *want[i])
		}
		if g.Fabric.Registered() != registered[i] {
			t.Errorf("GPU %d: Registered() = %v, want %v", i, g.Fabric.Registered(), registered[i])
		}
	}
	if n := strings.Count(buf.String(), "fabric info"); n != 1 || !strings.Contains(buf.String(), "device="+inv.GPUs[4].UUID) {
		t.Errorf("want one warning, for GPU 4's failed call:\n%s", buf.String())
	}
}

package nvml

import (
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

func TestSetComputeMode(t *testing.T) {
	s := nvmltest.NewDGXA100()
	d := nvmltest.Device(s, 2)
	for _, exclusive := range []bool{true, false} {
		if err := SetComputeMode(s, d.UUID, exclusive); err != nil {
			t.Fatal(err)
		}
		want := map[bool]gonvml.ComputeMode{true: gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS, false: gonvml.COMPUTEMODE_DEFAULT}[exclusive]
		if got, _ := d.GetComputeMode(); got != want {
			t.Errorf("exclusive %v: mode %v", exclusive, got)
		}
		if got, err := IsExclusive(s, d.UUID); err != nil || got != exclusive {
			t.Errorf("exclusive %v: read back %v, %v", exclusive, got, err)
		}
	}
	d.SetComputeModeFunc = func(gonvml.ComputeMode) gonvml.Return { return gonvml.ERROR_NO_PERMISSION }
	if err := SetComputeMode(s, d.UUID, true); err == nil || !strings.Contains(err.Error(), "exclusive-process") {
		t.Errorf("no permission: %v", err)
	}
	if err := SetComputeMode(s, "GPU-none", true); err == nil {
		t.Error("unknown GPU: no error")
	}
}

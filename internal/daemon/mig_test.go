package daemon

import (
	"reflect"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
)

// A partitioned GPU reports health as one part under its own UUID, beside
// any MIG device parts it has; other GPUs keep theirs.
func TestWithPartitioned(t *testing.T) {
	gpus := []nvml.GPU{{UUID: "GPU-0"}, {UUID: "GPU-1"}, {UUID: "GPU-2"}}
	parts := [][]health.Part{nil, {{ID: "MIG-1", GPUInstance: 7}}, nil}
	got := withPartitioned(parts, []bool{false, true, true}, gpus)
	want := [][]health.Part{nil, {{ID: "MIG-1", GPUInstance: 7}, {ID: "GPU-1", GPUInstance: health.AnyInstance}}, {{ID: "GPU-2", GPUInstance: health.AnyInstance}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parts %+v, want %+v", got, want)
	}
	if got := withPartitioned([][]health.Part{nil}, nil, gpus[:1]); !reflect.DeepEqual(got, [][]health.Part{nil}) {
		t.Errorf("nothing partitioned: %+v", got)
	}
}

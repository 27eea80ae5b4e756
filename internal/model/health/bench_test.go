package health

import (
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

type nopNotifier struct{}

func (nopNotifier) SetHealth(string, bool, string) bool { return false }

// BenchmarkPoll is one thermal poll pass over 8 GPUs: two NVML reads per
// GPU (through go-nvml's mock, so this is our cost, not the driver's) and
// the policy.
func BenchmarkPoll(b *testing.B) {
	s := nvmltest.NewDGXA100()
	inv, err := nvml.Discover(s, b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, len(inv.GPUs))
	for i, g := range inv.GPUs {
		ids[i] = g.UUID
	}
	w, err := NewWatcher(policy.Default(), ids, nvml.NewMonitor(s, inv, nil), nopNotifier{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		w.Poll()
	}
}

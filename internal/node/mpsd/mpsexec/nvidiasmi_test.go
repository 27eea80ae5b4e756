package mpsexec

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// The driver root's nvidia-smi (the stand-in) is run confined, as the
// control daemon is, with the compute-policy arguments; nothing is left
// mounted.
func TestSetTimeSlice(t *testing.T) {
	self := needConfinement(t)
	root, _ := fakeDriverRoot(t)
	before := mountinfo(t)
	ctx := context.Background()
	for _, level := range []int{TimeSliceLong, TimeSliceDefault} {
		said, err := SetTimeSlice(ctx, self, root, "", "GPU-x", level)
		if want := fmt.Sprintf("Set compute time slice to %d for GPU GPU-x (mock).", level); err != nil || said != want {
			t.Errorf("level %d: nvidia-smi said %q, %v; want %q", level, said, err, want)
		}
	}
	if after := mountinfo(t); after != before {
		t.Errorf("mounts changed:\nbefore %s\nafter %s", before, after)
	}
	if _, err := SetTimeSlice(ctx, self, root, "", "GPU-x", 7); err == nil || !strings.Contains(err.Error(), "level 7") {
		t.Errorf("level 7: %v", err)
	}
	// What nvidia-smi says when it fails is in the error.
	if _, err := SetTimeSlice(ctx, self, root, "", "MIG-y", 1); err == nil || !strings.Contains(err.Error(), `mock nvidia-smi: no GPU "MIG-y"`) {
		t.Errorf("nvidia-smi failing: %v", err)
	}
	empty := t.TempDir()
	if _, err := SetTimeSlice(ctx, self, empty, "", "GPU-x", 1); err == nil || !strings.Contains(err.Error(), "nvidia-smi is not in the driver root "+empty) {
		t.Errorf("no nvidia-smi: %v", err)
	}
}

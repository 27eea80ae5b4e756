package mpsexec

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/mpsd/mpstest"
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
		if err := SetTimeSlice(ctx, self, root, "", "GPU-x", level); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, mpstest.SMIRecord))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "compute-policy -i GPU-x --set-timeslice 3\ncompute-policy -i GPU-x --set-timeslice 0\n"; got != want {
		t.Errorf("nvidia-smi was told %q, want %q", got, want)
	}
	if after := mountinfo(t); after != before {
		t.Errorf("mounts changed:\nbefore %s\nafter %s", before, after)
	}
	if err := SetTimeSlice(ctx, self, root, "", "GPU-x", 7); err == nil || !strings.Contains(err.Error(), "level 7") {
		t.Errorf("level 7: %v", err)
	}
	// What nvidia-smi says when it fails is in the error.
	if err := SetTimeSlice(ctx, self, root, "", "MIG-y", 1); err == nil || !strings.Contains(err.Error(), `mock nvidia-smi: no GPU "MIG-y"`) {
		t.Errorf("nvidia-smi failing: %v", err)
	}
	empty := t.TempDir()
	if err := SetTimeSlice(ctx, self, empty, "", "GPU-x", 1); err == nil || !strings.Contains(err.Error(), "nvidia-smi is not in the driver root "+empty) {
		t.Errorf("no nvidia-smi: %v", err)
	}
}

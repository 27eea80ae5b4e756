package mpsexec

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The compute time-slice levels of nvidia-smi compute-policy
// --set-timeslice, which NVML does not expose.
const (
	TimeSliceDefault = 0
	TimeSliceShort   = 1
	TimeSliceMedium  = 2
	TimeSliceLong    = 3
)

// SetTimeSlice sets the compute time-slice of the GPU with uuid to level
// with the driver root's nvidia-smi, run confined as the MPS control
// daemon is (self is this executable, which acts as the helper), and
// returns what nvidia-smi said. The setting lasts until changed or the
// driver is reloaded.
func SetTimeSlice(ctx context.Context, self, driverRoot, devRoot, uuid string, level int) (string, error) {
	if level < TimeSliceDefault || level > TimeSliceLong {
		return "", fmt.Errorf("time-slice level %d: want %d to %d", level, TimeSliceDefault, TimeSliceLong)
	}
	s, err := LocateProgram(driverRoot, "nvidia-smi")
	if err != nil {
		return "", err
	}
	s.DevRoot = devRoot
	s.Args = []string{"compute-policy", "-i", uuid, "--set-timeslice", strconv.Itoa(level)}
	cmd, err := Command(ctx, self, s)
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	said := strings.TrimSpace(tail(out.String(), 200))
	if err != nil {
		return said, fmt.Errorf("nvidia-smi compute-policy -i %s --set-timeslice %d: %w: %s", uuid, level, err, said)
	}
	return said, nil
}

// tail is the last n bytes of s: what a failing program said last.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

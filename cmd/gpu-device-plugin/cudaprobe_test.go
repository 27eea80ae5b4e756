package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda/cudatest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// runIfCUDAProbe runs the CLI, as the plugin's executable would, when this
// test binary is started as the cuda-probe helper.
func runIfCUDAProbe() {
	if len(os.Args) > 1 && os.Args[1] == cudaprobe.HelperCommand {
		main() // exits 1 on an error
		os.Exit(0)
	}
}

// cuda-probe is hidden, and refuses to run where the plugin did not start
// it, in one line.
func TestCUDAProbeHidden(t *testing.T) {
	out, _, err := run(t, mockOpen, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "cuda-probe") {
		t.Errorf("help lists the hidden cuda-probe:\n%s", out)
	}
	_, _, err = run(t, mockOpen, "cuda-probe", "--library=/x/libcuda.so.1", "--minor=0", "--pci-bus-id=00000000:3B:00.0")
	if err == nil || !strings.Contains(err.Error(), "not PID 1") || strings.Contains(err.Error(), "\n") {
		t.Errorf("cuda-probe by hand: %v; want one line refusing", err)
	}
}

// The plugin's own hidden command, through its CLI, probes a GPU of a fake
// node with the mock libcuda: one that works, one whose cuInit fails.
func TestCUDAProbeCommand(t *testing.T) {
	self := mpstest.NeedConfinement(t)
	g := cudatest.GPUs[1]
	for _, tc := range []struct {
		name string
		conf string
		want cuda.Result
	}{
		{"works", "", cuda.Result{OK: true, UUID: g.UUID}},
		{"cuInit fails", "fail cuInit 100", cuda.Result{Step: cuda.StepInit, Code: 100, Name: "CUDA_ERROR_NO_DEVICE", Message: "cuInit(0)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := cudatest.NewNode(t, tc.conf)
			r, err := cudaprobe.Run(context.Background(), cudaprobe.Options{
				Self: self, DriverRoot: n.DriverRoot, DevRoot: n.DevRoot, SysRoot: n.SysRoot,
				PCIBusID: g.BusID, UUID: g.UUID, Minor: g.Minor, AllocBytes: 4096, Timeout: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.OK == false && !strings.Contains(r.Stderr, "the GPU failed the CUDA probe: failed at cuInit: CUDA_ERROR_NO_DEVICE (100)") {
				t.Errorf("stderr %q; want the CLI's one line", r.Stderr)
			}
			r.Duration, r.Stderr = 0, ""
			if r != tc.want {
				t.Errorf("got  %+v\nwant %+v", r, tc.want)
			}
		})
	}
}

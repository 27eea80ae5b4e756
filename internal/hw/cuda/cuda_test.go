package cuda_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda/cudatest"
)

// The report's JSON is the hidden command's output: lowerCamelCase keys,
// durationMs, empty fields left out.
func TestResultJSON(t *testing.T) {
	r := cuda.Result{Step: cuda.StepContext, Code: 999, Name: "CUDA_ERROR_UNKNOWN", Message: "cuCtxCreate on device 0",
		UUID: "GPU-1", Duration: 1500 * time.Microsecond}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ok":false,"step":"cuCtxCreate","code":999,"name":"CUDA_ERROR_UNKNOWN","message":"cuCtxCreate on device 0","uuid":"GPU-1","durationMs":1.5}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var back cuda.Result
	if err := json.Unmarshal(b, &back); err != nil || back != r {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	for _, tc := range []struct {
		r    cuda.Result
		want string
	}{
		{cuda.Result{OK: true, Duration: 12 * time.Millisecond}, "ok in 12ms"},
		{r, "failed at cuCtxCreate: CUDA_ERROR_UNKNOWN (999): cuCtxCreate on device 0"},
		{cuda.Result{Step: cuda.StepDestroy, Code: 12345}, "failed at cuCtxDestroy: CUresult 12345"},
		{cuda.Result{Step: cuda.StepInit, TimedOut: true, Message: "no answer in 30s: killed"}, "failed at cuInit: no answer in 30s: killed"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("String() = %q; want %q", got, tc.want)
		}
	}
}

// libcuda.so.1 is found in the driver root's library directories, through
// its soname link; a root without it is an error naming the root and the
// setting.
func TestLibraryPath(t *testing.T) {
	root, libDir := cudatest.DriverRoot(t, "")
	if got, err := cuda.LibraryPath(root); err != nil || got != filepath.Join(libDir, cuda.LibraryName) {
		t.Errorf("LibraryPath = %q, %v; want %s", got, err, filepath.Join(libDir, cuda.LibraryName))
	}
	dangling := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dangling, "usr", "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.1.gone", filepath.Join(dangling, "usr", "lib64", cuda.LibraryName)); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{t.TempDir(), dangling} {
		_, err := cuda.LibraryPath(r)
		if !errors.Is(err, cuda.ErrNoLibrary) || !strings.Contains(err.Error(), r) || !strings.Contains(err.Error(), "--driver-root") {
			t.Errorf("LibraryPath(%s): %v", r, err)
		}
	}
}

// In this process, against the mock: what loading and a failing driver
// report. (A passing probe needs the GPU's device node; node/cudaprobe's
// tests run it confined, with one.)
func TestProbeInProcess(t *testing.T) {
	if _, err := cuda.Open(filepath.Join(t.TempDir(), "libcuda.so.1")); err == nil || !strings.Contains(err.Error(), "loading ") {
		t.Errorf("a missing library: %v", err)
	}

	// A library with cuInit alone.
	dir := t.TempDir()
	src, lone := filepath.Join(dir, "lone.c"), filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(src, []byte("int cuInit(unsigned int f) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cudatest.CC(t), "-shared", "-fPIC", "-o", lone, src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lib, err := cuda.Open(lone)
	if err != nil {
		t.Fatal(err)
	}
	r := lib.Probe(cuda.Target{PCIBusID: "0000:3b:00.0"}, nil)
	if r.OK || r.Step != cuda.StepLoad || r.Message != lone+" lacks cuDeviceGetByPCIBusId, cuCtxCreate, cuCtxDestroy" {
		t.Errorf("a library without the calls: %+v", r)
	}
	if r := lib.Probe(cuda.Target{}, nil); r.OK || r.Step != cuda.StepDevice || r.Message != "no PCI bus ID or UUID given" {
		t.Errorf("no target: %+v", r)
	}

	root, libDir := cudatest.DriverRoot(t, "fail cuInit 3\n")
	lib, err = cuda.Open(filepath.Join(libDir, cuda.LibraryName))
	if err != nil {
		t.Fatalf("%s: %v", root, err)
	}
	var steps []cuda.Step
	r = lib.Probe(cuda.Target{PCIBusID: "0000:3b:00.0"}, func(s cuda.Step) { steps = append(steps, s) })
	want := cuda.Result{Step: cuda.StepInit, Code: 3, Name: "CUDA_ERROR_NOT_INITIALIZED", Message: "cuInit(0)"}
	if r.Duration <= 0 {
		t.Errorf("no duration")
	}
	if r.Duration = 0; r != want || len(steps) != 1 || steps[0] != cuda.StepInit {
		t.Errorf("cuInit failing: %+v after %v; want %+v", r, steps, want)
	}
}

package cudaprobe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda/cudatest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// The test binary is the helper too, as the plugin's executable is.
func TestMain(m *testing.M) {
	RunIfHelper()
	os.Exit(m.Run())
}

var gpus = cudatest.GPUs

type node struct{ cudatest.Node }

// newNode is a fake node (cudatest.NewNode), where the probe can run
// confined.
func newNode(t *testing.T, conf string) node {
	mpstest.NeedConfinement(t)
	return node{cudatest.NewNode(t, conf)}
}

// options probe GPU i of n.
func (n node) options(t *testing.T, i int) Options {
	return Options{
		Self: mpstest.NeedConfinement(t), DriverRoot: n.DriverRoot, DevRoot: n.DevRoot, SysRoot: n.SysRoot,
		PCIBusID: gpus[i].BusID, UUID: gpus[i].UUID, Minor: gpus[i].Minor, Timeout: time.Minute,
	}
}

// The probe against the mock libcuda, through this test binary as the
// helper: each way a GPU can fail is a Result naming the step, with a nil
// error.
func TestRunMockLibcuda(t *testing.T) {
	for _, tc := range []struct {
		name   string
		conf   string
		change func(*Options)
		want   cuda.Result // Duration and Stderr not compared
	}{
		{name: "a working GPU, with an allocation", change: func(o *Options) { o.AllocBytes = 1 << 20 },
			want: cuda.Result{OK: true, UUID: gpus[2].UUID}},
		{name: "found by UUID alone", change: func(o *Options) { o.PCIBusID = "" },
			want: cuda.Result{OK: true, UUID: gpus[2].UUID}},
		{name: "the bus ID in CUDA's short form", change: func(o *Options) { o.PCIBusID = "0000:3b:00.0" },
			want: cuda.Result{OK: true, UUID: gpus[2].UUID}},
		{name: "cuInit fails", conf: "fail cuInit 100",
			want: cuda.Result{Step: cuda.StepInit, Code: 100, Name: "CUDA_ERROR_NO_DEVICE", Message: "cuInit(0)"}},
		// GPU 1 exists on the node and in the mock's list, but its node is
		// not in the probe's /dev: CUDA does not see it.
		{name: "another GPU is out of sight", change: func(o *Options) { o.PCIBusID = gpus[1].BusID; o.UUID = "" },
			want: cuda.Result{Step: cuda.StepDevice, Code: 101, Name: "CUDA_ERROR_INVALID_DEVICE", Message: "no CUDA device at " + gpus[1].BusID}},
		{name: "a bus ID no GPU has", change: func(o *Options) { o.PCIBusID = "00000000:99:00.0" },
			want: cuda.Result{Step: cuda.StepDevice, Code: 101, Name: "CUDA_ERROR_INVALID_DEVICE", Message: "no CUDA device at 00000000:99:00.0"}},
		{name: "the GPU at the bus ID is another", change: func(o *Options) { o.UUID = gpus[3].UUID },
			want: cuda.Result{Step: cuda.StepUUID, UUID: gpus[2].UUID,
				Message: fmt.Sprintf("the CUDA device at %s is %s, not %s", gpus[2].BusID, gpus[2].UUID, gpus[3].UUID)}},
		{name: "no context", conf: "fail cuCtxCreate 999",
			want: cuda.Result{Step: cuda.StepContext, Code: 999, Name: "CUDA_ERROR_UNKNOWN", Message: "cuCtxCreate on device 0", UUID: gpus[2].UUID}},
		{name: "the allocation fails", conf: "fail cuMemAlloc 2", change: func(o *Options) { o.AllocBytes = 1 << 20 },
			want: cuda.Result{Step: cuda.StepAlloc, Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Message: "cuMemAlloc of 1048576 bytes", UUID: gpus[2].UUID}},
		{name: "a CUresult the driver cannot name", conf: "fail cuCtxDestroy 12345",
			want: cuda.Result{Step: cuda.StepDestroy, Code: 12345, Message: "cuCtxDestroy", UUID: gpus[2].UUID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, tc.conf)
			o := n.options(t, 2)
			if tc.change != nil {
				tc.change(&o)
			}
			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatalf("err = %v (%+v)", err, r)
			}
			if r.Duration <= 0 {
				t.Errorf("no duration: %+v", r)
			}
			r.Duration, r.Stderr = 0, ""
			if r != tc.want {
				t.Errorf("got  %+v\nwant %+v", r, tc.want)
			}
		})
	}
}

// A hung driver is killed at the timeout, and the step it hung in is
// known; a crashed one is a failure of the step it crashed in.
func TestRunHangAndCrash(t *testing.T) {
	t.Run("hang", func(t *testing.T) {
		n := newNode(t, "hang cuCtxCreate")
		o := n.options(t, 2)
		o.Timeout = 5 * time.Second
		r, err := Run(context.Background(), o)
		if err != nil || r.OK || !r.TimedOut || r.Step != cuda.StepContext || !strings.Contains(r.Message, "no answer in 5s: killed") {
			t.Errorf("%+v, %v; want a timeout in cuCtxCreate", r, err)
		}
		if r.Duration < o.Timeout {
			t.Errorf("duration %v, shorter than the timeout", r.Duration)
		}
		// Its namespace went with it: nothing runs with its arguments.
		if left := processes(n.DriverRoot); len(left) > 0 {
			t.Errorf("processes left after the timeout: %v", left)
		}
	})
	t.Run("crash", func(t *testing.T) {
		n := newNode(t, "crash cuCtxCreate")
		r, err := Run(context.Background(), n.options(t, 2))
		if err != nil || r.OK || r.Step != cuda.StepContext || !strings.Contains(r.Message, "ended without a report") || !strings.Contains(r.Stderr, "SIGSEGV") {
			t.Errorf("%+v, %v; want a failure in cuCtxCreate, with the crash on stderr", r, err)
		}
	})
	t.Run("the caller gives up", func(t *testing.T) {
		n := newNode(t, "hang cuInit")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := Run(ctx, n.options(t, 2)) // its own timeout: a minute
		if !errors.Is(err, context.DeadlineExceeded) || r.OK || r.TimedOut {
			t.Errorf("%+v, %v; want the caller's context.DeadlineExceeded, no verdict", r, err)
		}
		if left := processes(n.DriverRoot); len(left) > 0 {
			t.Errorf("processes left: %v", left)
		}
	})
}

// processes are the PIDs whose command line holds word.
func processes(word string) []string {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), word) && e.Name() != fmt.Sprint(os.Getpid()) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// What the driver's library sees, as the mock reports it from cuInit.
func TestRunConfinement(t *testing.T) {
	hostFile := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(hostFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, "report")
	n.AddConf(t, "exists "+hostFile, "exists "+n.DriverRoot, "exists /proc/1/root/etc")
	// A descriptor the plugin leaked: no close-on-exec.
	canary := filepath.Join(t.TempDir(), "leaked-canary")
	if err := os.WriteFile(canary, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(canary, syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)

	r, err := Run(context.Background(), n.options(t, 2))
	if err != nil || !r.OK {
		t.Fatalf("%+v, %v", r, err)
	}
	seen := map[string]string{}
	for _, l := range strings.Split(r.Stderr, "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(l, "mockcuda: "), "="); ok {
			seen[k] = v
		}
	}
	list := func(k string) []string {
		l := strings.Split(seen[k], ",")
		slices.Sort(l)
		return slices.DeleteFunc(l, func(s string) bool { return s == "" })
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"its /dev: its GPU's node, nvidiactl, null and shm", list("dev"), []string{"null", "nvidia2", "nvidiactl", "shm"}},
		{"its root", list("root"), []string{"dev", "proc", "sys", "tmp"}},
		{"its /tmp: empty", list("tmp"), []string(nil)},
		{"its environment: PATH only", seen["env"], "PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		{"PID 1 of its own namespace", seen["pid"], "1"},
		{"no core dumps", seen["core"], "0"},
		{"a read-only root", seen["rootWritable"], "no"},
		{"a network namespace with only lo", seen["netInterfaces"], "1"},
		{"the plugin's files out of reach", seen["exists "+hostFile], "no"},
		{"the driver root out of reach", seen["exists "+n.DriverRoot], "no"},
		{"no way out through /proc/1/root", seen["exists /proc/1/root/etc"], "no"},
	} {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if strings.Contains(seen["fds"], "leaked-canary") || seen["fds"] == "" {
		t.Errorf("its descriptors: %s; want none leaked", seen["fds"])
	}
}

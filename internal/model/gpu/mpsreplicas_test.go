package gpu

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

// mpsResource is three 80 GiB GPUs shared through MPS, 8, 8 and 3 ways.
func mpsResource(t *testing.T, o Options) *Resource {
	t.Helper()
	gpus, topo := eightGPUs()
	var units []Unit
	for i, n := range []int{8, 8, 3} {
		g := gpus[i]
		g.MemoryBytes = 80 << 30
		units = append(units, Unit{GPU: g, Pos: i, Replicas: n, MPS: true})
	}
	if o.MPSRoot == "" {
		o.MPSRoot = "/run/gpu-device-plugin/mps"
	}
	r, err := NewUnits(units, topo, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func replica(g, n int) string { return fmt.Sprintf("GPU-%08d::%d", g, n) }

// Each container gets its daemon's directories and k/n of the GPU.
func TestAllocateMPS(t *testing.T) {
	root := devRoot(t, "nvidiactl")
	r := mpsResource(t, Options{DevRoot: root, MaxMPSShares: 3})
	for _, tt := range []struct {
		ids            []string
		threads, memMB string
	}{
		{[]string{replica(0, 5)}, "12", "0=10240M"},
		{[]string{replica(0, 1), replica(0, 4)}, "25", "0=20480M"},
		{[]string{replica(2, 0)}, "33", "0=27306M"},
		{[]string{replica(2, 0), replica(2, 1), replica(2, 2)}, "100", "0=81920M"},
	} {
		a, err := r.Allocate(tt.ids)
		if err != nil {
			t.Fatal(err)
		}
		uuid := strings.Split(tt.ids[0], ReplicaSep)[0]
		want := map[string]string{
			VisibleDevicesEnv: uuid, sharing.MPSPipeEnv: "/tmp/nvidia-mps",
			sharing.MPSThreadEnv: tt.threads, sharing.MPSPinnedMemoryEnv: tt.memMB,
		}
		if !reflect.DeepEqual(a.Env, want) {
			t.Errorf("%v: env %v\nwant %v", tt.ids, a.Env, want)
		}
		mounts := []device.Mount{
			{ContainerPath: "/tmp/nvidia-mps", HostPath: "/run/gpu-device-plugin/mps/" + uuid + "/pipe"},
			{ContainerPath: "/dev/shm", HostPath: "/run/gpu-device-plugin/mps/" + uuid + "/shm"},
		}
		if !reflect.DeepEqual(a.Mounts, mounts) {
			t.Errorf("%v: mounts %v\nwant %v", tt.ids, a.Mounts, mounts)
		}
	}
	// CDI alone: the MPS part is there all the same.
	r = mpsResource(t, Options{DevRoot: root, Strategies: []string{StrategyCDICRI}})
	a, err := r.Allocate([]string{replica(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if a.Env[sharing.MPSThreadEnv] != "12" || len(a.Mounts) != 2 || a.Env[VisibleDevicesEnv] != "" {
		t.Errorf("CDI answer: %+v", a)
	}
}

// A container connects to one daemon: shares of two GPUs are refused, and
// more shares than the daemon holds each client to (one by default).
func TestAllocateMPSRefuses(t *testing.T) {
	r := mpsResource(t, Options{DevRoot: devRoot(t)})
	_, err := r.Allocate([]string{replica(0, 0), replica(1, 0)})
	if !errors.Is(err, device.ErrBadRequest) || !strings.Contains(err.Error(), "one GPU's MPS control daemon") {
		t.Errorf("two GPUs: %v", err)
	}
	for _, tt := range []struct {
		name string
		max  int
		ids  []string
		ok   bool
	}{
		{"two shares by default", 0, []string{replica(0, 0), replica(0, 1)}, false},
		{"one share by default", 0, []string{replica(0, 0)}, true},
		{"up to the maximum", 3, []string{replica(0, 0), replica(0, 1), replica(0, 2)}, true},
		{"over the maximum", 3, []string{replica(0, 0), replica(0, 1), replica(0, 2), replica(0, 3)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := mpsResource(t, Options{DevRoot: devRoot(t), MaxMPSShares: tt.max})
			_, err := r.Allocate(tt.ids)
			switch {
			case tt.ok && err != nil:
				t.Errorf("refused: %v", err)
			case !tt.ok && (!errors.Is(err, device.ErrBadRequest) || !strings.Contains(err.Error(), "maxSharesPerContainer is")):
				t.Errorf("got %v, want a refusal naming maxSharesPerContainer", err)
			}
		})
	}
	if _, err := NewUnits([]Unit{{GPU: r.units[0].unit.GPU, Replicas: 2, MPS: true}}, r.topo, Options{}); err == nil {
		t.Error("MPS without a root accepted")
	}
	// A resource may serve whole GPUs beside MPS-shared ones (an entry
	// naming devices, no rename): those get no MPS part, and are not
	// given with a share.
	gpus, topo := eightGPUs()
	mixed, err := NewUnits([]Unit{{GPU: gpus[0], Replicas: 2, MPS: true}, {GPU: gpus[1], Pos: 1}}, topo, Options{DevRoot: devRoot(t), MPSRoot: "/mps"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := mixed.Allocate([]string{gpus[1].UUID})
	if err != nil || len(a.Mounts) != 0 || a.Env[sharing.MPSThreadEnv] != "" {
		t.Errorf("whole GPU beside MPS: %+v, %v", a, err)
	}
	if _, err := mixed.Allocate([]string{gpus[1].UUID, replica(0, 1)}); !errors.Is(err, device.ErrBadRequest) {
		t.Errorf("whole GPU and an MPS share: %v", err)
	}
}

func TestPreferredMPS(t *testing.T) {
	all := func(except ...string) []string {
		var out []string
		for g, n := range []int{8, 8, 3} {
			for k := range n {
				if id := replica(g, k); !strings.Contains(strings.Join(except, " "), id) {
					out = append(out, id)
				}
			}
		}
		return out
	}
	held := []string{replica(0, 0), replica(0, 1), replica(0, 2), replica(1, 0), replica(2, 0)}
	for _, tt := range []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
		err       string
	}{
		{name: "distributed: most free", available: all(held...), size: 2, want: []string{replica(1, 1), replica(1, 2)}},
		{name: "only one GPU has room", available: all(held...), size: 7, want: []string{replica(1, 1), replica(1, 2), replica(1, 3), replica(1, 4), replica(1, 5), replica(1, 6), replica(1, 7)}},
		{name: "must include picks the GPU", available: all(held...), must: []string{replica(0, 7)}, size: 2, want: []string{replica(0, 7), replica(0, 3)}},
		{name: "no GPU has room", available: all(held...), size: 8, err: "no GPU has 8 free MPS shares"},
		{name: "must include two GPUs", available: all(), must: []string{replica(0, 1), replica(1, 1)}, size: 2, err: "two GPUs"},
		{name: "must include's GPU too full", available: all(held...), must: []string{replica(2, 1)}, size: 3, err: "has 2 free MPS shares"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Several shares per container, so Allocate takes every set.
			r := mpsResource(t, Options{DevRoot: devRoot(t), MaxMPSShares: 8})
			got, err := r.Preferred(tt.available, tt.must, tt.size)
			if tt.err != "" {
				if !errors.Is(err, allocator.ErrBadRequest) || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Preferred = %v, %v; want %v", got, err, tt.want)
			}
			if _, err := r.Allocate(got); err != nil {
				t.Errorf("Allocate of the preferred set: %v", err)
			}
		})
	}
}

// TestMaxMPSRootFitsTheSocket: config refuses an mpsRoot past MaxMPSRoot by
// the length of the control socket in the layout MPSDir makes; the two must agree.
func TestMaxMPSRootFitsTheSocket(t *testing.T) {
	root := "/" + strings.Repeat("m", config.MaxMPSRoot-1)
	sock := filepath.Join(sharing.MPSDir(root, "GPU-8c1e7d5a-0000-4000-8000-000000000000", sharing.MPSPipe), "control")
	if len(sock) != 107 {
		t.Errorf("the longest mpsRoot config allows gives a %d-byte control socket path, want 107 (a UNIX socket's most)", len(sock))
	}
}

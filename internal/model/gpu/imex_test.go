package gpu

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// Every allocation, whole GPU, MIG device or a time-sliced share, gets
// the IMEX channels: the node and NVIDIA_IMEX_CHANNELS with envvar, the
// channel's CDI device with cdi-cri and cdi-annotations; none without.
func TestAllocateIMEXChannels(t *testing.T) {
	gpus, topo := eightGPUs()
	channel := "/dev/nvidia-caps-imex-channels/channel0"
	cdiName := cdi.QualifiedName(cdi.GPUKind, "imex-channel0")
	root := devRoot(t, "nvidiactl")
	all := []string{StrategyEnvvar, StrategyCDICRI, StrategyCDIAnnotations}
	shared := []Unit{{GPU: gpus[0], Pos: 0, Replicas: 4}}
	tests := []struct {
		name  string
		build func(o Options) (*Resource, error)
		ids   []string
	}{
		{"whole GPUs", func(o Options) (*Resource, error) { return New(gpus, topo, o) }, []string{gpus[3].UUID, gpus[1].UUID}},
		{"MIG devices", func(o Options) (*Resource, error) { return migResource(t, MIGMixed, o), nil }, []string{"MIG-0-1"}},
		{"time-sliced shares", func(o Options) (*Resource, error) { return NewUnits(shared, topo, o) }, []string{gpus[0].UUID + "::1", gpus[0].UUID + "::2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.build(Options{DevRoot: root, Strategies: all, IMEXChannels: []int{0}})
			if err != nil {
				t.Fatal(err)
			}
			a, err := r.Allocate(tt.ids)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Env[IMEXChannelsEnv]; got != "0" {
				t.Errorf("%s = %q, want 0", IMEXChannelsEnv, got)
			}
			k := slices.IndexFunc(a.Nodes, func(n device.Node) bool { return n.ContainerPath == channel })
			if k < 0 || a.Nodes[k].HostPath != filepath.Join(root, "nvidia-caps-imex-channels", "channel0") || a.Nodes[k].Permissions != "rw" {
				t.Errorf("nodes %v: want %s from %s, rw", paths(a.Nodes), channel, root)
			}
			if last := a.CDIDevices[len(a.CDIDevices)-1]; last != cdiName || slices.Index(a.CDIDevices, cdiName) != len(a.CDIDevices)-1 {
				t.Errorf("CDI devices %v: want %s once, after the GPUs", a.CDIDevices, cdiName)
			}
			found := false
			for _, v := range a.Annotations {
				found = found || slices.Contains(strings.Split(v, ","), cdiName)
			}
			if !found {
				t.Errorf("annotations %v lack %s", a.Annotations, cdiName)
			}
		})
	}
	r, err := New(gpus, topo, Options{DevRoot: root, Strategies: all})
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.Allocate([]string{gpus[0].UUID})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Env[IMEXChannelsEnv]; ok || slices.Contains(paths(a.Nodes), channel) || slices.Contains(a.CDIDevices, cdiName) {
		t.Errorf("no channel configured, yet: env %v, nodes %v, CDI %v", a.Env, paths(a.Nodes), a.CDIDevices)
	}
}

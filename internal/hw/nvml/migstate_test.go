package nvml

import (
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

// TestMIGStateChanges reads the layout of a mock DGX A100 before and
// after each change the way nvidia-smi or mig-manager makes them, and
// pins which count as a layout change.
func TestMIGStateChanges(t *testing.T) {
	oneG := func(gi int) *nvmltest.MIG {
		return &nvmltest.MIG{GPUInstance: gi, GISlices: 1, MemoryMiB: a100MiB1g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE}
	}
	threeG := func(gi int) *nvmltest.MIG {
		return &nvmltest.MIG{GPUInstance: gi, GISlices: 3, MemoryMiB: a100MiB3g, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE}
	}
	tests := []struct {
		name   string
		before func(*dgxa100.Server)
		change func(*dgxa100.Server)
		// want are the changes, each naming its GPU by index (its first
		// character).
		want []string
	}{
		{
			name:   "same layout",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7), oneG(8)) },
			change: func(*dgxa100.Server) {},
		},
		{
			name:   "same layout read again after it was rebuilt",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7), oneG(8)) },
			// The same instances in other slots: nothing served changes.
			change: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(8), nil, oneG(7)) },
		},
		{
			name:   "new instance",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7)) },
			change: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7), oneG(8)) },
			want:   []string{"0: 1 MIG devices added, 0 removed"},
		},
		{
			name:   "destroyed instance",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7), oneG(8)) },
			change: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, nil, oneG(8)) },
			want:   []string{"0: 0 MIG devices added, 1 removed"},
		},
		{
			name:   "instances replaced by another profile",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 3, oneG(7), oneG(8)) },
			change: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 3, threeG(1)) },
			want:   []string{"3: 1 MIG devices added, 2 removed"},
		},
		{
			name:   "MIG mode turned on",
			change: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 1) },
			want:   []string{"1: MIG mode on"},
		},
		{
			name:   "MIG mode turned off",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 2, oneG(7)) },
			change: func(s *dgxa100.Server) { nvmltest.Device(s, 2).MigMode = gonvml.DEVICE_MIG_DISABLE },
			want:   []string{"2: MIG mode off"},
		},
		{
			name: "pending MIG mode only",
			change: func(s *dgxa100.Server) {
				nvmltest.Device(s, 1).GetMigModeFunc = func() (int, int, gonvml.Return) {
					return gonvml.DEVICE_MIG_DISABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
				}
			},
		},
		{
			name:   "a GPU that cannot be read is no change",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7)) },
			change: func(s *dgxa100.Server) {
				nvmltest.Device(s, 0).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_GPU_IS_LOST }
			},
		},
		{
			name:   "a MIG device that cannot be read is no change",
			before: func(s *dgxa100.Server) { nvmltest.WithMIG(s, 0, oneG(7), oneG(8)) },
			change: func(s *dgxa100.Server) {
				nvmltest.Device(s, 0).GetMigDeviceHandleByIndexFunc = func(int) (gonvml.Device, gonvml.Return) { return nil, gonvml.ERROR_UNKNOWN }
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := nvmltest.NewDGXA100()
			if tt.before != nil {
				tt.before(srv)
			}
			inv, log := discover(t, srv, dgxSysfs(t))
			uuids := make([]string, len(inv.GPUs))
			for i, g := range inv.GPUs {
				uuids[i] = g.UUID
			}
			was := MIGStateOf(inv.GPUs)
			if got := ReadMIGState(srv, inv.Symbols(), uuids).Changes(was); len(got) != 0 {
				t.Fatalf("layout read at once differs from the discovered one: %v\nlog:\n%s", got, log)
			}
			tt.change(srv)
			got := was.Changes(ReadMIGState(srv, inv.Symbols(), uuids))
			// want names a GPU by its index, the first character.
			var want []string
			for _, w := range tt.want {
				want = append(want, inv.GPUs[w[0]-'0'].UUID+w[1:])
			}
			if !slices.Equal(got, want) {
				t.Errorf("changes = %q, want %q", got, want)
			}
		})
	}
}

// TestMIGStateWithoutMIGMode: a driver without nvmlDeviceGetMigMode
// never reports a change.
func TestMIGStateWithoutMIGMode(t *testing.T) {
	srv := nvmltest.NewDGXA100()
	nvmltest.WithoutSymbols(srv, symMigMode)
	inv, _ := discover(t, srv, dgxSysfs(t))
	was := MIGStateOf(inv.GPUs)
	nvmltest.WithMIG(srv, 0)
	if got := was.Changes(ReadMIGState(srv, inv.Symbols(), []string{inv.GPUs[0].UUID})); len(got) != 0 {
		t.Errorf("changes = %q, want none", got)
	}
}

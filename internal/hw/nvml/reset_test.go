package nvml_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
)

func TestProcesses(t *testing.T) {
	s := nvmltest.NewDGXA100()
	nvmltest.SetProcesses(s, 1,
		[]gonvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 1 << 20}, {Pid: 12, UsedGpuMemory: 5 << 20}},
		[]gonvml.ProcessInfo{{Pid: 12, UsedGpuMemory: 7 << 20}})
	unsupported := nvmltest.Device(s, 2)
	unsupported.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	lost := nvmltest.Device(s, 3)
	lost.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_GPU_IS_LOST }
	inv := discover(t, s)
	r := nvml.NewResetter(s)

	for _, tc := range []struct {
		name    string
		gpu     int
		want    []nvml.Process
		wantErr error
	}{
		{"an idle GPU lists none", 0, []nvml.Process{}, nil},
		{"compute and graphics processes, each PID once with its larger figure", 1,
			[]nvml.Process{{PID: 12, UsedMemoryBytes: 7 << 20}, {PID: 300, UsedMemoryBytes: 1 << 20}}, nil},
		{"NOT_SUPPORTED is unknown, never idle", 2, nil, nvml.ErrProcessesUnknown},
		{"a lost GPU is an error, not idle", 3, nil, gonvml.ERROR_GPU_IS_LOST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Processes(inv.GPUs[tc.gpu].UUID)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && !slices.Equal(got, tc.want) {
				t.Errorf("Processes = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a library without the calls says so", func(t *testing.T) {
		s := nvmltest.NewDGXA100()
		inv := discover(t, s)
		nvmltest.WithoutSymbols(s, "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3")
		if _, err := nvml.NewResetter(s).Processes(inv.GPUs[0].UUID); !errors.Is(err, nvml.ErrProcessesUnknown) {
			t.Errorf("err = %v, want ErrProcessesUnknown", err)
		}
	})
}

func TestReset(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, srv *testDGX)
		// wantStep is "" for success.
		wantStep nvml.ResetStep
		wantLeft nvml.GPUState
		wantErr  error
		// wantCalls are the drain-state calls made, in order.
		wantCalls []string
	}{
		{
			name: "an idle GPU is drained, removed, rediscovered and back with drain off",
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true", "RemoveGpu 0000:0f:00.0", "DiscoverGpus",
				"QueryDrainState 0000:0f:00.0"},
		},
		{
			name: "a busy GPU is refused, nothing changed",
			prepare: func(t *testing.T, d *testDGX) {
				nvmltest.SetProcesses(d.srv, 1, []gonvml.ProcessInfo{{Pid: 42}}, nil)
			},
			wantStep: nvml.StepCheck, wantLeft: nvml.LeftInService, wantErr: nvml.ErrBusy,
		},
		{
			name: "processes NVML cannot list are refused, nothing changed",
			prepare: func(t *testing.T, d *testDGX) {
				nvmltest.Device(d.srv, 1).GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
					return nil, gonvml.ERROR_NOT_SUPPORTED
				}
			},
			wantStep: nvml.StepCheck, wantLeft: nvml.LeftInService, wantErr: nvml.ErrProcessesUnknown,
		},
		{
			name: "a library without the drain calls is refused, nothing changed",
			prepare: func(t *testing.T, d *testDGX) {
				nvmltest.WithoutSymbols(d.srv, "nvmlDeviceDiscoverGpus")
				d.r = nvml.NewResetter(d.srv)
			},
			wantStep: nvml.StepCheck, wantLeft: nvml.LeftInService, wantErr: nvml.ErrResetUnsupported,
		},
		{
			name:     "a GPU that cannot drain is unsupported, nothing changed",
			prepare:  func(t *testing.T, d *testDGX) { d.drain.Fail(nvmltest.CallModifyDrain, gonvml.ERROR_NOT_SUPPORTED) },
			wantStep: nvml.StepDrain, wantLeft: nvml.LeftInService, wantErr: nvml.ErrResetUnsupported,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true"},
		},
		{
			name:     "without root nothing changes",
			prepare:  func(t *testing.T, d *testDGX) { d.drain.Fail(nvmltest.CallModifyDrain, gonvml.ERROR_NO_PERMISSION) },
			wantStep: nvml.StepDrain, wantLeft: nvml.LeftInService, wantErr: gonvml.ERROR_NO_PERMISSION,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true"},
		},
		{
			name:     "a failed removal turns the drain state off again",
			prepare:  func(t *testing.T, d *testDGX) { d.drain.Fail(nvmltest.CallRemove, gonvml.ERROR_UNKNOWN) },
			wantStep: nvml.StepRemove, wantLeft: nvml.LeftInService, wantErr: gonvml.ERROR_UNKNOWN,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true", "RemoveGpu 0000:0f:00.0",
				"ModifyDrainState 0000:0f:00.0 false"},
		},
		{
			name: "a removal refused and an undrain failing leave it draining",
			prepare: func(t *testing.T, d *testDGX) {
				d.drain.Fail(nvmltest.CallRemove, gonvml.ERROR_IN_USE)
				d.failUndrain = true
			},
			wantStep: nvml.StepRemove, wantLeft: nvml.LeftDraining, wantErr: nvml.ErrBusy,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true", "RemoveGpu 0000:0f:00.0",
				"ModifyDrainState 0000:0f:00.0 false"},
		},
		{
			name:     "a failed rediscovery leaves it removed and says so",
			prepare:  func(t *testing.T, d *testDGX) { d.drain.Fail(nvmltest.CallDiscover, gonvml.ERROR_OPERATING_SYSTEM) },
			wantStep: nvml.StepDiscover, wantLeft: nvml.LeftRemoved, wantErr: gonvml.ERROR_OPERATING_SYSTEM,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true", "RemoveGpu 0000:0f:00.0", "DiscoverGpus"},
		},
		{
			name: "a GPU that comes back under another address is not taken for it",
			prepare: func(t *testing.T, d *testDGX) {
				dev := nvmltest.Device(d.srv, 1)
				calls := 0
				dev.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
					calls++
					if calls > 1 {
						return nvmltest.PciInfo("0000:99:00.0"), gonvml.SUCCESS
					}
					return nvmltest.PciInfo(nvmltest.GPUAddress(1)), gonvml.SUCCESS
				}
			},
			wantStep: nvml.StepReturn, wantLeft: nvml.LeftUnknown,
			wantCalls: []string{"ModifyDrainState 0000:0f:00.0 true", "RemoveGpu 0000:0f:00.0", "DiscoverGpus"},
		},
		{
			name:     "a cancelled context changes nothing",
			prepare:  func(t *testing.T, d *testDGX) { d.cancel() },
			wantStep: nvml.StepCheck, wantLeft: nvml.LeftInService, wantErr: context.Canceled,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDGX(t)
			if tc.prepare != nil {
				tc.prepare(t, d)
			}
			err := d.r.Reset(d.ctx, d.inv.GPUs[1])
			if tc.wantStep == "" {
				if err != nil {
					t.Fatalf("Reset: %v", err)
				}
			} else {
				var re *nvml.ResetError
				if !errors.As(err, &re) || re.Step != tc.wantStep || re.Left != tc.wantLeft || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
					t.Fatalf("Reset = %v, want a ResetError at %s leaving the GPU %s, wrapping %v", err, tc.wantStep, tc.wantLeft, tc.wantErr)
				}
				if !strings.Contains(err.Error(), string(tc.wantLeft)) || !strings.Contains(err.Error(), d.inv.GPUs[1].UUID) {
					t.Errorf("message %q does not name the GPU and how it is left", err)
				}
			}
			if got := d.drain.Calls(); !slices.Equal(got, tc.wantCalls) {
				t.Errorf("calls:\n%q\nwant:\n%q", got, tc.wantCalls)
			}
			if d.drain.Removed(1) != (tc.wantLeft == nvml.LeftRemoved) {
				t.Errorf("removed = %v, want %v", d.drain.Removed(1), tc.wantLeft == nvml.LeftRemoved)
			}
			if !d.drain.Removed(1) && d.drain.Draining(1) != (tc.wantLeft == nvml.LeftDraining) {
				t.Errorf("draining = %v, want %v", d.drain.Draining(1), tc.wantLeft == nvml.LeftDraining)
			}
		})
	}
}

// testDGX is a mock DGX A100 with drain states and a Resetter on it.
type testDGX struct {
	srv         *dgxa100.Server
	drain       *nvmltest.Drain
	inv         *nvml.Inventory
	r           *nvml.Resetter
	ctx         context.Context
	cancel      context.CancelFunc
	failUndrain bool
}

func newTestDGX(t *testing.T) *testDGX {
	d := &testDGX{srv: nvmltest.NewDGXA100()}
	d.drain = nvmltest.WithDrain(d.srv)
	modify := d.srv.DeviceModifyDrainStateFunc
	d.srv.DeviceModifyDrainStateFunc = func(p *gonvml.PciInfo, state gonvml.EnableState) gonvml.Return {
		if d.failUndrain && state == gonvml.FEATURE_DISABLED {
			d.drain.Fail(nvmltest.CallModifyDrain, gonvml.ERROR_UNKNOWN)
		}
		return modify(p, state)
	}
	d.inv = discover(t, d.srv)
	d.r = nvml.NewResetter(d.srv)
	d.ctx, d.cancel = context.WithCancel(context.Background())
	t.Cleanup(d.cancel)
	return d
}

func TestCondition(t *testing.T) {
	s := nvmltest.NewDGXA100()
	hot := nvmltest.Device(s, 2)
	hot.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 91, gonvml.SUCCESS }
	hot.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return nvml.ReasonHWSlowdown, gonvml.SUCCESS }
	broken := nvmltest.Device(s, 3)
	broken.GetFieldValuesFunc = nvmltest.RecoveryActionValues(func() gonvml.DeviceGpuRecoveryAction { return gonvml.GPU_RECOVERY_ACTION_GPU_RESET })
	broken.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, false, gonvml.SUCCESS }
	lost := nvmltest.Device(s, 4)
	nvmltest.WithMIG(s, 5)
	vgpu := nvmltest.Device(s, 6)
	vgpu.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED }
	drain := nvmltest.WithDrain(s)
	inv := discover(t, s)
	// GPU 7 is left draining (a reset whose caller died before the removal).
	pci, _ := nvmltest.Device(s, 7).GetPciInfo()
	if ret := s.DeviceModifyDrainState(&pci, gonvml.FEATURE_ENABLED); ret != gonvml.SUCCESS || !drain.Draining(7) {
		t.Fatalf("ModifyDrainState: %v", ret)
	}
	lost.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
	if err := nvml.SetComputeMode(s, inv.GPUs[1].UUID, true); err != nil {
		t.Fatal(err)
	}
	r := nvml.NewResetter(s)
	for _, tc := range []struct {
		name       string
		gpu        int
		wantFaults []string
		check      func(t *testing.T, c nvml.Condition)
	}{
		{"a healthy GPU is clean, in default compute mode, MIG off", 0, nil, func(t *testing.T, c nvml.Condition) {
			if c.ComputeMode != nvml.ComputeDefault || c.MIGEnabled || !c.MIGCapable || c.SlowdownC != nvmltest.SlowdownC {
				t.Errorf("condition = %+v", c)
			}
		}},
		{"the compute mode is read", 1, nil, func(t *testing.T, c nvml.Condition) {
			if c.ComputeMode != nvml.ComputeExclusiveProcess {
				t.Errorf("compute mode = %v, want exclusive-process", c.ComputeMode)
			}
		}},
		{"heat and hardware slowdown are faults", 2, []string{"thermal=91C>=slowdown 90C", "hw-slowdown"}, nil},
		{"a recovery action and a pending row remap are faults", 3, []string{"recovery-action=reset", "row-remap-pending"}, nil},
		{"a lost GPU is one fault", 4, []string{"gpu-lost"}, nil},
		{"MIG mode is read now", 5, nil, func(t *testing.T, c nvml.Condition) {
			if !c.MIGEnabled {
				t.Errorf("MIGEnabled = false, want true")
			}
		}},
		{"an unsupported signal is no fault", 6, nil, func(t *testing.T, c nvml.Condition) {
			if c.Unsupported != nvml.SignalRemappedRows {
				t.Errorf("Unsupported = %v, want remapped-rows", c.Unsupported)
			}
		}},
		{"a drain state left on is a fault", 7, []string{"drain-state=on"}, func(t *testing.T, c nvml.Condition) {
			if !c.Draining {
				t.Errorf("Draining = false, want true")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := r.Condition(inv.GPUs[tc.gpu].UUID)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Faults(); !slices.Equal(got, tc.wantFaults) {
				t.Errorf("Faults = %q, want %q", got, tc.wantFaults)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
	t.Run("a GPU without drain states is no fault; another error reading it is an error", func(t *testing.T) {
		drain.Fail(nvmltest.CallQueryDrain, gonvml.ERROR_NOT_SUPPORTED)
		if c, err := r.Condition(inv.GPUs[7].UUID); err != nil || c.Draining || len(c.Faults()) != 0 {
			t.Errorf("Condition with NOT_SUPPORTED = %+v, %v; want clean", c, err)
		}
		drain.Fail(nvmltest.CallQueryDrain, gonvml.ERROR_UNKNOWN)
		if _, err := r.Condition(inv.GPUs[7].UUID); !errors.Is(err, gonvml.ERROR_UNKNOWN) {
			t.Errorf("Condition with UNKNOWN: %v, want that error", err)
		}
	})
}

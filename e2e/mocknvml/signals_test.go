package mocknvml

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

var builtR470 struct {
	sync.Once
	path string
	err  error
}

// testLibR470 builds the R470-era variant once for the test binary.
func testLibR470(t *testing.T) string {
	t.Helper()
	builtR470.Do(func() { builtR470.path, builtR470.err = BuildR470(filepath.Join(buildDir, "r470")) })
	if builtR470.err != nil {
		t.Fatal(builtR470.err)
	}
	return builtR470.path
}

// dynamicFuncs lists the functions a library defines, as nm -D
// --defined-only prints them; without nm it reads the ELF itself.
func dynamicFuncs(t *testing.T, lib string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if nm, err := exec.LookPath("nm"); err == nil {
		b, err := exec.Command(nm, "-D", "--defined-only", lib).Output()
		if err != nil {
			t.Fatalf("nm -D %s: %v", lib, err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 3 && (f[1] == "T" || f[1] == "W") {
				out[f[2]] = true
			}
		}
		return out
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			out[s.Name] = true
		}
	}
	return out
}

// TestBuildR470 pins what the old-driver variant exports: nothing newer
// than R470, and every older function the plugin calls.
func TestBuildR470(t *testing.T) {
	lib := testLibR470(t)
	if filepath.Dir(lib) == filepath.Dir(testLib(t)) {
		t.Fatalf("R470 library built over the normal one in %s", filepath.Dir(lib))
	}
	old, cur := dynamicFuncs(t, lib), dynamicFuncs(t, testLib(t))
	for _, name := range R470Missing() {
		if old[name] {
			t.Errorf("R470 build exports %s", name)
		}
		if !cur[name] {
			t.Errorf("normal build lacks %s", name)
		}
	}
	for _, name := range pluginCalls {
		if !old[name] && !slices.Contains(R470Missing(), name) {
			t.Errorf("R470 build lacks %s, which R470 has", name)
		}
	}
	for name := range cur {
		if !old[name] && !slices.Contains(R470Missing(), name) {
			t.Errorf("R470 build lacks %s; add it to R470Missing or export it", name)
		}
	}
}

func TestR470Queries(t *testing.T) {
	runChild(t, "TestChildR470Queries", envLib+"="+testLibR470(t),
		"MOCK_NVML_PROFILE="+profilePath("pcie-4gpu"),
		"MOCK_NVML_CONTROL="+filepath.Join(t.TempDir(), "control"))
}

// TestChildR470Queries: the old calls answer, the recovery-action field is
// unknown, and there is no recovery-action event.
func TestChildR470Queries(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	for _, name := range R470Missing() {
		if err := lib.Extensions().LookupSymbol(name); err == nil {
			t.Errorf("LookupSymbol(%s) found it", name)
		}
	}
	h, ret := lib.DeviceGetHandleByIndex(0)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	if temp, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS || temp != 30 {
		t.Errorf("GetTemperature = %d, %v", temp, ret)
	}
	if r, ret := h.GetCurrentClocksThrottleReasons(); ret != gonvml.SUCCESS || r != 0 {
		t.Errorf("GetCurrentClocksThrottleReasons = %#x, %v", r, ret)
	}
	v := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := h.GetFieldValues(v); ret != gonvml.SUCCESS || gonvml.Return(v[0].NvmlReturn) != gonvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetFieldValues = %v, field %v; want the field unknown (INVALID_ARGUMENT)", ret, gonvml.Return(v[0].NvmlReturn))
	}
	if ev, ret := h.GetSupportedEventTypes(); ret != gonvml.SUCCESS || ev&gonvml.EventTypeGpuRecoveryAction != 0 {
		t.Errorf("GetSupportedEventTypes = %#x, %v; want no recovery-action event", ev, ret)
	}
}

func TestHealthSignals(t *testing.T) {
	profile := writeProfile(t, `
driver 550.54.15
defaults name="Mock" memory=1024 temp=40 slowdown=90 shutdown=95
gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 mig=off
gpu 1 uuid=GPU-1 bus=2:0.0 minor=1 mig=on
gpu 2 uuid=GPU-2 bus=3:0.0 minor=2 unsupported=temp,throttle,recovery,remap
`)
	dir := t.TempDir()
	runChild(t, "TestChildHealthSignals", "MOCK_NVML_PROFILE="+profile,
		"MOCK_NVML_CONTROL="+filepath.Join(dir, "control"), "MOCK_NVML_LOG="+filepath.Join(dir, "log"))
}

func recoveryAction(t *testing.T, h gonvml.Device) (uint32, gonvml.Return) {
	t.Helper()
	v := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}, {FieldId: gonvml.FI_DEV_ECC_CURRENT}}
	if ret := h.GetFieldValues(v); ret != gonvml.SUCCESS {
		return 0, ret
	}
	if r := gonvml.Return(v[1].NvmlReturn); r != gonvml.ERROR_NOT_SUPPORTED {
		t.Errorf("another field answered %v, want NOT_SUPPORTED", r)
	}
	if r := gonvml.Return(v[0].NvmlReturn); r != gonvml.SUCCESS {
		return 0, r
	}
	if v[0].ValueType != uint32(gonvml.VALUE_TYPE_UNSIGNED_INT) {
		t.Errorf("value type %d, want unsigned int", v[0].ValueType)
	}
	return binary.NativeEndian.Uint32(v[0].Value[:4]), gonvml.SUCCESS
}

// TestChildHealthSignals: MIG mode and unsupported signals from the
// profile; recovery action, remapped rows and transient errors injected.
func TestChildHealthSignals(t *testing.T) {
	childOnly(t)
	e := &faultEnv{}
	ctl, err := OpenControl(os.Getenv("MOCK_NVML_CONTROL"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	e.ctl = ctl
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	var h [3]gonvml.Device
	for i := range h {
		var ret gonvml.Return
		if h[i], ret = lib.DeviceGetHandleByIndex(i); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
	}

	t.Run("MIG mode comes from the profile; absent is NOT_SUPPORTED", func(t *testing.T) {
		for i, want := range []int{gonvml.DEVICE_MIG_DISABLE, gonvml.DEVICE_MIG_ENABLE} {
			if cur, pending, ret := h[i].GetMigMode(); ret != gonvml.SUCCESS || cur != want || pending != want {
				t.Errorf("GPU %d GetMigMode = %d %d %v, want %d", i, cur, pending, ret, want)
			}
		}
		if _, _, ret := h[2].GetMigMode(); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GPU 2 GetMigMode = %v, want NOT_SUPPORTED", ret)
		}
	})

	t.Run("unsupported signals answer NOT_SUPPORTED", func(t *testing.T) {
		if _, ret := h[2].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetTemperature = %v", ret)
		}
		if _, ret := h[2].GetTemperatureV().V1(); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetTemperatureV = %v", ret)
		}
		if _, ret := h[2].GetCurrentClocksEventReasons(); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetCurrentClocksEventReasons = %v", ret)
		}
		if _, ret := h[2].GetCurrentClocksThrottleReasons(); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetCurrentClocksThrottleReasons = %v", ret)
		}
		if _, ret := recoveryAction(t, h[2]); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("recovery field = %v", ret)
		}
		if _, _, _, _, ret := h[2].GetRemappedRows(); ret != gonvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetRemappedRows = %v", ret)
		}
		if temp, ret := h[0].GetTemperatureV().V1(); ret != gonvml.SUCCESS || temp.Temperature != 40 {
			t.Errorf("GPU 0 GetTemperatureV = %+v, %v", temp, ret)
		}
	})

	t.Run("recovery action reads back and raises its event", func(t *testing.T) {
		set, ret := lib.EventSetCreate()
		if ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		defer set.Free()
		if ret := h[0].RegisterEvents(gonvml.EventTypeGpuRecoveryAction, set); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		if a, ret := recoveryAction(t, h[0]); ret != gonvml.SUCCESS || a != uint32(gonvml.GPU_RECOVERY_ACTION_NONE) {
			t.Fatalf("recovery action = %d, %v; want none", a, ret)
		}
		for _, c := range []struct {
			word string
			want gonvml.DeviceGpuRecoveryAction
		}{{"reboot", gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT}, {"drain", gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P}, {"none", gonvml.GPU_RECOVERY_ACTION_NONE}} {
			e.inject(t, "recovery 0 "+c.word)
			wantEvent(t, set, h[0], gonvml.EventTypeGpuRecoveryAction, 0)
			if a, ret := recoveryAction(t, h[0]); ret != gonvml.SUCCESS || a != uint32(c.want) {
				t.Errorf("after %s: recovery action = %d, %v; want %d", c.word, a, ret, c.want)
			}
		}
		if err := ctl.Inject("recovery 0 pray"); !errors.Is(err, ErrRejected) {
			t.Errorf("bad action: err = %v, want ErrRejected", err)
		}
	})

	t.Run("remapped rows", func(t *testing.T) {
		for _, c := range []struct {
			word             string
			pending, failure bool
		}{{"pending", true, false}, {"failure", false, true}, {"none", false, false}} {
			e.inject(t, "remap 0 "+c.word)
			if _, _, pending, failure, ret := h[0].GetRemappedRows(); ret != gonvml.SUCCESS || pending != c.pending || failure != c.failure {
				t.Errorf("after remap %s: pending %v failure %v %v", c.word, pending, failure, ret)
			}
		}
	})

	t.Run("a transient error fails the next calls on that GPU only", func(t *testing.T) {
		e.inject(t, "transient 0 2")
		for k := range 2 {
			if _, ret := h[0].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.ERROR_UNKNOWN {
				t.Errorf("call %d = %v, want UNKNOWN", k, ret)
			}
			if _, ret := h[1].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS {
				t.Errorf("GPU 1 = %v during GPU 0's transient error", ret)
			}
		}
		if _, ret := h[0].GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS {
			t.Errorf("third call = %v, want SUCCESS", ret)
		}
	})

	t.Run("recover clears recovery action, remapped rows and transient errors", func(t *testing.T) {
		e.inject(t, "recovery 1 reset")
		e.inject(t, "remap 1 failure")
		e.inject(t, "transient 1 100")
		e.inject(t, "recover 1")
		if a, ret := recoveryAction(t, h[1]); ret != gonvml.SUCCESS || a != 0 {
			t.Errorf("recovery action = %d, %v", a, ret)
		}
		if _, _, pending, failure, ret := h[1].GetRemappedRows(); ret != gonvml.SUCCESS || pending || failure {
			t.Errorf("remapped rows pending %v failure %v %v", pending, failure, ret)
		}
	})
}

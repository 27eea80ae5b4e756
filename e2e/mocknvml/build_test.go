package mocknvml

import (
	"debug/elf"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pluginCalls are the NVML symbols the device plugin reaches through
// go-nvml (which picks the newest version the library exports). A missing
// one aborts the process at its first call, so each must be exported.
var pluginCalls = []string{
	"nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
	"nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
	"nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
	"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
	"nvmlDeviceGetMinorNumber", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
	"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetTopologyCommonAncestor",
	"nvmlDeviceGetP2PStatus", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo_v2",
	"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureThreshold",
	"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
	"nvmlDeviceGetSupportedEventTypes", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents",
	"nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlDeviceGetArchitecture",
	"nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetBrand",
	"nvmlDeviceGetTemperatureV", "nvmlDeviceGetMigMode", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetFieldValues",
	// MIG discovery.
	"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceIsMigDeviceHandle",
	"nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
	"nvmlDeviceGetAttributes_v2", "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo",
	"nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceProfileInfoV",
}

// migCreateCalls are the NVML symbols that create and destroy MIG
// instances (DRA's partitionable MIG devices, and their neighbours).
var migCreateCalls = []string{
	"nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements",
	"nvmlDeviceGetGpuInstanceRemainingCapacity", "nvmlDeviceCreateGpuInstance",
	"nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlDeviceGetGpuInstances", "nvmlGpuInstanceDestroy",
	"nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
	"nvmlGpuInstanceGetComputeInstances", "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
	"nvmlGpuInstanceGetComputeInstancePossiblePlacements", "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
	"nvmlComputeInstanceDestroy",
}

// resetCalls are the NVML symbols a GPU's reset reaches: its processes,
// then drain, removal and rediscovery (internal/hw/nvml's Reset).
var resetCalls = []string{
	"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
	"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2",
	"nvmlDeviceGetPersistenceMode", "nvmlDeviceModifyDrainState", "nvmlDeviceQueryDrainState",
	"nvmlDeviceRemoveGpu_v2", "nvmlDeviceRemoveGpu", "nvmlDeviceDiscoverGpus",
}

// gfdCalls are the NVML symbols NVIDIA's GPU Feature Discovery reaches
// beyond pluginCalls (go-nvlib's MIG profile of a MIG device), so that it
// labels the same mock node (e2e/gfdcompare).
var gfdCalls = []string{
	"nvmlGpuInstanceGetComputeInstanceById", "nvmlComputeInstanceGetInfo_v2",
	"nvmlGpuInstanceGetComputeInstanceProfileInfo",
}

// v1Layouts are versioned calls whose v1 struct differs from the one the
// library fills; exporting them would let an old caller overrun its buffer.
var v1Layouts = []string{"nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlEventSetWait", "nvmlComputeInstanceGetInfo",
	"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"}

func TestBuildExportsPluginCalls(t *testing.T) {
	f, err := elf.Open(testLib(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported[s.Name] = true
			if !strings.HasPrefix(s.Name, "nvml") && !strings.HasPrefix(s.Name, "_") {
				t.Errorf("exports %s: helpers must be static", s.Name)
			}
		}
	}
	for _, name := range slices.Concat(pluginCalls, gfdCalls, migCreateCalls, resetCalls) {
		if !exported[name] {
			t.Errorf("%s is not exported", name)
		}
	}
	for _, name := range v1Layouts {
		if exported[name] {
			t.Errorf("%s is exported, but the library fills only the newer struct", name)
		}
	}
	if soname, _ := f.DynString(elf.DT_SONAME); len(soname) != 1 || soname[0] != LibraryName {
		t.Errorf("soname = %v, want %s", soname, LibraryName)
	}
}

func TestBuildReusesLibrary(t *testing.T) {
	lib := testLib(t)
	before, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(filepath.Dir(lib))
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != lib || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("second Build gave %s (modified %v), want %s untouched (%v)", again, after.ModTime(), lib, before.ModTime())
	}
}

// TestMakefileMatchesBuild keeps the Makefile's flags equal to Build's.
func TestMakefileMatchesBuild(t *testing.T) {
	b, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^(?:CFLAGS|LDFLAGS) := (.*)$`).FindAllStringSubmatch(string(b), -1) {
		flags = append(flags, strings.Fields(m[1])...)
	}
	if strings.Join(flags, " ") != strings.Join(cflags, " ") {
		t.Errorf("Makefile flags:\n%s\nbuild.go flags:\n%s", strings.Join(flags, " "), strings.Join(cflags, " "))
	}
}

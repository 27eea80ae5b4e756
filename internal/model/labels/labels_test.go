package labels

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
)

const h100Bytes = 85520809984 // 81559 MiB

func h100s(n int) []nvml.GPU {
	var gpus []nvml.GPU
	for i := range n {
		gpus = append(gpus, nvml.GPU{
			Index: i, UUID: "GPU-h100-" + string(rune('a'+i)), Name: "NVIDIA H100 80GB HBM3", MemoryBytes: h100Bytes,
			PCIBusID: "0000:1" + string(rune('0'+i)) + ":00.0", MIGCapable: true, CUDAComputeCapability: "9.0",
		})
	}
	return gpus
}

func compute3D(gpus []nvml.GPU) map[string]uint32 {
	m := map[string]uint32{}
	for _, g := range gpus {
		m[g.PCIBusID] = class3D
	}
	return m
}

func facts(gpus []nvml.GPU) Facts {
	return Facts{
		Inventory:   &nvml.Inventory{GPUs: gpus, DriverVersion: "550.54.15", CUDADriverVersion: 12040},
		MIGStrategy: gpu.MIGNone,
		Machine:     "DGX H100",
		PCIClass:    compute3D(gpus),
	}
}

// A DGX H100: the labels GFD sets there, key for key.
func TestDGXH100(t *testing.T) {
	got := Compute(facts(h100s(8)))
	want := Labels{
		"nvidia.com/cuda.driver-version.full":     "550.54.15",
		"nvidia.com/cuda.driver-version.major":    "550",
		"nvidia.com/cuda.driver-version.minor":    "54",
		"nvidia.com/cuda.driver-version.revision": "15",
		"nvidia.com/cuda.driver.major":            "550",
		"nvidia.com/cuda.driver.minor":            "54",
		"nvidia.com/cuda.driver.rev":              "15",
		"nvidia.com/cuda.runtime-version.full":    "12.4",
		"nvidia.com/cuda.runtime-version.major":   "12",
		"nvidia.com/cuda.runtime-version.minor":   "4",
		"nvidia.com/cuda.runtime.major":           "12",
		"nvidia.com/cuda.runtime.minor":           "4",
		"nvidia.com/gpu.compute.major":            "9",
		"nvidia.com/gpu.compute.minor":            "0",
		"nvidia.com/gpu.count":                    "8",
		"nvidia.com/gpu.family":                   "hopper",
		"nvidia.com/gpu.machine":                  "DGX-H100",
		"nvidia.com/gpu.memory":                   "81559",
		"nvidia.com/gpu.mode":                     "compute",
		"nvidia.com/gpu.product":                  "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.replicas":                 "1",
		"nvidia.com/gpu.sharing-strategy":         "none",
		"nvidia.com/mig.capable":                  "true",
		"nvidia.com/mps.capable":                  "false",
	}
	diff(t, got, want)
	if bad := got.Invalid(); len(bad) > 0 {
		t.Errorf("invalid label values: %v", bad)
	}
}

func diff(t *testing.T, got, want Labels) {
	t.Helper()
	for _, k := range want.Keys() {
		if got[k] != want[k] {
			t.Errorf("%s = %q, want %q", k, got[k], want[k])
		}
	}
	for _, k := range got.Keys() {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s=%q", k, got[k])
		}
	}
}

func TestNoGPUsNoLabels(t *testing.T) {
	if l := Compute(facts(nil)); len(l) != 0 {
		t.Errorf("labels without GPUs: %v", l)
	}
	if l := Compute(Facts{}); len(l) != 0 {
		t.Errorf("labels without an inventory: %v", l)
	}
}

// Mixed models: the model with the most GPUs, whatever the order; a tie
// goes to the lowest-indexed GPU's model; the same answer every time.
func TestMixedModels(t *testing.T) {
	a100 := nvml.GPU{Name: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, CUDAComputeCapability: "8.0"}
	mk := func(models ...string) []nvml.GPU {
		var gpus []nvml.GPU
		for i, m := range models {
			g := h100s(1)[0]
			if m == "a" {
				g = a100
			}
			g.Index, g.PCIBusID, g.UUID = i, "0000:2"+string(rune('0'+i))+":00.0", "GPU-"+string(rune('0'+i))
			gpus = append(gpus, g)
		}
		return gpus
	}
	for _, tt := range []struct {
		models       []string
		product      string
		count, memMi string
	}{
		{[]string{"a", "h", "h"}, "NVIDIA-H100-80GB-HBM3", "2", "81559"},
		{[]string{"h", "a", "a"}, "NVIDIA-A100-SXM4-40GB", "2", "40960"},
		{[]string{"a", "h"}, "NVIDIA-A100-SXM4-40GB", "1", "40960"},
		{[]string{"h", "a"}, "NVIDIA-H100-80GB-HBM3", "1", "81559"},
	} {
		f := facts(mk(tt.models...))
		first := Compute(f)
		for range 20 {
			if again := Compute(f); !maps.Equal(first, again) {
				t.Fatalf("%v: labels changed between runs", tt.models)
			}
		}
		if first["nvidia.com/gpu.product"] != tt.product || first["nvidia.com/gpu.count"] != tt.count || first["nvidia.com/gpu.memory"] != tt.memMi {
			t.Errorf("%v: product %s count %s memory %s; want %s %s %s", tt.models,
				first["nvidia.com/gpu.product"], first["nvidia.com/gpu.count"], first["nvidia.com/gpu.memory"], tt.product, tt.count, tt.memMi)
		}
	}
}

func TestTimeSlicing(t *testing.T) {
	for _, tt := range []struct {
		name     string
		ts       sharing.TimeSlicing
		product  string
		replicas string
		strategy string
	}{
		{"shared, not renamed", sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4}}}},
			"NVIDIA-H100-80GB-HBM3-SHARED", "4", "time-slicing"},
		{"renamed", sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4, Rename: "nvidia.com/gpu.small"}}}},
			"NVIDIA-H100-80GB-HBM3", "4", "time-slicing"},
		{"renamed by default", sharing.TimeSlicing{Rules: sharing.Rules{RenameByDefault: true, Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 2}}}},
			"NVIDIA-H100-80GB-HBM3", "2", "time-slicing"},
		{"another model shared", sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4, Devices: []string{"NVIDIA A10"}}}}},
			"NVIDIA-H100-80GB-HBM3", "1", "none"},
	} {
		f := facts(h100s(2))
		f.TimeSlicing = tt.ts
		l := Compute(f)
		if l["nvidia.com/gpu.product"] != tt.product || l["nvidia.com/gpu.replicas"] != tt.replicas || l["nvidia.com/gpu.sharing-strategy"] != tt.strategy {
			t.Errorf("%s: product %s replicas %s strategy %s", tt.name, l["nvidia.com/gpu.product"], l["nvidia.com/gpu.replicas"], l["nvidia.com/gpu.sharing-strategy"])
		}
	}
}

func TestMPS(t *testing.T) {
	for _, tt := range []struct {
		name                        string
		mps                         sharing.MPS
		ts                          sharing.TimeSlicing
		product, replicas, strategy string
		capable                     string
	}{
		{name: "shared, not renamed", mps: sharing.MPS{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 8}}}},
			product: "NVIDIA-H100-80GB-HBM3-SHARED", replicas: "8", strategy: "mps", capable: "true"},
		{name: "renamed by default", mps: sharing.MPS{Rules: sharing.Rules{RenameByDefault: true, Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4}}}},
			product: "NVIDIA-H100-80GB-HBM3", replicas: "4", strategy: "mps", capable: "true"},
		{name: "another model", mps: sharing.MPS{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4, Devices: []string{"NVIDIA A10"}}}}},
			product: "NVIDIA-H100-80GB-HBM3", replicas: "1", strategy: "none", capable: "false"},
		{name: "one GPU each way", mps: sharing.MPS{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4, Rename: "example.com/mps", Devices: []string{"GPU-1"}}}}},
			ts:      sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 2, Devices: []string{"GPU-0"}}}}},
			product: "NVIDIA-H100-80GB-HBM3-SHARED", replicas: "2", strategy: "time-slicing", capable: "true"},
	} {
		gpus := h100s(2)
		for i := range gpus {
			gpus[i].UUID = fmt.Sprintf("GPU-%d", i)
		}
		f := facts(gpus)
		f.MPS, f.TimeSlicing = tt.mps, tt.ts
		l := Compute(f)
		if l["nvidia.com/gpu.product"] != tt.product || l["nvidia.com/gpu.replicas"] != tt.replicas || l["nvidia.com/gpu.sharing-strategy"] != tt.strategy || l["nvidia.com/mps.capable"] != tt.capable {
			t.Errorf("%s: product %s replicas %s strategy %s mps.capable %s", tt.name, l["nvidia.com/gpu.product"], l["nvidia.com/gpu.replicas"], l["nvidia.com/gpu.sharing-strategy"], l["nvidia.com/mps.capable"])
		}
	}
}

func migGPU(g nvml.GPU, profiles ...string) nvml.GPU {
	g.MIGEnabled = true
	for i, p := range profiles {
		slices := int(p[0] - '0')
		g.MIG = append(g.MIG, nvml.MIGDevice{
			UUID: g.UUID + "-mig-" + string(rune('0'+i)), Index: i, Profile: p, MemoryBytes: uint64(slices) * 10 << 30,
			Multiprocessors: 16 * slices, Slices: nvml.Slices{GPUInstance: slices, ComputeInstance: slices},
			Engines: nvml.Engines{Copy: slices, Decoder: slices, JPEG: 1, OFA: 1},
		})
	}
	return g
}

func TestMIGMixed(t *testing.T) {
	gpus := h100s(3)
	gpus[0] = migGPU(gpus[0], "1g.10gb", "1g.10gb", "3g.40gb", "1g.10gb+me")
	gpus[1] = migGPU(gpus[1], "1g.10gb")
	f := facts(gpus)
	f.MIGStrategy = gpu.MIGMixed
	l := Compute(f)
	want := map[string]string{
		"nvidia.com/mig.strategy":                 "mixed",
		"nvidia.com/mig-1g.10gb.product":          "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
		"nvidia.com/mig-1g.10gb.count":            "3",
		"nvidia.com/mig-1g.10gb.replicas":         "1",
		"nvidia.com/mig-1g.10gb.sharing-strategy": "none",
		"nvidia.com/mig-1g.10gb.memory":           "10240",
		"nvidia.com/mig-1g.10gb.multiprocessors":  "16",
		"nvidia.com/mig-1g.10gb.slices.gi":        "1",
		"nvidia.com/mig-1g.10gb.slices.ci":        "1",
		"nvidia.com/mig-1g.10gb.engines.copy":     "1",
		"nvidia.com/mig-1g.10gb.engines.decoder":  "1",
		"nvidia.com/mig-1g.10gb.engines.encoder":  "0",
		"nvidia.com/mig-1g.10gb.engines.jpeg":     "1",
		"nvidia.com/mig-1g.10gb.engines.ofa":      "1",
		"nvidia.com/mig-3g.40gb.count":            "1",
		"nvidia.com/mig-3g.40gb.product":          "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
		"nvidia.com/mig-3g.40gb.multiprocessors":  "48",
		"nvidia.com/mig-1g.10gb.me.product":       "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me", // GFD: "+" as "."
		"nvidia.com/gpu.count":                    "3",                                    // GFD counts MIG-mode GPUs too
		"nvidia.com/gpu.product":                  "NVIDIA-H100-80GB-HBM3",
		// GPU 2 is whole: the model's labels are its, as GFD's, though GPU 0 is in MIG mode.
		"nvidia.com/gpu.replicas": "1",
	}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("%s = %q, want %q", k, l[k], v)
		}
	}
	if bad := l.Invalid(); len(bad) > 0 {
		t.Errorf("invalid labels: %v", bad)
	}
}

// GFD labels a model whose GPUs are all in MIG mode unshared (replicas 0),
// time-slicing or not, and one with a whole GPU as that GPU is shared.
func TestMIGModeReplicas(t *testing.T) {
	ts := sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4}}}}
	for _, tt := range []struct {
		name               string
		migOn              []bool
		ts                 sharing.TimeSlicing
		replicas, strategy string
	}{
		{"all in MIG mode", []bool{true, true}, sharing.TimeSlicing{}, "0", "none"},
		{"all in MIG mode, time-slicing", []bool{true, true}, ts, "0", "none"},
		{"first in MIG mode", []bool{true, false}, sharing.TimeSlicing{}, "1", "none"},
		{"first in MIG mode, time-slicing", []bool{true, false}, ts, "4", "time-slicing"},
	} {
		gpus := h100s(len(tt.migOn))
		for i, on := range tt.migOn {
			if on {
				gpus[i] = migGPU(gpus[i], "1g.10gb")
			}
		}
		f := facts(gpus)
		f.MIGStrategy = gpu.MIGMixed
		f.TimeSlicing = tt.ts
		l := Compute(f)
		if l["nvidia.com/gpu.replicas"] != tt.replicas || l["nvidia.com/gpu.sharing-strategy"] != tt.strategy {
			t.Errorf("%s: replicas %s strategy %s, want %s %s", tt.name, l["nvidia.com/gpu.replicas"], l["nvidia.com/gpu.sharing-strategy"], tt.replicas, tt.strategy)
		}
	}
}

func TestMIGSingle(t *testing.T) {
	all := func(profiles ...[]string) Facts {
		gpus := h100s(len(profiles))
		for i, p := range profiles {
			if p != nil {
				gpus[i] = migGPU(gpus[i], p...)
			}
		}
		f := facts(gpus)
		f.MIGStrategy = gpu.MIGSingle
		return f
	}
	l := Compute(all([]string{"1g.10gb", "1g.10gb"}, []string{"1g.10gb"}))
	for k, v := range map[string]string{
		"nvidia.com/mig.strategy":         "single",
		"nvidia.com/gpu.product":          "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
		"nvidia.com/gpu.count":            "3",
		"nvidia.com/gpu.memory":           "10240",
		"nvidia.com/gpu.multiprocessors":  "16",
		"nvidia.com/gpu.slices.gi":        "1",
		"nvidia.com/gpu.replicas":         "1",
		"nvidia.com/gpu.sharing-strategy": "none",
		"nvidia.com/gpu.family":           "hopper",
	} {
		if l[k] != v {
			t.Errorf("valid single: %s = %q, want %q", k, l[k], v)
		}
	}
	for name, f := range map[string]Facts{
		"two profiles":          all([]string{"1g.10gb"}, []string{"3g.40gb"}),
		"a GPU with MIG off":    all([]string{"1g.10gb"}, nil),
		"a MIG GPU without any": all([]string{"1g.10gb"}, []string{}),
	} {
		l := Compute(f)
		if l["nvidia.com/gpu.product"] != "NVIDIA-H100-80GB-HBM3-MIG-INVALID" || l["nvidia.com/gpu.count"] != "0" || l["nvidia.com/gpu.memory"] != "0" {
			t.Errorf("%s: product %s count %s memory %s, want the INVALID labels", name, l["nvidia.com/gpu.product"], l["nvidia.com/gpu.count"], l["nvidia.com/gpu.memory"])
		}
	}
	// No GPU in MIG mode: single changes nothing but says so.
	l = Compute(all(nil, nil))
	if l["nvidia.com/gpu.product"] != "NVIDIA-H100-80GB-HBM3" || l["nvidia.com/mig.strategy"] != "single" {
		t.Errorf("single without MIG: %s, %s", l["nvidia.com/gpu.product"], l["nvidia.com/mig.strategy"])
	}
}

func TestModeAndMachine(t *testing.T) {
	gpus := h100s(2)
	f := facts(gpus)
	f.PCIClass = map[string]uint32{gpus[0].PCIBusID: class3D, gpus[1].PCIBusID: classVGA}
	f.Machine = "  Super Server (r) X12 / " + strings.Repeat("long-name ", 10)
	l := Compute(f)
	if l["nvidia.com/gpu.mode"] != "unknown" {
		t.Errorf("mixed classes: mode %q", l["nvidia.com/gpu.mode"])
	}
	if bad := l.Invalid(); len(bad) > 0 {
		t.Errorf("invalid values %v: machine %q", bad, l["nvidia.com/gpu.machine"])
	}
	f.PCIClass = map[string]uint32{gpus[0].PCIBusID: classVGA, gpus[1].PCIBusID: classVGA}
	f.Machine = ""
	l = Compute(f)
	if l["nvidia.com/gpu.mode"] != "graphics" || l["nvidia.com/gpu.machine"] != "unknown" {
		t.Errorf("mode %q machine %q", l["nvidia.com/gpu.mode"], l["nvidia.com/gpu.machine"])
	}
	f.PCIClass = nil
	if l := Compute(f); l["nvidia.com/gpu.mode"] != "unknown" {
		t.Errorf("no classes: mode %q", l["nvidia.com/gpu.mode"])
	}
}

func TestFamily(t *testing.T) {
	for cc, want := range map[[2]int]string{{7, 0}: "volta", {7, 5}: "turing", {8, 0}: "ampere", {8, 9}: "ada-lovelace", {9, 0}: "hopper", {10, 0}: "blackwell", {12, 0}: "blackwell", {4, 0}: "undefined"} {
		if got := family(cc[0], cc[1]); got != want {
			t.Errorf("family(%d.%d) = %q, want %q", cc[0], cc[1], got, want)
		}
	}
}

// KeyPattern covers every key Compute returns, whatever the strategy,
// sharing or MIG profiles, and none of the other nvidia.com/ labels found
// on GPU nodes.
func TestKeyPattern(t *testing.T) {
	plain := facts(h100s(2))
	shared := facts(h100s(2))
	shared.TimeSlicing = sharing.TimeSlicing{Rules: sharing.Rules{Resources: []sharing.Resource{{Name: "nvidia.com/gpu", Replicas: 4}}}}
	mixedGPUs := h100s(2)
	mixedGPUs[0] = migGPU(mixedGPUs[0], "1g.10gb", "1g.10gb+me", "1c.3g.40gb")
	mixed := facts(mixedGPUs)
	mixed.MIGStrategy = gpu.MIGMixed
	single := facts([]nvml.GPU{migGPU(h100s(1)[0], "1g.10gb")})
	single.MIGStrategy = gpu.MIGSingle
	invalid := facts([]nvml.GPU{migGPU(h100s(2)[0], "1g.10gb"), h100s(2)[1]})
	invalid.MIGStrategy = gpu.MIGSingle
	gb200 := facts(inDomain(h100s(2), 7))
	gb200.VGPU = &sysfs.VGPU{Present: true, HostDriverVersion: "570.133.20", HostDriverBranch: "r570_00"}
	seen := map[string]bool{}
	for name, f := range map[string]Facts{"plain": plain, "shared": shared, "mixed": mixed, "single": single, "single, invalid": invalid, "clique, vGPU": gb200} {
		for _, k := range Compute(f).Keys() {
			seen[k] = true
			if !IsKey(k) {
				t.Errorf("%s: %s does not match KeyPattern", name, k)
			}
		}
	}
	for _, k := range []string{"nvidia.com/mig-1g.10gb.me.engines.ofa", "nvidia.com/mig-1c.3g.40gb.count", "nvidia.com/gpu.engines.copy", "nvidia.com/cuda.driver-version.full",
		"nvidia.com/gpu.clique", "nvidia.com/vgpu.present", "nvidia.com/vgpu.host-driver-version", "nvidia.com/vgpu.host-driver-branch"} {
		if !seen[k] {
			t.Errorf("no fixture computed %s", k)
		}
	}
	for _, k := range []string{
		"nvidia.com/gpu.present", "nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/mig.config",
		"nvidia.com/mig.config.state", "nvidia.com/device-plugin.config", "nvidia.com/gfd.timestamp", "nvidia.com/gpu.clique.x", "nvidia.com/vgpu.config",
		"nvidia.com/gpu.count.x", "x.nvidia.com/gpu.count", "example.com/gpu.count", "nvidia.com/gpu-driver-upgrade-state",
		"nvidia.com/mig-.count", "nvidia.com/gpu.workload.config", "kubernetes.io/hostname",
	} {
		if IsKey(k) {
			t.Errorf("%s matches KeyPattern", k)
		}
	}
}

// MaxKeys holds what Compute returns on the largest node: two GPU models
// in MIG mode, each with every one of NVML's 18 GPU-instance profiles in
// use (the mixed strategy), or the single strategy's MIG attributes.
func TestMaxKeys(t *testing.T) {
	profiles := func(memGB int) []string {
		var out []string
		for i := range maxMIGProfiles / 2 {
			out = append(out, fmt.Sprintf("%dg.%dgb", i%7+1, memGB+i))
		}
		return out
	}
	for _, tt := range []struct {
		name     string
		strategy string
		gpus     func() []nvml.GPU
		want     int
	}{
		{"no MIG", gpu.MIGNone, func() []nvml.GPU { return h100s(2) }, nodeWideKeys - 1},
		{"single, one profile", gpu.MIGSingle, func() []nvml.GPU {
			g := h100s(2)
			return []nvml.GPU{migGPU(g[0], "1g.10gb"), migGPU(g[1], "1g.10gb")}
		}, nodeWideKeys + 8},
		{"mixed, two models with every profile", gpu.MIGMixed, func() []nvml.GPU {
			g := h100s(3)
			g[1].Name = "NVIDIA H200"
			return []nvml.GPU{migGPU(g[0], profiles(10)...), migGPU(g[1], profiles(100)...), g[2]}
		}, MaxKeys},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := facts(inDomain(tt.gpus(), 3))
			f.MIGStrategy = tt.strategy
			f.VGPU = &sysfs.VGPU{Present: true, HostDriverVersion: "570.133.20", HostDriverBranch: "r570_00"}
			l := Compute(f)
			if len(l) != tt.want || len(l) > MaxKeys {
				t.Errorf("%d keys, want %d (MaxKeys %d): %v", len(l), tt.want, MaxKeys, l.Keys())
			}
			for k := range l {
				if !IsKey(k) || len(k) > len(Prefix)+63 {
					t.Errorf("key %s: not ours, or longer than the chart's policy allows", k)
				}
			}
		})
	}
}

const clusterUUID = "6c3f2a1e-9b7d-4e58-a0c4-1d2e3f405162"

// inDomain registers every GPU in clique of one NVLink domain.
func inDomain(gpus []nvml.GPU, clique uint32) []nvml.GPU {
	for i := range gpus {
		gpus[i].Fabric = &nvml.Fabric{ClusterUUID: clusterUUID, CliqueID: clique, State: nvml.FabricCompleted}
	}
	return gpus
}

// gpu.clique names the one domain and clique the registered GPUs share,
// and nothing when they are not one, as GFD has it.
func TestClique(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func([]nvml.GPU)
		want string
	}{
		{"one clique", func([]nvml.GPU) {}, clusterUUID + ".7"},
		{"no fabric", func(g []nvml.GPU) {
			for i := range g {
				g[i].Fabric = nil
			}
		}, ""},
		{"a GPU still registering is left out", func(g []nvml.GPU) {
			g[1].Fabric = &nvml.Fabric{State: nvml.FabricInProgress, Status: "not ready"}
		}, clusterUUID + ".7"},
		{"a failed registration is left out", func(g []nvml.GPU) {
			g[1].Fabric.CliqueID, g[1].Fabric.Status = 8, "unknown error"
		}, clusterUUID + ".7"},
		{"two cliques", func(g []nvml.GPU) { g[2].Fabric.CliqueID, g[3].Fabric.CliqueID = 8, 8 }, ""},
		{"two domains", func(g []nvml.GPU) { g[3].Fabric.ClusterUUID = "7d4f3b2e-0c8e-4f69-b1d5-2e3f40516273" }, ""},
		{"clique 0", func(g []nvml.GPU) {
			for i := range g {
				g[i].Fabric.CliqueID = 0
			}
		}, clusterUUID + ".0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gpus := inDomain(h100s(4), 7)
			tt.edit(gpus)
			l := Compute(facts(gpus))
			if got := l["nvidia.com/gpu.clique"]; got != tt.want {
				t.Errorf("gpu.clique = %q, want %q", got, tt.want)
			}
			if bad := l.Invalid(); len(bad) > 0 {
				t.Errorf("invalid labels: %v", bad)
			}
		})
	}
}

// vgpu.present is set wherever the config space could be read (false on
// bare metal, as GFD has it), the host's driver where a vGPU names it.
func TestVGPU(t *testing.T) {
	for _, tt := range []struct {
		name string
		vgpu *sysfs.VGPU
		// virt is every GPU's NVML virtualization mode.
		virt string
		want map[string]string
	}{
		{"config space unreadable, NVML silent", nil, "", map[string]string{}},
		{"config space unreadable, NVML says vGPU", nil, nvml.VirtualizationVGPU, map[string]string{"nvidia.com/vgpu.present": "true"}},
		{"config space unreadable, NVML says bare metal", nil, nvml.VirtualizationNone, map[string]string{"nvidia.com/vgpu.present": "false"}},
		{"config space unreadable, NVML says passthrough", nil, nvml.VirtualizationPassthrough, map[string]string{"nvidia.com/vgpu.present": "false"}},
		{"config space wins over NVML", &sysfs.VGPU{}, nvml.VirtualizationVGPU, map[string]string{"nvidia.com/vgpu.present": "false"}},
		{"bare metal", &sysfs.VGPU{}, "", map[string]string{"nvidia.com/vgpu.present": "false"}},
		{"vGPU guest", &sysfs.VGPU{Present: true, HostDriverVersion: "550.54.16", HostDriverBranch: "r550_00"}, "",
			map[string]string{"nvidia.com/vgpu.present": "true", "nvidia.com/vgpu.host-driver-version": "550.54.16", "nvidia.com/vgpu.host-driver-branch": "r550_00"}},
		{"vGPU without a host record", &sysfs.VGPU{Present: true}, "", map[string]string{"nvidia.com/vgpu.present": "true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := facts(h100s(2))
			for i := range f.Inventory.GPUs {
				f.Inventory.GPUs[i].Virtualization = tt.virt
			}
			f.VGPU = tt.vgpu
			got := map[string]string{}
			for k, v := range Compute(f) {
				if strings.HasPrefix(k, "nvidia.com/vgpu.") {
					got[k] = v
				}
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("vgpu labels %v, want %v", got, tt.want)
			}
		})
	}
}

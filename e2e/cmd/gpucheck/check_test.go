package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

func TestUniqueUUIDs(t *testing.T) {
	tests := []struct {
		name string
		gpus []listedGPU
		want bool
	}{
		{"distinct", []listedGPU{{UUID: "GPU-a"}, {UUID: "GPU-b", MIG: []listedMIG{{UUID: "MIG-c"}}}}, true},
		{"two GPUs alike", []listedGPU{{UUID: "GPU-a"}, {UUID: "GPU-a"}}, false},
		{"a MIG device repeats a GPU", []listedGPU{{UUID: "GPU-a", MIG: []listedMIG{{UUID: "GPU-a"}}}}, false},
		{"an empty UUID", []listedGPU{{UUID: ""}}, false},
	}
	for _, tt := range tests {
		if got := uniqueUUIDs(tt.gpus); got != tt.want {
			t.Errorf("%s: uniqueUUIDs = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSysfsNUMA(t *testing.T) {
	root := t.TempDir()
	for bus, v := range map[string]string{"0000:18:00.0": "1\n", "0000:19:00.0": "-1\n", "0000:1a:00.0": "x\n"} {
		dir := filepath.Join(root, "bus/pci/devices", bus)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// NVML's bus IDs are upper case; sysfs's lower.
	if n, err := sysfsNUMA(root, "0000:18:00.0"); err != nil || n != 1 {
		t.Errorf("numa of 18:00.0 = %d, %v; want 1", n, err)
	}
	if n, err := sysfsNUMA(root, "0000:19:00.0"); err != nil || n != -1 {
		t.Errorf("numa of 19:00.0 = %d, %v; want -1", n, err)
	}
	if _, err := sysfsNUMA(root, "0000:1A:00.0"); err == nil {
		t.Error("a numa_node that is no number was read")
	}
	if _, err := sysfsNUMA(root, "0000:99:00.0"); err == nil {
		t.Error("a missing device was read")
	}
}

func TestParseProbe(t *testing.T) {
	out := "noise\ncudaprobe: {\"visibleDevices\":\"void\",\"devNodes\":[\"/dev/nvidia0\"],\"ldconfig\":[],\"mockLibrary\":false,\"cuInit\":0,\"cuDeviceGetCount\":0,\"count\":1,\"devices\":[{\"name\":\"NVIDIA H200\",\"uuid\":\"GPU-1\"}]}\n"
	p, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != 1 || p.CuInit == nil || *p.CuInit != 0 || p.Devices[0].UUID != "GPU-1" || p.VisibleDevices != "void" {
		t.Errorf("parsed %+v", p)
	}
	// The opt-in fields: directory listings, and an allocation's CUresults.
	out = `cudaprobe: {"visibleDevices":"void","devNodes":[],"listed":{"/tmp/nvidia-mps":["control"],"/dev/shm":[]},"listErrors":{"/x":"No such file or directory"},"ldconfig":[],"mockLibrary":false,"cuInit":0,"cuDeviceGetCount":0,"count":1,"devices":[],"allocMiB":61440,"ctxCreate":0,"memFreeMiB":70000,"memTotalMiB":71680,"memAlloc":2}`
	p, err = parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Listed, map[string][]string{"/tmp/nvidia-mps": {"control"}, "/dev/shm": {}}) || p.ListErrors["/x"] == "" {
		t.Errorf("listings %v, errors %v", p.Listed, p.ListErrors)
	}
	if p.AllocMiB != 61440 || p.CtxCreate == nil || *p.CtxCreate != 0 || p.MemAlloc == nil || *p.MemAlloc != cudaOutOfMemory || p.MemTotalMiB != 71680 || p.MemFreeMiB != 70000 {
		t.Errorf("allocation %+v", p)
	}
	p, err = parseProbe(`cudaprobe: {"allocMiB":5,"allocError":"libcuda.so.1 lacks cuDeviceGet, cuCtxCreate_v2 or cuMemAlloc_v2"}`)
	if err != nil || p.CtxCreate != nil || p.MemAlloc != nil || p.AllocError == "" {
		t.Errorf("a library without the calls: %+v, %v", p, err)
	}
	if _, err := parseProbe("cudaprobe: {\n"); err == nil {
		t.Error("a cut report parsed")
	}
	if _, err := parseProbe("nothing"); err == nil {
		t.Error("no report parsed")
	}
}

// The probe's judgement: each way a container can be wrong fails a check.
func TestJudgeProbe(t *testing.T) {
	zero := 0
	good := probeReport{
		VisibleDevices: "void", DevNodes: []string{"/dev/nvidia0", "/dev/nvidiactl"},
		LDConfig: []string{"libcuda.so.1 (libc6,x86-64) => /usr/lib64/libcuda.so.1"},
		CuInit:   &zero, CuCount: &zero, Count: 1,
		Devices: []struct {
			Name string `json:"name"`
			UUID string `json:"uuid"`
		}{{Name: "NVIDIA H200", UUID: "GPU-0"}},
	}
	c := &checker{listed: &listing{GPUs: []listedGPU{{UUID: "GPU-0", Minor: 0}, {UUID: "GPU-1", Minor: 1}}}}
	failed := func(p probeReport, gpus ...string) []string {
		s := &Step{}
		c.judgeProbe(s, "x", &p, gpus)
		var out []string
		for _, ch := range s.Checks {
			if !ch.OK {
				out = append(out, ch.Name)
			}
		}
		return out
	}
	if f := failed(good, "GPU-0"); len(f) > 0 {
		t.Fatalf("a good container failed %v", f)
	}
	bad := map[string]func(p *probeReport){
		"x: NVIDIA_VISIBLE_DEVICES is void":             func(p *probeReport) { p.VisibleDevices = "all" },
		"x: ld cache lists libcuda.so.1":                func(p *probeReport) { p.LDConfig = nil },
		"x: its GPUs' device nodes":                     func(p *probeReport) { p.DevNodes = []string{"/dev/nvidia1"} },
		"x: dlopen libcuda.so.1":                        func(p *probeReport) { p.DlopenError = "libcuda.so.1: cannot open shared object file" },
		"x: the driver's libcuda":                       func(p *probeReport) { p.MockLibrary = true },
		"x: cuInit":                                     func(p *probeReport) { one := 100; p.CuInit = &one },
		"x: cuDeviceGetCount equals the GPUs allocated": func(p *probeReport) { p.Count = 2 },
		"x: CUDA sees the allocated GPUs' UUIDs":        func(p *probeReport) { p.Devices[0].UUID = "GPU-1" },
	}
	for want, spoil := range bad {
		p := good
		p.Devices = append(p.Devices[:0:0], good.Devices...)
		spoil(&p)
		if f := failed(p, "GPU-0"); len(f) == 0 || f[0] != want {
			t.Errorf("spoiled for %q: failed %v", want, f)
		}
	}
	// On the mock the stand-in must be what answered, and UUIDs are not compared.
	c.mock = true
	mock := good
	mock.MockLibrary = true
	mock.Devices = nil
	if f := failed(mock, "GPU-0"); len(f) > 0 {
		t.Errorf("the mock's stand-in failed %v", f)
	}
	if f := failed(good, "GPU-0"); len(f) == 0 {
		t.Error("on the mock node, a library that is not the stand-in passed")
	}
}

func TestStepStatus(t *testing.T) {
	s := &Step{}
	s.check("a", true, "")
	s.finish(time.Now())
	if s.Status != "pass" {
		t.Errorf("status %q, want pass", s.Status)
	}
	s.check("b", false, "broken %d", 1)
	s.finish(time.Now())
	if s.Status != "fail" {
		t.Errorf("status %q, want fail", s.Status)
	}
	empty := &Step{}
	empty.finish(time.Now())
	if empty.Status != "fail" {
		t.Error("a step that checked nothing passed")
	}
	skipped := &Step{Skipped: "not asked for"}
	skipped.finish(time.Now())
	if skipped.Status != "skip" {
		t.Errorf("status %q, want skip", skipped.Status)
	}
	s.Notes = []string{"a note"}
	r := &Report{Steps: []*Step{s, skipped}}
	if sum := r.summary(); !strings.Contains(sum, "FAIL b: broken 1") || !strings.Contains(sum, "FAILED") || !strings.Contains(sum, "\n   a note\n") {
		t.Errorf("summary lacks the failure or the note:\n%s", sum)
	}
}

// Every key of report.json is lowerCamelCase and documented in
// docs/gpu-check.md.
func TestReportKeys(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/gpu-check.md")
	if err != nil {
		t.Fatal(err)
	}
	camel := regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] || typ.PkgPath() != reflect.TypeOf(Report{}).PkgPath() && typ.PkgPath() != "github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness" {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if key == "" || key == "-" {
				t.Errorf("%s.%s has no JSON key", typ.Name(), f.Name)
				continue
			}
			if !camel.MatchString(key) {
				t.Errorf("%s.%s: key %q is not lowerCamelCase", typ.Name(), f.Name, key)
			}
			if !strings.Contains(string(doc), "`"+key+"`") {
				t.Errorf("%s.%s: key %q is not in docs/gpu-check.md", typ.Name(), f.Name, key)
			}
			walk(f.Type)
		}
	}
	for _, typ := range []any{Report{}, inventoryData{}, serveData{}, answer{}, healthData{}, containerRun{}, draData{}, mpsData{}} {
		walk(reflect.TypeOf(typ))
	}
}

// One replica's share, as the plugin must answer it.
func TestMPSShare(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		memory        uint64
		n, k          int
		threads       int
		mib           uint64
		pinnedEnvWant string
	}{
		{80 * gib, 2, 1, 50, 40960, "0=40960M"},
		{80 * gib, 2, 2, 100, 81920, "0=81920M"},
		{80 * gib, 3, 1, 33, 27306, "0=27306M"},     // 81920/3 rounded down
		{143771 << 20, 2, 1, 50, 71885, "0=71885M"}, // an H200's 143771 MiB, halved down
		{40 * gib, 48, 1, 2, 853, "0=853M"},
		{40 * gib, 200, 1, 1, 204, "0=204M"}, // threads never below 1%
		{0, 2, 1, 50, 0, ""},                 // memory unknown: no memory limit
	}
	for _, tt := range tests {
		threads, mib := mpsShare(tt.memory, tt.n, tt.k)
		if threads != tt.threads || mib != tt.mib {
			t.Errorf("share of %d of %d of %d bytes = %d%%, %d MiB; want %d%%, %d MiB", tt.k, tt.n, tt.memory, threads, mib, tt.threads, tt.mib)
		}
		mounts, env := mpsWant("/run/mps", "GPU-a", tt.memory, tt.n, tt.k)
		if want := []string{"/run/mps/GPU-a/pipe:/tmp/nvidia-mps", "/run/mps/GPU-a/shm:/dev/shm"}; !reflect.DeepEqual(mounts, want) {
			t.Errorf("mounts %v, want %v", mounts, want)
		}
		if env[mpsPinnedEnv] != tt.pinnedEnvWant || env[mpsPipeEnv] != "/tmp/nvidia-mps" || env[mpsThreadEnv] != strconv.Itoa(tt.threads) {
			t.Errorf("env %v", env)
		}
		if _, ok := env[mpsPinnedEnv]; ok != (tt.pinnedEnvWant != "") {
			t.Errorf("memory %d: pinned limit set %v", tt.memory, ok)
		}
	}
}

// Each way an MPS replica's answer can be wrong is named.
func TestMPSAnswerProblems(t *testing.T) {
	mounts, env := mpsWant("/r", "GPU-a", 80<<30, 2, 1)
	good := answer{
		Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", mpsPipeEnv: "/tmp/nvidia-mps", mpsThreadEnv: "50", mpsPinnedEnv: "0=40960M"},
		Mounts:     []string{"/r/GPU-a/pipe:/tmp/nvidia-mps", "/r/GPU-a/shm:/dev/shm"},
		CDIDevices: []string{"example.com/gpu=GPU-a"},
	}
	if bad := mpsAnswerProblems(good, mounts, env); len(bad) > 0 {
		t.Fatalf("a good answer: %v", bad)
	}
	spoil := map[string]func(a *answer){
		"no mount /r/GPU-a/shm:/dev/shm":                       func(a *answer) { a.Mounts = a.Mounts[:1] },
		"no mount /r/GPU-a/pipe:/tmp/nvidia-mps":               func(a *answer) { a.Mounts = []string{"/r/GPU-a/pipe:/tmp/nvidia-mps:ro", a.Mounts[1]} },
		`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100", want "50"`:   func(a *answer) { a.Envs[mpsThreadEnv] = "100" },
		`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="", want "0=40960M"`: func(a *answer) { delete(a.Envs, mpsPinnedEnv) },
		"no CDI device for the GPU":                            func(a *answer) { a.CDIDevices = nil },
	}
	for want, f := range spoil {
		a := good
		a.Envs = maps.Clone(good.Envs)
		a.Mounts = slices.Clone(good.Mounts)
		f(&a)
		if bad := mpsAnswerProblems(a, mounts, env); !reflect.DeepEqual(bad, []string{want}) {
			t.Errorf("spoiled for %q: %v", want, bad)
		}
	}
}

func TestSaid(t *testing.T) {
	var entries []harness.LogEntry
	for _, line := range []string{
		`{"time":"2026-11-27T12:00:00.5Z","level":"INFO","msg":"MPS control daemon up","gpu":"GPU-b"}`,
		`{"time":"2026-11-27T12:00:01.25Z","level":"INFO","msg":"MPS control daemon up","gpu":"GPU-a","adopted":false}`,
		`{"time":"2026-11-27T12:00:02Z","level":"INFO","msg":"MPS control daemon stopped answering","gpu":"GPU-a"}`,
		`{"time":"yesterday","level":"INFO","msg":"MPS control daemon up","gpu":"GPU-c"}`,
	} {
		var e harness.LogEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	want := time.Date(2026, 11, 27, 12, 0, 1, 250e6, time.UTC)
	if got, ok := said(entries[1], mpsDaemonUp, "GPU-a"); !ok || !got.Equal(want) {
		t.Errorf("said = %v, %v; want %v", got, ok, want)
	}
	for i, gpu := range map[int]string{0: "GPU-a", 2: "GPU-a", 3: "GPU-c"} {
		if _, ok := said(entries[i], mpsDaemonUp, gpu); ok {
			t.Errorf("entry %d taken as %q about %s", i, mpsDaemonUp, gpu)
		}
	}
}

// The answer's environment replaces the image's, not shadowed by it.
func TestSetEnv(t *testing.T) {
	env := setEnv([]string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}, "NVIDIA_VISIBLE_DEVICES=void", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "NVIDIA=x")
	want := []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "NVIDIA=x"}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("env %q, want %q", env, want)
	}
}

// The summary's lines say what the MPS step measured in each way, or why not.
func TestMPSNotes(t *testing.T) {
	zero, oom := 0, cudaOutOfMemory
	d := &mpsData{GPU: "GPU-a", Replicas: 2, ThreadPercentage: 50, ShareMiB: 40960, MemoryMiB: 81920,
		Runs: []*mpsRun{
			{Name: "hostPID", PIDNamespace: "host", UpToOfferedMs: 1.25, PipeFiles: []string{"control", "nvidia-cuda-mps-control.pid"}, DaemonThreads: "50.0", ComputeMode: "EXCLUSIVE_PROCESS",
				DaemonPid: 812, AfterStop: "answers", Cleanup: mpsCleanup{Done: []string{"sharing plugin stopped"}, DirGone: true, ComputeMode: "DEFAULT"}},
			{Name: "podPID", PIDNamespace: "own", DaemonPid: 7, AfterStop: "gone: quit: exit status 1"},
			{Name: "launcher", PIDNamespace: "own", Launcher: true, DaemonPid: 990, AfterStop: "answers", Restart: &mpsRestart{Adopted: true, DaemonPid: 990}},
		},
		Limit: []mpsAlloc{{Container: "container A", AllocMiB: 20480, CtxCreate: &zero, MemAlloc: &zero}, {Container: "container B", AllocMiB: 51200, CtxCreate: &zero, MemAlloc: &oom, MemTotalMiB: 40960}}}
	notes := strings.Join(mpsNotes(d), "\n")
	for _, want := range []string{"2 × nvidia.com/gpu.mps: 50% of its threads and 40960 MiB", "daemon up → shares offered 1.2 ms",
		"control, nvidia-cuda-mps-control.pid", "hostPID given back: sharing plugin stopped; directory gone true; compute mode DEFAULT",
		"podPID (plugin in a PID namespace of its own starts the daemon)", "once the plugin stopped, the daemon gone: quit",
		"launcher (plugin in a PID namespace of its own, mps-launcher in the host's starts the daemon)", "adopted=true, pid 990",
		"limit test (launcher; share 40960 MiB)", "container B 51200 MiB → cuCtxCreate 0, cuMemAlloc 2 (client saw 40960 MiB total)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	d.Limit, d.LimitSkipped = nil, mpsLimitNotRun
	if notes := strings.Join(mpsNotes(d), "\n"); !strings.Contains(notes, "limit test: "+mpsLimitNotRun) {
		t.Errorf("notes do not say the limit test was not run:\n%s", notes)
	}
}

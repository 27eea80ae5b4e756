package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
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
	r := &Report{Steps: []*Step{s, skipped}}
	if sum := r.summary(); !strings.Contains(sum, "FAIL b: broken 1") || !strings.Contains(sum, "FAILED") {
		t.Errorf("summary lacks the failure:\n%s", sum)
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
	for _, typ := range []any{Report{}, inventoryData{}, serveData{}, answer{}, healthData{}, containerRun{}, draData{}} {
		walk(reflect.TypeOf(typ))
	}
}

package cudaprobe

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// The helper's stdout, line by line: the last step begun, and the report.
func TestReportLines(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lines    []string
		step     cuda.Step
		reported bool
		want     cuda.Result
	}{
		{name: "a pass", lines: []string{"step load", "step cuInit", `result {"ok":true,"uuid":"GPU-1","durationMs":12.5}`},
			step: cuda.StepInit, reported: true, want: cuda.Result{OK: true, UUID: "GPU-1", Duration: 12500 * time.Microsecond}},
		{name: "a failure", lines: []string{"step cuInit", `result {"ok":false,"step":"cuInit","code":100,"name":"CUDA_ERROR_NO_DEVICE","durationMs":0}`},
			step: cuda.StepInit, reported: true, want: cuda.Result{Step: cuda.StepInit, Code: 100, Name: "CUDA_ERROR_NO_DEVICE"}},
		{name: "the driver's own lines are ignored", lines: []string{"NVRM: something", "step cuCtxCreate", "stepping"},
			step: cuda.StepContext},
		{name: "no report yet", lines: []string{"step cuInit", "step cuDeviceGetByPCIBusId"}, step: cuda.StepDevice},
		{name: "an unreadable report", lines: []string{"step cuInit", "result {"},
			step: cuda.StepInit, want: cuda.Result{Message: "unreadable report: result {: unexpected end of JSON input"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newReport()
			p.readStdout(strings.NewReader(strings.Join(tc.lines, "\n") + "\n"))
			r, step, reported := p.result()
			if r != tc.want || step != tc.step || reported != tc.reported {
				t.Errorf("got %+v, %q, %v; want %+v, %q, %v", r, step, reported, tc.want, tc.step, tc.reported)
			}
		})
	}
}

// A crash's first words and the driver's last ones are kept, the middle
// dropped.
func TestReportStderr(t *testing.T) {
	p := newReport()
	long := "fatal error: SIGSEGV\n" + strings.Repeat("goroutine\n", 2000) + "the last words"
	p.readStderr(strings.NewReader(long))
	r, _, _ := p.result()
	if !strings.HasPrefix(r.Stderr, "fatal error: SIGSEGV") || !strings.HasSuffix(r.Stderr, "the last words") ||
		!strings.Contains(r.Stderr, "\n…\n") || len(r.Stderr) > 2*stderrKeep+8 {
		t.Errorf("kept %d bytes: %.80q…%q", len(r.Stderr), r.Stderr, r.Stderr[max(0, len(r.Stderr)-40):])
	}
	short := newReport()
	short.readStderr(strings.NewReader("NVRM: a line\n"))
	if r, _, _ := short.result(); r.Stderr != "NVRM: a line" {
		t.Errorf("short stderr: %q", r.Stderr)
	}
}

// fakeProbe writes a shell script standing in for the plugin's executable,
// and a driver root with a libcuda.so.1 for Run to find.
func fakeProbe(t *testing.T, script string) Options {
	t.Helper()
	mpstest.NeedConfinement(t) // Run starts it in new namespaces
	dir := t.TempDir()
	self := filepath.Join(dir, "gpu-device-plugin")
	if err := os.WriteFile(self, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "driver", "usr", "lib64", cuda.LibraryName)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return Options{Self: self, DriverRoot: filepath.Join(dir, "driver"), PCIBusID: "00000000:3B:00.0", Minor: 2, Timeout: time.Minute}
}

// Run against a stand-in for the helper: what each outcome returns, and
// when the error says the GPU was not judged.
func TestRunFakeProbe(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  string
		timeout time.Duration
		want    cuda.Result // Duration and Stderr not compared
		wantErr string
	}{
		{name: "its arguments", script: `[ "$*" = "cuda-probe --library=$(dirname "$0")/driver/usr/lib64/libcuda.so.1 --dev-root=/dev --sys-root=/sys --minor=2 --pci-bus-id=00000000:3B:00.0 --uuid= --alloc-bytes=0" ] &&
echo 'result {"ok":true}' || echo "$*" >&2`,
			want: cuda.Result{OK: true}},
		{name: "its environment", script: `[ "$(env | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^_=')" = "PATH=/usr/sbin:/usr/bin:/sbin:/bin" ] && echo 'result {"ok":true}' || env >&2`,
			want: cuda.Result{OK: true}},
		{name: "a failed step is a verdict", script: `echo step cuInit; echo 'result {"ok":false,"step":"cuInit","code":100,"name":"CUDA_ERROR_NO_DEVICE"}'; exit 1`,
			want: cuda.Result{Step: cuda.StepInit, Code: 100, Name: "CUDA_ERROR_NO_DEVICE"}},
		{name: "a failed load is not", script: `echo 'result {"ok":false,"step":"load","message":"loading x: no such file"}'; exit 1`,
			want:    cuda.Result{Step: cuda.StepLoad, Message: "loading x: no such file"},
			wantErr: "failed at load: loading x: no such file"},
		{name: "nor is a failed confinement", script: `echo step confine; echo 'result {"ok":false,"step":"confine","message":"pivot_root: EINVAL"}'; exit 1`,
			want:    cuda.Result{Step: cuda.StepConfine, Message: "pivot_root: EINVAL"},
			wantErr: "failed at confine"},
		{name: "an exit without a report in CUDA", script: `echo step cuCtxCreate; echo 'NVRM: Xid 79' >&2; exit 2`,
			want: cuda.Result{Step: cuda.StepContext, Message: "the probe ended without a report: exit status 2"}},
		{name: "an exit before any step", script: `echo 'cuda-probe: not PID 1' >&2; exit 1`,
			want:    cuda.Result{Message: "the probe ended without a report: exit status 1"},
			wantErr: "exit status 1: cuda-probe: not PID 1"},
		{name: "a hang, and what it started, killed", timeout: 2 * time.Second,
			script: `echo step cuInit; sh -c "sleep 1000; : $0" & sh -c "sleep 1001; : $0"`,
			want:   cuda.Result{Step: cuda.StepInit, TimedOut: true, Message: "no answer in 2s: killed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := fakeProbe(t, tc.script)
			if tc.timeout > 0 {
				o.Timeout = tc.timeout
			}
			r, err := Run(context.Background(), o)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v; want %q", err, tc.wantErr)
			}
			r.Duration, r.Stderr = 0, ""
			if r != tc.want {
				t.Errorf("got  %+v\nwant %+v", r, tc.want)
			}
			if left := processes(o.Self); len(left) > 0 {
				t.Errorf("processes left: %v", left)
			}
		})
	}
}

// Options Run refuses before starting anything.
func TestRunRefuses(t *testing.T) {
	withLib := fakeProbe(t, "exit 0")
	for _, tc := range []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"a relative executable", func(o *Options) { o.Self = "gpu-device-plugin" }, "not an absolute path"},
		{"no GPU named", func(o *Options) { o.PCIBusID, o.UUID = "", "" }, "no PCI bus ID or UUID"},
		{"a negative minor", func(o *Options) { o.Minor = -1 }, "minor number -1"},
		{"no libcuda.so.1", func(o *Options) { o.DriverRoot = t.TempDir() }, "no libcuda.so.1 under the driver root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := withLib
			tc.change(&o)
			r, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || r.OK {
				t.Errorf("%+v, %v; want an error saying %q", r, err, tc.want)
			}
		})
	}
}

// Started by hand, not through Run, the helper refuses before it mounts
// anything.
func TestMainRefusesOutsideItsNamespaces(t *testing.T) {
	err := Main([]string{"--library=/x/libcuda.so.1", "--minor=0", "--pci-bus-id=00000000:3B:00.0"})
	if err == nil || !strings.Contains(err.Error(), "not PID 1") {
		t.Errorf("err = %v; want a refusal", err)
	}
	for _, args := range [][]string{
		{"--minor=0", "--pci-bus-id=x"},
		{"--library=/x", "--pci-bus-id=x"},
		{"--library=/x", "--minor=0"},
		{"--library=/x", "--minor=0", "--uuid=GPU-1", "extra"},
		{"--bogus"},
	} {
		if err := Main(args); err == nil || strings.Contains(err.Error(), "PID 1") {
			t.Errorf("Main(%q) = %v; want a usage error", args, err)
		}
	}
}

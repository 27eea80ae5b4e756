package main

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
)

// fakePlugin answers the remediation's paths on a Unix socket in a
// temporary directory as a running plugin would, from canned answers; it
// records the GPUs it was asked to release.
type fakePlugin struct {
	socket   string
	status   int
	answer   remediate.Answer
	released []string
}

func startFakePlugin(t *testing.T, status int, answer remediate.Answer) *fakePlugin {
	t.Helper()
	f := &fakePlugin{socket: filepath.Join(t.TempDir(), "health.sock"), status: status, answer: answer}
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		json.NewEncoder(w).Encode(f.answer)
	}
	mux.HandleFunc("GET "+remediate.PathStatus, func(w http.ResponseWriter, _ *http.Request) { write(w) })
	mux.HandleFunc("POST "+remediate.PathRelease, func(w http.ResponseWriter, r *http.Request) {
		var req remediate.ReleaseRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.released = append(f.released, req.GPU)
		write(w)
	})
	ln, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

func exitCode(err error) int {
	var exit cli.ExitCoder
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return 1
}

// remediation release: 0 and what the GPU was when the plugin gave it
// back; 1 with the plugin's reason when it refuses (an unknown GPU named,
// a GPU not out for a human with its state, remediation off naming
// remediation.enabled) or cannot be asked; 2 for a usage mistake, before
// anything is asked.
func TestRemediationRelease(t *testing.T) {
	needsHuman := &remedy.Status{GPU: "GPU-1", State: remedy.StateNeedsHuman, Reason: "the reset failed: not supported"}
	for _, tc := range []struct {
		name   string
		status int
		answer remediate.Answer
		args   []string // after release and --health-socket; nil: GPU-1
		code   int
		want   string // in stdout when 0, in the error else
		asked  bool
	}{
		{name: "released", status: http.StatusOK, answer: remediate.Answer{Released: needsHuman}, code: 0, asked: true,
			want: "released GPU-1: it was needsHuman (the reset failed: not supported); it is offered again"},
		{name: "unknown GPU", status: http.StatusNotFound, answer: remediate.Answer{Code: remediate.CodeUnknownGPU, Error: "GPU-1: no such GPU on this node"}, code: 1, asked: true,
			want: "remediation release: GPU-1: no such GPU on this node"},
		{name: "not out for a human", status: http.StatusConflict, answer: remediate.Answer{Code: remediate.CodeNotTerminal, State: remedy.StateDraining}, code: 1, asked: true,
			want: "remediation release: GPU-1 is draining, not needsHuman or needsReboot: only those wait for a human; nothing changed"},
		{name: "remediation off", status: http.StatusServiceUnavailable, answer: remediate.Answer{Code: remediate.CodeOff, Error: "remediation is off on this plugin: remediation.enabled is false"}, code: 1, asked: true,
			want: "remediation release: remediation is off on this plugin: remediation.enabled is false"},
		{name: "no GPU", args: []string{}, code: 2, want: "remediation release: name one GPU by its UUID"},
		{name: "two GPUs", args: []string{"GPU-1", "GPU-2"}, code: 2, want: "name one GPU"},
		{name: "an index", args: []string{"3"}, code: 2, want: "name one GPU by its UUID (GPU-…)"},
		{name: "a flag after the GPU", args: []string{"GPU-1", "--log-level=debug"}, code: 2, want: "give --log-level=debug before the GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakePlugin(t, tc.status, tc.answer)
			args := tc.args
			if args == nil {
				args = []string{"GPU-1"}
			}
			out, _, err := run(t, mockOpen, append([]string{"remediation", "release", "--health-socket", f.socket}, args...)...)
			if got := exitCode(err); got != tc.code {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.code)
			}
			text := out
			if err != nil {
				text = err.Error()
			}
			if !strings.Contains(text, tc.want) {
				t.Errorf("said %q, want %q", text, tc.want)
			}
			if asked := len(f.released) > 0; asked != tc.asked {
				t.Errorf("asked the plugin: %t, want %t (%v)", asked, tc.asked, f.released)
			}
		})
	}
}

// Without --health-socket, a usage mistake; a socket nobody answers on,
// 1 naming it.
func TestRemediationReleaseSocket(t *testing.T) {
	_, _, err := run(t, mockOpen, "remediation", "release", "GPU-1")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "set --health-socket") {
		t.Errorf("no socket: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "health.sock")
	_, _, err = run(t, mockOpen, "remediation", "release", "--health-socket", missing, "GPU-1")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), missing) {
		t.Errorf("no plugin: %v", err)
	}
	_, _, err = run(t, mockOpen, "remediation")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "say status or release") {
		t.Errorf("no subcommand: %v", err)
	}
}

// remediation status: the plugin's view of every GPU, as a table or as
// its JSON.
func TestRemediationStatus(t *testing.T) {
	since := time.Date(2026, 11, 27, 6, 1, 0, 0, time.UTC)
	f := startFakePlugin(t, http.StatusOK, remediate.Answer{GPUs: []remedy.Status{
		{GPU: "GPU-0", State: remedy.StateServing},
		{GPU: "GPU-1", State: remedy.StateDraining, Decision: remedy.DecisionReset, Reason: "xid=48", Waiting: "1 holder(s) on GPU-1", Since: since, Resets: 1},
		{GPU: "GPU-9", State: remedy.StateNeedsReboot, Decision: remedy.DecisionReboot, Reason: "xid=79", Absent: true},
	}})
	out, _, err := run(t, mockOpen, "remediation", "status", "--health-socket", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	// Compared with single spaces: the columns' widths are tabwriter's.
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"GPU STATE DECISION SINCE RESETS WHY GPU-0 serving - - 0 - ",
		"GPU-1 draining reset 2026-11-27T06:01:00Z 1 xid=48; waiting: 1 holder(s) on GPU-1 ",
		"GPU-9 (not on the node) needsReboot reboot - 0 xid=79",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	out, _, err = run(t, mockOpen, "remediation", "status", "-o", "json", "--health-socket", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ GPUs []remedy.Status }
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.GPUs) != 3 || !got.GPUs[2].Absent || !strings.Contains(out, `"waiting": "1 holder(s) on GPU-1"`) {
		t.Errorf("json %v:\n%s", err, out)
	}
	f.status, f.answer = http.StatusServiceUnavailable, remediate.Answer{Code: remediate.CodeOff, Error: "remediation is off on this plugin: remediation.enabled is false"}
	if _, _, err := run(t, mockOpen, "remediation", "status", "--health-socket", f.socket); exitCode(err) != 1 || !strings.Contains(err.Error(), "remediation.enabled is false") {
		t.Errorf("off: %v", err)
	}
}

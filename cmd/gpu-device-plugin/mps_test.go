package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// mps-exec is the plugin's own helper: hidden from help and from the
// commands a stray word is told about, and a bad spec is a one-line error.
func TestMPSExecHidden(t *testing.T) {
	out, _, err := run(t, mockOpen, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "mps-exec") {
		t.Errorf("help lists the hidden mps-exec:\n%s", out)
	}
	_, _, err = run(t, mockOpen, "lst")
	if err == nil || strings.Contains(err.Error(), "mps-exec") {
		t.Errorf("err = %v; want the commands without mps-exec", err)
	}
	for _, arg := range []string{"{", "--help"} {
		_, _, err = run(t, mockOpen, "mps-exec", arg)
		if err == nil || !strings.Contains(err.Error(), "mps-exec spec: not a valid spec") || strings.Contains(err.Error(), "\n") {
			t.Errorf("mps-exec %s: err = %v; want one line saying the spec is not valid", arg, err)
		}
	}
}

// mps-launch is hidden as mps-exec is; mps-launcher needs its socket, and
// a plugin's start through a launcher that is not there fails in one line.
func TestMPSLauncherCommands(t *testing.T) {
	out, _, err := run(t, mockOpen, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "mps-launch ") || !strings.Contains(out, "mps-launcher") {
		t.Errorf("help should list mps-launcher and not the hidden mps-launch:\n%s", out)
	}
	if _, _, err := run(t, mockOpen, "mps-launcher"); err == nil || !strings.Contains(err.Error(), "--mps-launcher-socket") {
		t.Errorf("mps-launcher without a socket: %v", err)
	}
	sock := filepath.Join(t.TempDir(), "launcher.sock")
	_, _, err = run(t, mockOpen, "mps-launch", sock, "GPU-8c1e7d5a-0000-4000-8000-000000000001")
	if err == nil || !strings.Contains(err.Error(), "does not answer") || strings.Contains(err.Error(), "\n") {
		t.Errorf("mps-launch with no launcher: %v; want one line saying it does not answer", err)
	}
}

// The test binary is the helper too, as the plugin's executable is.
func TestMain(m *testing.M) {
	mpsexec.RunIfHelper()
	runIfCUDAProbe()
	os.Exit(m.Run())
}

// list asks the MPS control daemon of each GPU shared through MPS, which
// the serving plugin runs, whether it is up and how many clients it has.
func TestListMPS(t *testing.T) {
	mpstest.NeedConfinement(t)
	root, bin := mpstest.DriverRoot(t)
	mpsRoot := filepath.Join(t.TempDir(), "mps")
	cfg := configFile(t, "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n")
	args := []string{"list", "-o", "json", "--config", cfg, "--driver-root", root, "--dev-root", "/dev", "--mps-root", mpsRoot, "--sysfs-root", t.TempDir()}
	listed := func() []listedGPU {
		t.Helper()
		out, _, err := run(t, fixedUUIDs, args...)
		if err != nil {
			t.Fatal(err)
		}
		var l listing
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatal(err)
		}
		return l.GPUs
	}
	gpus := listed()
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs", len(gpus))
	}
	for _, g := range gpus {
		if g.Sharing != "mps" || g.MPS == nil || g.MPS.Daemon != "down" || g.MPS.Error == "" {
			t.Errorf("no daemon running: %s %q %+v", g.UUID, g.Sharing, g.MPS)
		}
		if g.Health != "Unhealthy" || g.Reason != mpsd.ReasonDown {
			t.Errorf("no daemon running: %s is %s %q, want Unhealthy %s as serve has it", g.UUID, g.Health, g.Reason, mpsd.ReasonDown)
		}
	}
	// A daemon for the first GPU, as the serving plugin starts it.
	m := mpsd.New(mpsd.Options{Binary: bin, Root: mpsRoot})
	m.Set(t.Context(), []mpsd.GPU{{UUID: gpus[0].UUID, Replicas: 2}})
	t.Cleanup(func() { m.Set(context.Background(), nil) })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if s, _ := m.State(gpus[0].UUID); s.Up {
			break
		}
		select {
		case <-m.Changes():
		case <-time.After(time.Until(deadline)):
			t.Fatal("the daemon did not start")
		}
	}
	gpus = listed()
	if mps := gpus[0].MPS; mps == nil || mps.Daemon != "up" || mps.Clients != 0 || mps.Error != "" || gpus[0].Health != "Healthy" {
		t.Errorf("daemon running: %+v, %s %q", mps, gpus[0].Health, gpus[0].Reason)
	}
	if mps := gpus[1].MPS; mps == nil || mps.Daemon != "down" {
		t.Errorf("the second GPU: %+v", mps)
	}
	var table bytes.Buffer
	if err := writeTable(&table, listing{GPUs: gpus}, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "2 mps: up, 0 clients") || !strings.Contains(table.String(), "2 mps: daemon down") {
		t.Errorf("table:\n%s", table.String())
	}

	// In DRA mode, the GPU whose daemon claims started, and no other.
	args = []string{"list", "-o", "json", "--config", configFile(t, "kubeletAPI: dra\n"), "--node-name", "n", "--driver-root", root, "--dev-root", "/dev", "--mps-root", mpsRoot, "--sysfs-root", t.TempDir()}
	gpus = listed()
	if mps := gpus[0].MPS; gpus[0].Sharing != "mps" || mps == nil || mps.Daemon != "up" {
		t.Errorf("DRA mode, a claim's daemon running: %q %+v", gpus[0].Sharing, mps)
	}
	if gpus[1].Sharing != "" || gpus[1].MPS != nil {
		t.Errorf("DRA mode, the second GPU: %q %+v", gpus[1].Sharing, gpus[1].MPS)
	}
}

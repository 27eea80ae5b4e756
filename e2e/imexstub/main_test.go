package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

// build makes nvidia-imex and nvidia-imex-ctl out of this package.
func build(t *testing.T) (daemon, ctl string) {
	dir := t.TempDir()
	daemon = filepath.Join(dir, "nvidia-imex")
	out, err := exec.Command("go", "build", "-o", daemon, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctl = filepath.Join(dir, "nvidia-imex-ctl")
	if err := os.Symlink(daemon, ctl); err != nil {
		t.Fatal(err)
	}
	return daemon, ctl
}

func freePort(t *testing.T, ip string) int {
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor asks nvidia-imex-ctl -q until it says want, or fails at the
// deadline.
func waitFor(t *testing.T, ctl, cfg, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var got string
	tick := time.NewTicker(50 * time.Millisecond) // polling a process, as a user's script would
	defer tick.Stop()
	for ; time.Now().Before(deadline); <-tick.C {
		out, err := exec.Command(ctl, "-q", "-c", cfg).Output()
		if err != nil {
			t.Fatalf("nvidia-imex-ctl -q: %v", err)
		}
		if got = strings.TrimSpace(string(out)); got == want {
			return
		}
	}
	t.Fatalf("%s: nvidia-imex-ctl -q says %q, want %q", cfg, got, want)
}

func TestPeersReadyAndRestart(t *testing.T) {
	daemon, ctl := build(t)
	ips := []string{"127.0.0.21", "127.0.0.22", "127.0.0.23"}
	port := freePort(t, ips[0])
	cmdPort := freePort(t, ips[0])
	dir := t.TempDir()
	nodes := filepath.Join(dir, "nodes_config.cfg")
	if err := os.WriteFile(nodes, []byte(computedomain.NodesConfigFile(ips)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgs := make([]string, len(ips))
	for i, ip := range ips {
		c := computedomain.IMEX{BindIP: ip, ServerPort: port, CmdPort: cmdPort, NodesFile: nodes,
			PIDFile: filepath.Join(dir, fmt.Sprintf("imex%d.pid", i))}
		cfgs[i] = filepath.Join(dir, fmt.Sprintf("config%d.cfg", i))
		if err := os.WriteFile(cfgs[i], []byte(c.ConfigFile()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start := func(i int) *exec.Cmd {
		cmd := exec.Command(daemon, "-c", cfgs[i])
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// Two of three: not ready, they wait for the third.
	start(0)
	start(1)
	waitFor(t, ctl, cfgs[0], "UNAVAILABLE")
	third := start(2)
	for i := range ips {
		waitFor(t, ctl, cfgs[i], "READY")
	}
	pid, err := os.ReadFile(filepath.Join(dir, "imex2.pid"))
	if err != nil || strings.TrimSpace(string(pid)) != strconv.Itoa(third.Process.Pid) {
		t.Errorf("pid file: %q %v, want %d", pid, err, third.Process.Pid)
	}
	// A peer's restart is seen: not ready while it is gone, ready after.
	if err := third.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = third.Wait()
	waitFor(t, ctl, cfgs[0], "UNAVAILABLE")
	waitFor(t, ctl, cfgs[2], "UNAVAILABLE") // no daemon answers
	start(2)
	for i := range ips {
		waitFor(t, ctl, cfgs[i], "READY")
	}
	out, err := exec.Command(ctl, "-N", "-c", cfgs[0]).Output()
	if err != nil || strings.Count(string(out), "READY") != 3 {
		t.Errorf("-N: %q %v", out, err)
	}
}

func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.cfg")
	if err := os.WriteFile(cfg, []byte("SERVER_PORT=fifty\nIMEX_NODE_CONFIG_FILE=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readConfig(cfg); err == nil || !strings.Contains(err.Error(), "SERVER_PORT") {
		t.Errorf("got %v", err)
	}
}

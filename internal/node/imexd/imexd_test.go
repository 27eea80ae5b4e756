package imexd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

// The test binary is the fake nvidia-imex and nvidia-imex-ctl: the daemon
// checks its config, says it is up by a file beside it, and ends at
// SIGINT; the ctl prints READY while that file is there.
func TestMain(m *testing.M) {
	switch os.Getenv("IMEXD_FAKE") {
	case "nvidia-imex":
		cfg := os.Args[len(os.Args)-1]
		b, err := os.ReadFile(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		kv, err := computedomain.ParseConfigFile(string(b))
		if err != nil || kv["IMEX_NODE_CONFIG_FILE"] == "" {
			fmt.Fprintln(os.Stderr, "bad config", err)
			os.Exit(2)
		}
		up := filepath.Join(filepath.Dir(cfg), "up")
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		_ = os.WriteFile(up, nil, 0o644)
		<-sig
		_ = os.Remove(up)
		os.Exit(0)
	case "nvidia-imex-ctl":
		cfg := os.Args[len(os.Args)-1]
		if _, err := os.Stat(filepath.Join(filepath.Dir(cfg), "up")); err == nil {
			fmt.Println("READY")
		} else {
			fmt.Println("UNAVAILABLE")
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func fakeCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "IMEXD_FAKE="+name)
	return cmd
}

const uid = "0b7d3c1e-5f1a-4c2e-9d7e-1a2b3c4d5e6f"

func newDaemons(t *testing.T) (*Daemons, chan int, string) {
	dir := t.TempDir()
	started := make(chan int, 10)
	ds := New(Options{Dir: dir, BindIP: "10.0.0.1", Command: fakeCommand, RestartDelay: time.Millisecond,
		Started: func(_ string, pid int) { started <- pid }})
	return ds, started, dir
}

func next(t *testing.T, c chan int) int {
	t.Helper()
	select {
	case pid := <-c:
		return pid
	case <-time.After(20 * time.Second):
		t.Fatal("no daemon started")
		return 0
	}
}

// readyWithin asks Ready until it is nil: the daemon says so itself a
// moment after it starts.
func readyWithin(t *testing.T, ds *Daemons) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var err error
	for ; time.Now().Before(deadline); <-tick.C {
		if err = ds.Ready(context.Background(), uid); err == nil {
			return
		}
	}
	t.Fatal(err)
}

func TestEnsureRestartStop(t *testing.T) {
	ds, started, dir := newDaemons(t)
	ctx := t.Context()
	if err := ds.Ready(ctx, uid); err == nil || !strings.Contains(err.Error(), "no IMEX daemon") {
		t.Fatalf("before Ensure: %v", err)
	}
	peers := []string{"10.0.0.2", "10.0.0.1"}
	if err := ds.Ensure(ctx, uid, peers); err != nil {
		t.Fatal(err)
	}
	first := next(t, started)
	readyWithin(t, ds)
	nodes, _ := os.ReadFile(filepath.Join(dir, uid, "nodes_config.cfg"))
	if string(nodes) != "10.0.0.1\n10.0.0.2\n" {
		t.Errorf("nodes_config.cfg: %q", nodes)
	}
	// The same peers again: nothing restarts.
	if err := ds.Ensure(ctx, uid, []string{"10.0.0.1", "10.0.0.2"}); err != nil {
		t.Fatal(err)
	}
	if n := ds.Starts(uid); n != 1 {
		t.Errorf("starts after the same Ensure: %d", n)
	}
	// A daemon that dies is started again.
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if again := next(t, started); again == first {
		t.Error("the same PID after a restart")
	}
	readyWithin(t, ds)
	// Other peers: restarted with the new list.
	if err := ds.Ensure(ctx, uid, []string{"10.0.0.1", "10.0.0.3"}); err != nil {
		t.Fatal(err)
	}
	next(t, started)
	nodes, _ = os.ReadFile(filepath.Join(dir, uid, "nodes_config.cfg"))
	if string(nodes) != "10.0.0.1\n10.0.0.3\n" {
		t.Errorf("nodes_config.cfg after a change: %q", nodes)
	}
	if !slices.Equal(ds.Running(), []string{uid}) {
		t.Errorf("running: %v", ds.Running())
	}
	// Stop: the daemon ends (its file gone) and so does the directory.
	if err := ds.Stop(uid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, uid)); !os.IsNotExist(err) {
		t.Errorf("directory left after Stop: %v", err)
	}
	if len(ds.Running()) != 0 {
		t.Errorf("running after Stop: %v", ds.Running())
	}
}

func TestSweepRemovesWhatIsNotKept(t *testing.T) {
	ds, started, dir := newDaemons(t)
	other := "11111111-2222-3333-4444-555555555555"
	if err := ds.Ensure(t.Context(), uid, []string{"10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	next(t, started)
	left := filepath.Join(dir, other) // an earlier run's
	if err := os.MkdirAll(left, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ds.Sweep([]string{uid}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("left directory kept: %v", err)
	}
	if !slices.Equal(ds.Running(), []string{uid}) {
		t.Errorf("kept daemon stopped: %v", ds.Running())
	}
	if err := ds.Sweep(nil); err != nil {
		t.Fatal(err)
	}
	if len(ds.Running()) != 0 {
		t.Errorf("running after sweeping all: %v", ds.Running())
	}
}

func TestBadDomainName(t *testing.T) {
	ds, _, _ := newDaemons(t)
	for _, bad := range []string{"", "../etc", "a/b"} {
		if err := ds.Ensure(t.Context(), bad, nil); err == nil {
			t.Errorf("Ensure(%q) accepted", bad)
		}
	}
}

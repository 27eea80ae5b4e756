package probe

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestReadyIsEveryGateOpen(t *testing.T) {
	s := New(nil)
	if err := s.Ready(); err != nil {
		t.Fatalf("no gates: %v", err)
	}
	s.Gate("nvidia.com/gpu", "not yet registered with the kubelet")
	s.Gate("gpus", "")
	err := s.Ready()
	if err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu: not yet registered with the kubelet") {
		t.Fatalf("a shut gate: got %v, want it named with why", err)
	}
	if strings.Contains(err.Error(), "gpus") {
		t.Errorf("an open gate is named: %v", err)
	}
	s.Gate("nvidia.com/gpu", "")
	if err := s.Ready(); err != nil {
		t.Fatalf("every gate open: %v", err)
	}
	s.Gate("nvidia.com/mig-1g.10gb", "not yet registered with the kubelet")
	s.Forget("nvidia.com/mig-1g.10gb")
	if err := s.Ready(); err != nil {
		t.Fatalf("a forgotten gate still counts: %v", err)
	}
}

func TestLiveIsEveryLoopTurning(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := New(c.now)
	s.Turned("gpu health", 5*time.Second)
	s.Turned("nic scan", 10*time.Second)
	c.add(lateAfter*5*time.Second + slack)
	if err := s.Live(); err != nil {
		t.Fatalf("at the edge of the window: %v", err)
	}
	c.add(time.Second)
	err := s.Live()
	if err == nil || !strings.Contains(err.Error(), "gpu health last turned 46s ago (every 5s)") {
		t.Fatalf("a late loop: got %v", err)
	}
	if strings.Contains(err.Error(), "nic scan") {
		t.Errorf("a loop in time is named: %v", err)
	}
	s.Turned("gpu health", 5*time.Second)
	if err := s.Live(); err != nil {
		t.Fatalf("after it turned again: %v", err)
	}
	c.add(time.Hour)
	s.Stopped("gpu health")
	s.Stopped("nic scan")
	if err := s.Live(); err != nil {
		t.Fatalf("stopped loops still count: %v", err)
	}
}

func TestNilStatusIsReadyAndLive(t *testing.T) {
	var s *Status
	s.Gate("x", "shut")
	s.Turned("y", time.Second)
	if s.Ready() != nil || s.Live() != nil {
		t.Fatal("a nil Status must be ready and live")
	}
}

func serve(t *testing.T, s *Status) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", "health.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, s.Handler()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return path
}

func TestAskOverTheSocket(t *testing.T) {
	s := New(nil)
	path := serve(t, s)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	ctx := context.Background()
	if text, err := Ask(ctx, path, "readyz"); err != nil || text != "ok" {
		t.Fatalf("ready: %q, %v", text, err)
	}
	s.Gate("ResourceSlices", "waiting for the GPUs to be discovered")
	text, err := Ask(ctx, path, "readyz")
	if !errors.Is(err, ErrNotOK) || !strings.Contains(text, "ResourceSlices: waiting for the GPUs") {
		t.Fatalf("not ready: %q, %v", text, err)
	}
	if text, err := Ask(ctx, path, "livez"); err != nil || text != "ok" {
		t.Fatalf("live: %q, %v", text, err)
	}
	if _, err := Ask(ctx, filepath.Join(t.TempDir(), "none.sock"), "livez"); err == nil || errors.Is(err, ErrNotOK) {
		t.Fatalf("no plugin: got %v, want a connection error", err)
	}
}

func TestListenReplacesOnlyASocket(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	// What SIGKILL leaves: a socket file nobody listens on.
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ln, err := Listen(stale)
	if err != nil {
		t.Fatalf("a stale socket: %v", err)
	}
	ln.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("a regular file: got %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("the file was touched")
	}
}

package mpsd

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// heard records what a gate passes on.
type heard struct {
	mu   sync.Mutex
	said []string
	more chan struct{}
}

func (h *heard) SetHealth(id string, healthy bool, reason string) bool {
	h.mu.Lock()
	h.said = append(h.said, fmt.Sprintf("%s %v %s", id, healthy, reason))
	h.mu.Unlock()
	select {
	case h.more <- struct{}{}:
	default:
	}
	return true
}

// await waits until the last thing heard is want.
func (h *heard) await(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		h.mu.Lock()
		last := ""
		if len(h.said) > 0 {
			last = h.said[len(h.said)-1]
		}
		h.mu.Unlock()
		if last == want {
			return
		}
		select {
		case <-h.more:
		case <-deadline:
			t.Fatalf("last heard %q, want %q", last, want)
		}
	}
}

// A GPU shared through MPS is down until its daemon is up, and down again
// when the health watcher says so; a GPU not gated passes through.
func TestGate(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	m, _, _ := newManager(t, bin)
	h := &heard{more: make(chan struct{}, 1)}
	g := NewGate(h, m, []string{"GPU-a"})
	h.await(t, "GPU-a false "+ReasonDown)
	go g.Run(t.Context())

	g.SetHealth("GPU-b", false, "xid-79")
	h.await(t, "GPU-b false xid-79")
	g.SetHealth("GPU-a", true, "")
	h.await(t, "GPU-a false "+ReasonDown) // no daemon yet

	m.Set(t.Context(), []GPU{{UUID: "GPU-a", Replicas: 2}})
	h.await(t, "GPU-a true ")
	g.SetHealth("GPU-a", false, "xid-79")
	h.await(t, "GPU-a false xid-79")
	g.SetHealth("GPU-a", true, "")
	h.await(t, "GPU-a true ")

	m.Set(t.Context(), nil)
	h.await(t, "GPU-a false "+ReasonDown)
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(slices.DeleteFunc(slices.Clone(h.said), func(s string) bool { return s != "GPU-a true " })); n != 2 {
		t.Errorf("heard %q: GPU-a healthy %d times, want 2", h.said, n)
	}
}

// With no GPU named, a GPU is gated while the manager runs its daemon (a
// DRA claim's), and WaitUp returns once that daemon answers.
func TestGateFollowsDaemons(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	m, _, _ := newManager(t, bin)
	h := &heard{more: make(chan struct{}, 1)}
	g := NewGate(h, m, nil)
	go g.Run(t.Context())
	g.SetHealth("GPU-a", true, "")
	h.await(t, "GPU-a true ")
	if err := m.WaitUp(t.Context(), "GPU-a"); err == nil || !strings.Contains(err.Error(), "no MPS control daemon is run for GPU GPU-a") {
		t.Errorf("WaitUp without a daemon: %v", err)
	}

	m.Set(t.Context(), []GPU{{UUID: "GPU-a", Replicas: 1}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := m.WaitUp(ctx, "GPU-a"); err != nil {
		t.Fatalf("WaitUp: %v", err)
	}
	h.await(t, "GPU-a true ")
	g.SetHealth("GPU-a", false, "xid-79")
	h.await(t, "GPU-a false xid-79")
	g.SetHealth("GPU-a", true, "")
	h.await(t, "GPU-a true ")

	// Stopped, the GPU is no longer gated.
	m.Set(t.Context(), nil)
	g.SetHealth("GPU-a", true, "")
	h.await(t, "GPU-a true ")
	if m.Running("GPU-a") {
		t.Error("GPU-a's daemon still run after Set(nil)")
	}
}

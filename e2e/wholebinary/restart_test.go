package wholebinary

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// registerTarget is what the issue asks of a restarted plugin: serving
// and registered this soon after the process starts. The assertion uses
// reregisterLimit so a loaded machine does not flake; the figures are
// logged against the target.
const registerTarget = 100 * time.Millisecond

// quiet is how long a test watches a plugin that should be idle: long
// enough for a plugin re-creating its socket in a loop (hundreds of
// times a second) to show it.
const quiet = time.Second

// TestRestartAfterSIGKILL: a plugin killed with SIGKILL leaves its socket
// behind. The next one, started on the same directory, replaces it once,
// registers once, and then leaves it alone: it must not take the removal
// of the stale file for the kubelet wiping its own socket.
func TestRestartAfterSIGKILL(t *testing.T) {
	const rounds = 5
	n := startNode(t, "dgx-h100")
	path, err := harness.ProfilePath("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(n.k.Dir(), harness.SocketName)
	p := n.p
	var took []time.Duration
	for round := range rounds {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Fatalf("round %d: no stale socket after SIGKILL: %v", round, err)
		}
		// The kubelet notices the dead connection before a real plugin
		// could come back; a registration racing that would be refused.
		if _, err := n.k.WaitStats(ctx(t), "the killed plugin disconnected", func(s harness.Stats) bool { return s.Connected == 0 }); err != nil {
			t.Fatal(err)
		}
		before := len(n.k.Stats().Connects)
		if p, err = harness.StartPlugin(harness.PluginOptions{Binary: binary, Library: library, Profile: path, PluginDir: n.k.Dir(), HealthPollInterval: pollInterval}); err != nil {
			t.Fatal(err)
		}
		started := p
		t.Cleanup(func() {
			if err := started.Stop(); err != nil {
				t.Errorf("stopping the plugin: %v", err)
			}
			if t.Failed() {
				t.Logf("plugin log:\n%s", strings.TrimSpace(started.Log()))
			}
		})
		s, err := n.k.WaitStats(ctx(t), "the restarted plugin's registration", func(s harness.Stats) bool { return len(s.Connects) > before })
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, s.Connects[before].ConnectedAt.Sub(p.Started))
		ino := inode(t, socket)
		use0, err := p.Usage()
		if err != nil {
			t.Fatal(err)
		}
		// Not a wait for an event: a window in which a loop would show.
		time.Sleep(quiet)
		use1, err := p.Usage()
		if err != nil {
			t.Fatal(err)
		}
		servings := 0
		for _, e := range p.LogEntries() {
			if e.String("msg") == "serving" {
				servings++
			}
		}
		s = n.k.Stats()
		if got := len(s.Connects) - before; got != 1 || len(s.Rejected) > 0 || servings != 1 || inode(t, socket) != ino {
			t.Errorf("round %d: over %v after registering: %d registrations (refused %v), served %d times, socket inode %d → %d; want one of each and the same socket",
				round, quiet, got, s.Rejected, servings, ino, inode(t, socket))
		}
		t.Logf("round %d: start → registered %v; CPU in the %v after: %v", round, took[round], quiet, use1.CPU()-use0.CPU())
	}
	med, p90, worst := spread(took)
	t.Logf("SIGKILL restart with a stale socket, start → registered over %d rounds: median %v, p90 %v, max %v (target %v)", rounds, med, p90, worst, registerTarget)
	if worst > reregisterLimit {
		t.Errorf("a restart took %v to register, want under %v (target %v)", worst, reregisterLimit, registerTarget)
	}
}

// TestKubeletRestartStorm: 100 kubelet restarts, each down for a random
// 0 to 200ms as a kubelet restarted by systemd is, through the kubelet's
// own registration server. Each start wipes the plugin's socket and
// creates kubelet.sock; each must get exactly one registration.
func TestKubeletRestartStorm(t *testing.T) {
	const restarts = 100
	n := startNode(t, "dgx-h100")
	rng := rand.New(rand.NewPCG(2, 100))
	var took []time.Duration
	for range restarts {
		if err := n.k.Stop(); err != nil {
			t.Fatal(err)
		}
		down := time.NewTimer(time.Duration(rng.IntN(201)) * time.Millisecond)
		<-down.C
		if err := n.k.Start(); err != nil {
			t.Fatal(err)
		}
		e, err := n.k.WaitConnected(ctx(t), harness.ResourceName)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, e.ConnectedAt.Sub(n.k.Started()))
	}
	// A duplicate follows the first registration within milliseconds; a
	// device-list round trip gives one aimed at the last kubelet time to
	// land.
	if _, err := n.k.WaitDevices(ctx(t), harness.ResourceName, "every GPU", harness.DeviceCount(len(n.profile.GPUs))); err != nil {
		t.Fatal(err)
	}
	dups, refused := 0, 0
	for i, s := range n.k.History()[1:] {
		refused += len(s.Rejected)
		if len(s.Connects)+len(s.Rejected) != 1 {
			dups++
			t.Errorf("kubelet start %d: %d registrations accepted, refused %v; want exactly one", i, len(s.Connects), s.Rejected)
		}
	}
	med, p90, worst := spread(took)
	t.Logf("%d kubelet restarts: kubelet start → registered median %v, p90 %v, max %v; %d starts without exactly one registration, %d refused",
		restarts, med, p90, worst, dups, refused)
	if worst > reregisterLimit {
		t.Errorf("a re-registration took %v, want under %v", worst, reregisterLimit)
	}
}

// spread returns the median, 90th percentile and maximum.
func spread(ds []time.Duration) (med, p90, worst time.Duration) {
	s := slices.Sorted(slices.Values(ds))
	return s[len(s)/2], s[(len(s)*9)/10], s[len(s)-1]
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("stat %s: no inode", path)
	}
	return st.Ino
}

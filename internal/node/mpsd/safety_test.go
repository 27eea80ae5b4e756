package mpsd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// client is a running mps-client stand-in and the limits it got.
type client struct {
	cmd  *exec.Cmd
	got  string
	done chan error
}

// startClient runs the stand-in CUDA client against the GPU's daemon with
// env (its CUDA_MPS_ limits) and waits for the limits it got.
func startClient(t *testing.T, bin string, m *Manager, uuid string, env ...string) *client {
	t.Helper()
	cmd := exec.Command(filepath.Join(filepath.Dir(bin), "mps-client"))
	cmd.Env = append([]string{"CUDA_MPS_PIPE_DIRECTORY=" + m.PipeDir(uuid)}, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &client{cmd: cmd, done: make(chan error, 1)}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("mps-client said nothing: %v", err)
	}
	c.got = strings.TrimSpace(line)
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *client) running() bool {
	select {
	case err := <-c.done:
		c.done <- err
		return false
	default:
		return true
	}
}

func (c *client) ended(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the MPS client still runs")
		return nil
	}
}

// A client that clears its limits gets the daemon's; one that asks for
// less gets less. A change of limits reaches the running server in place:
// its client keeps running.
func TestLimitsHoldAndChangeInPlace(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	record := filepath.Join(t.TempDir(), "record")
	t.Setenv("MOCKMPS_RECORD", record)
	m, _, _ := newManager(t, bin)
	g := GPU{UUID: "GPU-a", Replicas: 4, MaxShares: 1, Memory: 80 << 30}
	m.Set(t.Context(), []GPU{g})
	waitState(t, m, g.UUID, true)

	hostile := startClient(t, bin, m, g.UUID) // no CUDA_MPS_ variables
	if !strings.HasSuffix(hostile.got, "threads 25 pinnedMiB 20480") {
		t.Errorf("a client without limits of its own got %q, want the daemon's one share", hostile.got)
	}
	modest := startClient(t, bin, m, g.UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M")
	if !strings.HasSuffix(modest.got, "threads 10 pinnedMiB 1024") {
		t.Errorf("a client asking for less got %q", modest.got)
	}
	greedy := startClient(t, bin, m, g.UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81920M")
	if !strings.HasSuffix(greedy.got, "threads 25 pinnedMiB 20480") {
		t.Errorf("a client asking for more got %q", greedy.got)
	}

	g.Replicas = 2
	n := len(recorded(t, record))
	m.Set(t.Context(), []GPU{g})
	server := strings.Fields(hostile.got)[1]
	want := []string{"get_server_list", "set_default_active_thread_percentage 50", "set_default_device_pinned_mem_limit 0 40960M",
		"set_active_thread_percentage " + server + " 50", "set_device_pinned_mem_limit " + server + " 0 40960M",
		"get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"}
	awaitRecorded(t, record, n+len(want))
	if got := recorded(t, record)[n:]; !slices.Equal(got, want) {
		t.Errorf("new limits: told %q, want %q", got, want)
	}
	if !hostile.running() || !modest.running() {
		t.Error("a client ended when the limits changed")
	}
	if later := startClient(t, bin, m, g.UUID); !strings.HasSuffix(later.got, "threads 50 pinnedMiB 40960") {
		t.Errorf("a client of the running server after the change got %q", later.got)
	}
}

// upRecorded runs g's stand-in daemon, up, under a new manager; the
// daemon records what it is told in record.
func upRecorded(t *testing.T, g GPU) (m *Manager, bin, record, root string) {
	t.Helper()
	bin = mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	record = filepath.Join(t.TempDir(), "record")
	t.Setenv("MOCKMPS_RECORD", record)
	m, _, root = newManager(t, bin)
	m.Set(t.Context(), []GPU{g})
	waitState(t, m, g.UUID, true)
	return m, bin, record, root
}

// Stopping a daemon gives its clients the grace period, then shuts its
// servers down; the directories go only once the daemon is gone.
func TestStopWaitsForClients(t *testing.T) {
	g := GPU{UUID: "GPU-a", Replicas: 2}
	m, bin, record, root := upRecorded(t, g)
	c := startClient(t, bin, m, g.UUID)

	m.Set(t.Context(), nil)
	if c.running() {
		t.Error("a client outlived its daemon's stop")
	}
	if err := c.ended(t); err == nil {
		t.Error("the client ended well; its server was shut down under it")
	}
	got := recorded(t, record)
	if !slices.Contains(got, "quit -t 1") {
		t.Errorf("told %q, want quit -t 1", got)
	}
	if _, err := os.Stat(filepath.Join(root, g.UUID)); !os.IsNotExist(err) {
		t.Errorf("directories left: %v", err)
	}
}

// A faulted GPU's daemon is held: its servers shut down by force (the
// clients fail at once), the daemon stopped with its directories kept,
// and started again, at the same pipe directory, when the hold is lifted.
func TestHoldOnFault(t *testing.T) {
	g := GPU{UUID: "GPU-a", Replicas: 2}
	m, bin, record, _ := upRecorded(t, g)
	c := startClient(t, bin, m, g.UUID)
	pipe := inode(t, m.PipeDir(g.UUID))

	m.Hold(g.UUID, true, "xid=79")
	s := waitState(t, m, g.UUID, false)
	if s.Err == nil || !strings.Contains(s.Err.Error(), "xid=79") {
		t.Errorf("held state %+v", s)
	}
	if err := c.ended(t); err == nil {
		t.Error("the client of a faulted GPU ended well")
	}
	server := strings.Fields(c.got)[1]
	if got := recorded(t, record); !slices.Contains(got, "shutdown_server "+server+" -f") || got[len(got)-1] != "quit" {
		t.Errorf("told %q", got)
	}
	if inode(t, m.PipeDir(g.UUID)) != pipe {
		t.Error("the pipe directory was replaced while held")
	}

	m.Hold(g.UUID, false, "")
	waitState(t, m, g.UUID, true)
	if inode(t, m.PipeDir(g.UUID)) != pipe {
		t.Error("the pipe directory was replaced: pods' mounts would not reach the new daemon")
	}
}

// The gate holds a shared GPU's daemon on a fault, not on a slowdown.
func TestFaulted(t *testing.T) {
	for reason, want := range map[string]bool{
		"xid=79": true, "gpu-lost": true, "thermal=90C>=slowdown 88C, xid=48": true,
		"thermal=90C>=slowdown 88C": false, "nvml: timeout": false, "": false,
	} {
		if got := Faulted(reason); got != want {
			t.Errorf("Faulted(%q) = %v", reason, got)
		}
	}
}

// A server left by a dead daemon keeps its pipe directory untouched and
// no daemon started until it ends.
func TestOrphanServerWaited(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	root := filepath.Join(t.TempDir(), "mps")
	clk := newFakeClock()
	var mu sync.Mutex
	orphans := []int{4242}
	cm := &modes{}
	m := New(Options{Binary: bin, Root: root, Clock: clk, ProbeInterval: probe, MinBackoff: backoff, StopGrace: time.Second, ComputeMode: cm.ComputeMode,
		Servers: func(uuid string) ([]int, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(orphans), nil
		}})
	t.Cleanup(func() { m.Set(context.Background(), nil) })
	g := GPU{UUID: "GPU-a", Replicas: 2}
	left := filepath.Join(m.PipeDir(g.UUID), "server-pipe")
	if err := os.MkdirAll(filepath.Dir(left), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m.Set(t.Context(), []GPU{g})
	clk.await(t, backoff, false)
	s, _ := m.State(g.UUID)
	if s.Up || s.Err == nil || !strings.Contains(s.Err.Error(), "4242") {
		t.Errorf("state with an orphaned server: %+v", s)
	}
	if _, err := os.Stat(left); err != nil {
		t.Errorf("the orphan's pipe was touched: %v", err)
	}
	if got := cm.got(); len(got) != 0 {
		t.Errorf("compute modes set while the orphan runs: %q", got)
	}

	mu.Lock()
	orphans = nil
	mu.Unlock()
	clk.fire(t, backoff)
	waitState(t, m, g.UUID, true)
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the dead server's pipe was kept: %v", err)
	}
}

// A GPU whose compute mode cannot be set gets no daemon, and nothing is
// left half-started; one that leaves exclusive-process mode (a reset) is
// put back at the next probe.
func TestComputeMode(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	record := filepath.Join(t.TempDir(), "record")
	t.Setenv("MOCKMPS_RECORD", record)
	root := filepath.Join(t.TempDir(), "mps")
	clk := newFakeClock()
	var mu sync.Mutex
	refuse, exclusive := true, true
	var set []bool
	m := New(Options{Binary: bin, Root: root, Clock: clk, ProbeInterval: probe, MinBackoff: backoff, StopGrace: time.Second,
		ComputeMode: func(uuid string, excl bool) error {
			mu.Lock()
			defer mu.Unlock()
			if refuse && excl {
				return errors.New("Not Supported")
			}
			set, exclusive = append(set, excl), excl
			return nil
		},
		IsExclusive: func(string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return exclusive, nil
		}})
	t.Cleanup(func() { m.Set(context.Background(), nil) })
	g := GPU{UUID: "GPU-a", Replicas: 2}
	m.Set(t.Context(), []GPU{g})
	clk.await(t, backoff, false)
	s, _ := m.State(g.UUID)
	if s.Up || s.Err == nil || !strings.Contains(s.Err.Error(), "exclusive-process") {
		t.Errorf("state when the mode cannot be set: %+v", s)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("a daemon was started: %v", err)
	}

	mu.Lock()
	refuse = false
	mu.Unlock()
	clk.fire(t, backoff)
	waitState(t, m, g.UUID, true)
	mu.Lock()
	exclusive = false // a GPU reset
	mu.Unlock()
	clk.fire(t, probe)
	clk.await(t, probe, false)
	mu.Lock()
	defer mu.Unlock()
	if want := []bool{false, true, true}; !slices.Equal(set, want) {
		t.Errorf("modes set %v, want %v (default after the failed start, exclusive at the start, again after the reset)", set, want)
	}
}

// A daemon that does not take its limits is not up.
func TestLimitsReadBack(t *testing.T) {
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	t.Setenv("MOCKMPS_DEAF", "1")
	m, clk, _ := newManager(t, bin)
	g := GPU{UUID: "GPU-a", Replicas: 4}
	m.Set(t.Context(), []GPU{g})
	clk.await(t, backoff, false)
	s, _ := m.State(g.UUID)
	if s.Up || s.Err == nil || !strings.Contains(s.Err.Error(), "did not take its limits") {
		t.Errorf("state %+v", s)
	}
}

func TestParseMiB(t *testing.T) {
	for said, want := range map[string]uint64{"1024M": 1024, "2G": 2048, "512MB": 512, "0=4096M": 0, "1.5G": 1536, "device 0: 8192M": 8192, "1048576": 1} {
		got, ok := parseMiB(said)
		if said == "0=4096M" {
			if ok {
				t.Errorf("parseMiB(%q) = %d, want no answer", said, got)
			}
			continue
		}
		if !ok || got != want {
			t.Errorf("parseMiB(%q) = %d, %v; want %d", said, got, ok, want)
		}
	}
}

// ProcServers finds the servers of one GPU by their executable and
// environment.
func TestProcServers(t *testing.T) {
	proc := t.TempDir()
	add := func(pid int, exe string, env ...string) {
		dir := filepath.Join(proc, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	add(10, "/usr/bin/nvidia-cuda-mps-server", "PATH=/bin", "CUDA_VISIBLE_DEVICES=GPU-a")
	add(11, "/usr/bin/nvidia-cuda-mps-server (deleted)", "CUDA_VISIBLE_DEVICES=GPU-a")
	add(12, "/usr/bin/nvidia-cuda-mps-server", "CUDA_VISIBLE_DEVICES=GPU-ab")
	add(13, "/usr/bin/nvidia-cuda-mps-control", "CUDA_VISIBLE_DEVICES=GPU-a")
	add(14, "/usr/bin/python3", "CUDA_VISIBLE_DEVICES=GPU-a")
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := ProcServers(proc, "GPU-a")
	if err != nil || !slices.Equal(got, []int{10, 11}) {
		t.Errorf("servers of GPU-a: %v, %v; want [10 11]", got, err)
	}
}

// Each daemon's /dev/shm is a tmpfs of ShmSize of its own where mpsRoot
// is on a mount shared with the host, unmounted when the daemon stops;
// elsewhere it stays a plain directory rather than one the clients would
// not see.
func TestShmTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	bin := mpstest.Install(t, filepath.Join(t.TempDir(), "driver"))
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			top := t.TempDir()
			if shared {
				// A mount of its own, shared: as a Bidirectional volume is.
				if err := unix.Mount(top, top, "", unix.MS_BIND, ""); err != nil {
					t.Skipf("bind mount: %v", err)
				}
				t.Cleanup(func() { _ = unix.Unmount(top, unix.MNT_DETACH) })
				if err := unix.Mount("", top, "", unix.MS_SHARED, ""); err != nil {
					t.Fatal(err)
				}
			} else if on, err := onSharedMount(top); err != nil || on {
				t.Skipf("the temporary folder is on a shared mount (%v)", err)
			}
			root := filepath.Join(top, "mps")
			m := New(Options{Binary: bin, Root: root, Clock: newFakeClock(), ProbeInterval: probe, MinBackoff: backoff, StopGrace: time.Second, ShmSize: 8 << 20})
			g := GPU{UUID: "GPU-a", Replicas: 2}
			shm := filepath.Join(root, g.UUID, "shm")
			t.Cleanup(func() {
				m.Set(context.Background(), nil)
				_ = unix.Unmount(shm, unix.MNT_DETACH) // a failed test's
			})
			m.Set(t.Context(), []GPU{g})
			waitState(t, m, g.UUID, true)
			var fs unix.Statfs_t
			if err := unix.Statfs(shm, &fs); err != nil {
				t.Fatal(err)
			}
			size := uint64(fs.Blocks) * uint64(fs.Bsize)
			if tmpfs := isMountPoint(shm) && fs.Type == unix.TMPFS_MAGIC && size == 8<<20; tmpfs != shared {
				t.Errorf("/dev/shm a tmpfs of 8 MiB: %v (mount point %v, type %x, %d bytes)", tmpfs, isMountPoint(shm), fs.Type, size)
			}
			if shared {
				// A second one on top, as propagation can stack them
				// under a plugin restarted in between.
				if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=1m"); err != nil {
					t.Fatal(err)
				}
			}
			m.Set(t.Context(), nil)
			if isMountPoint(shm) {
				t.Error("the tmpfs outlived its daemon")
			}
			if _, err := os.Stat(filepath.Join(root, g.UUID)); !os.IsNotExist(err) {
				t.Errorf("directories left: %v", err)
			}
		})
	}
}

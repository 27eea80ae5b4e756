package mpsexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// The test binary is the helper too, as the plugin's own executable is.
func TestMain(m *testing.M) {
	RunIfHelper()
	os.Exit(m.Run())
}

func needConfinement(t *testing.T) string { return mpstest.NeedConfinement(t) }

// dirs are one GPU's directories as the plugin sees them.
type dirs struct{ pipe, log, shm string }

func newDirs(t *testing.T) dirs {
	base := t.TempDir()
	d := dirs{pipe: filepath.Join(base, "pipe"), log: filepath.Join(base, "log"), shm: filepath.Join(base, "shm")}
	for _, dir := range []string{d.pipe, d.log, d.shm} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func fakeDriverRoot(t *testing.T) (root, bin string) { return mpstest.DriverRoot(t) }

// run runs s through Command with stdin and returns its stdout.
func run(self string, s Spec, stdin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := Command(ctx, self, s)
	if err != nil {
		return "", err
	}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%v %v: %w: %s", s.Args, strings.TrimSpace(stdin), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// mountinfo is this process's mounts where a leak would land: under the
// temporary directory the tests' roots are in, and on /dev/shm. Mounts
// elsewhere, by other processes of the machine, are not the test's.
func mountinfo(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, os.TempDir()) || strings.Contains(l, " /dev/shm") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func readlink(t *testing.T, path string) string {
	t.Helper()
	l, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// daemonPID reads the pid file the daemon writes in its pipe directory.
func daemonPID(t *testing.T, pipe string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pipe, "nvidia-cuda-mps-control.pid"))
	if err != nil {
		t.Fatalf("the daemon's pid file is not in the pipe directory: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitExit waits for pid to exit. It is not our child (-d forks it and
// returns), so it is waited on through a pidfd.
func waitExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd of daemon %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 30_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("daemon %d still runs 30s after quit (%v)", pid, err)
		}
		return
	}
}

// exercise starts the daemon through Command, checks what it sees, asks
// it through the control client and tells it to quit. The daemon is not
// our child (-d forks it and returns), so its end is polled for.
// check, if set, looks at the running daemon.
func exercise(t *testing.T, self string, s Spec, d dirs, check func(pid int)) (pid int) {
	t.Helper()
	start := s
	start.Args = []string{"-d"}
	if _, err := run(self, start, ""); err != nil {
		t.Fatal(err)
	}
	pid = daemonPID(t, d.pipe)
	t.Cleanup(func() {
		if syscall.Kill(pid, 0) == nil { // the test failed before quit
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if fi, err := os.Stat(filepath.Join(d.pipe, "control")); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the daemon's socket is not in the pipe directory: %v", err)
	}
	marker := filepath.Join(d.shm, fmt.Sprintf("mockmps.%d", pid))
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the daemon's /dev/shm is not the GPU's shm directory: %v", err)
	}
	if readlink(t, fmt.Sprintf("/proc/%d/ns/mnt", pid)) == readlink(t, "/proc/self/ns/mnt") {
		t.Error("the daemon runs in the test's mount namespace")
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(environ), "\x00")
	if slices.Contains(env, "CUDA_MPS_PIPE_DIRECTORY=/stale") || slices.Contains(env, "CUDA_VISIBLE_DEVICES=stale") ||
		!slices.Contains(env, "CUDA_VISIBLE_DEVICES=GPU-test") {
		t.Errorf("the daemon's environment has the caller's CUDA_* or lacks the spec's: %q", env)
	}
	if check != nil {
		check(pid)
	}

	if got, err := run(self, s, "get_default_active_thread_percentage\n"); err != nil || got != "100.0" {
		t.Errorf("control client: %q, %v; want the daemon's 100.0", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(d.log, "control.log")); err != nil || string(b) != "start\nget_default_active_thread_percentage\n" {
		t.Errorf("the log directory's control.log = %q, %v", b, err)
	}

	if _, err := run(self, s, "quit\n"); err != nil {
		t.Fatal(err)
	}
	waitExit(t, pid)
	if _, err := os.Stat(filepath.Join(d.pipe, "control")); err == nil {
		t.Error("the socket is still there after quit")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the shm marker is still there after quit")
	}
	if _, err := run(self, s, "get_default_active_thread_percentage\n"); err == nil {
		t.Error("the control client got an answer after quit")
	}
	return pid
}

// Chrooted into a driver root: the daemon starts, answers, uses the GPU's
// directories and quits, and none of its mounts shows on this side.
func TestChroot(t *testing.T) {
	self := needConfinement(t)
	root, bin := fakeDriverRoot(t)
	d := newDirs(t)
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "/stale")
	t.Setenv("CUDA_VISIBLE_DEVICES", "stale")
	before := mountinfo(t)
	s := Spec{DriverRoot: root, Shm: d.shm, Pipe: d.pipe, Log: d.log,
		Env: []string{"CUDA_VISIBLE_DEVICES=GPU-test", "MOCKMPS_SHM_MARKER=1"}}

	exercise(t, self, s, d, func(pid int) {
		// /proc/<pid>/root is the daemon's root: the driver root's
		// binary is there at its in-root path.
		inRoot, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, DefaultBinary))
		if err != nil {
			t.Fatal(err)
		}
		if installed, err := os.Stat(bin); err != nil || !os.SameFile(inRoot, installed) {
			t.Errorf("the daemon's root is not the driver root (%v)", err)
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(env), "\x00CUDA_MPS_PIPE_DIRECTORY="+RootPipe+"\x00") ||
			!strings.Contains(string(env), "\x00CUDA_MPS_LOG_DIRECTORY="+RootLog+"\x00") {
			t.Errorf("the daemon's environment does not name the in-root directories: %q", env)
		}
	})
	for _, dir := range []string{"dev", "proc", "sys", "tmp"} {
		if entries, err := os.ReadDir(filepath.Join(root, dir)); err != nil || len(entries) != 0 {
			t.Errorf("the driver root's /%s holds %d entries here (%v): a mount leaked", dir, len(entries), err)
		}
	}
	if after := mountinfo(t); after != before {
		t.Errorf("this process's mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// A bind shows a directory of the caller's inside the driver root at its
// target: the daemon records its commands in a file there, which lands in
// the source; the mount point is made in the tmpfs, not in the root.
func TestBind(t *testing.T) {
	self := needConfinement(t)
	root, _ := fakeDriverRoot(t)
	d := newDirs(t)
	extra := t.TempDir()
	before := mountinfo(t)
	const target = "/tmp/gpu-device-plugin-imex/domain"
	s := Spec{DriverRoot: root, Shm: d.shm, Pipe: d.pipe, Log: d.log,
		Env:   []string{"CUDA_VISIBLE_DEVICES=GPU-test", "MOCKMPS_SHM_MARKER=1", "MOCKMPS_RECORD=" + target + "/record"},
		Binds: []Bind{{Source: extra, Target: target}}}
	exercise(t, self, s, d, nil)
	if b, err := os.ReadFile(filepath.Join(extra, "record")); err != nil || !strings.HasPrefix(string(b), "start\n") {
		t.Errorf("the bound directory's record = %q, %v; want the daemon's commands", b, err)
	}
	if entries, err := os.ReadDir(filepath.Join(root, "tmp")); err != nil || len(entries) != 0 {
		t.Errorf("the driver root's /tmp holds %d entries here (%v): a mount point was made in the root", len(entries), err)
	}
	if after := mountinfo(t); after != before {
		t.Errorf("this process's mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// Without a driver root the binary runs where it is, still with the GPU's
// shm directory on /dev/shm in a namespace of its own.
func TestNoChroot(t *testing.T) {
	self := needConfinement(t)
	_, bin := fakeDriverRoot(t)
	d := newDirs(t)
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "/stale")
	t.Setenv("CUDA_VISIBLE_DEVICES", "stale")
	before := mountinfo(t)
	for _, driverRoot := range []string{"", "/"} {
		s := Spec{DriverRoot: driverRoot, Binary: bin, Shm: d.shm, Pipe: d.pipe, Log: d.log,
			Env: []string{"CUDA_VISIBLE_DEVICES=GPU-test", "MOCKMPS_SHM_MARKER=1"}}
		pid := exercise(t, self, s, d, nil)
		if _, err := os.Stat(fmt.Sprintf("/dev/shm/mockmps.%d", pid)); err == nil {
			t.Error("the daemon wrote into this process's /dev/shm")
		}
		if err := os.Remove(filepath.Join(d.log, "control.log")); err != nil {
			t.Fatal(err)
		}
	}
	if after := mountinfo(t); after != before {
		t.Errorf("this process's mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// A mount point in the driver root that is a symlink is refused: the
// mount would land where it points.
func TestSymlinkedMountPointRefused(t *testing.T) {
	self := needConfinement(t)
	root, _ := fakeDriverRoot(t)
	d := newDirs(t)
	outside := t.TempDir()
	if err := os.Remove(filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	_, err := run(self, Spec{DriverRoot: root, Pipe: d.pipe, Log: d.log}, "")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "tmp")+": a symlink") {
		t.Errorf("err = %v; want the symlinked /tmp refused", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("the symlink's target got %d entries", len(entries))
	}
}

func TestBadSpec(t *testing.T) {
	for _, tc := range []struct {
		s    Spec
		want string
	}{
		{Spec{Log: "/l"}, "pipe is empty"},
		{Spec{Pipe: "/p"}, "log is empty"},
		{Spec{Pipe: "p", Log: "/l"}, `pipe "p" is not an absolute path`},
		{Spec{Pipe: "/p", Log: "/l", DriverRoot: "driver"}, `driverRoot "driver" is not an absolute path`},
		{Spec{Pipe: "/p", Log: "/l", Binary: "nvidia-cuda-mps-control"}, "binary"},
		{Spec{Pipe: "/p", Log: "/l", Env: []string{"CUDA_VISIBLE_DEVICES"}}, `env "CUDA_VISIBLE_DEVICES" is not KEY=VALUE`},
		{Spec{Pipe: "/p", Log: "/l", Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/x"}}, "env sets CUDA_MPS_PIPE_DIRECTORY"},
		{Spec{Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/x"}}}, "binds are given without a driverRoot"},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "s", Target: "/tmp/x"}}}, `binds[0].source "s" is not an absolute path`},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "tmp/x"}}}, `binds[0].target "tmp/x" is not a clean absolute path`},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/../etc"}}}, `binds[0].target "/tmp/../etc" is not a clean absolute path`},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/x/"}}}, "is not a clean absolute path"},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/etc/x"}}}, `binds[0].target "/etc/x" is not under /tmp`},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp"}}}, "is not under /tmp"},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmpx/a"}}}, "is not under /tmp"},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: RootPipe}}}, "reaches /tmp/gpu-device-plugin-mps"},
		{Spec{DriverRoot: "/r", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/a"}, {Source: "/t", Target: "/tmp/a/b"}}}, `binds[1].target "/tmp/a/b" and binds[0].target "/tmp/a" overlap`},
	} {
		if _, err := Command(context.Background(), "/proc/self/exe", tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Command(%+v): %v; want an error saying %q", tc.s, err, tc.want)
		}
	}
}

// The helper refuses a malformed argument before it mounts anything, and
// refuses to run in its parent's mount namespace.
func TestHelperRefuses(t *testing.T) {
	self := needConfinement(t)
	// A root with none of the mount points: were the namespace check
	// missing, the helper would fail on /tmp having mounted nothing.
	empty := t.TempDir()
	for _, tc := range []struct {
		arg     string
		private bool
		want    string
	}{
		{"", true, "no spec given"},
		{"{", true, "not a valid spec"},
		{`{"pipe":"/p","log":"/l","shmDir":"/s"}`, true, `unknown field "shmDir"`},
		{`{"pipe":"/p","log":"/l"} {}`, true, "unexpected data after the spec"},
		{`{"pipe":"/p"}`, true, "log is empty"},
		{fmt.Sprintf(`{"driverRoot":%q,"pipe":"/p","log":"/l"}`, empty), false, "runs in its parent's mount namespace"},
	} {
		cmd := exec.Command(self, HelperCommand, tc.arg)
		if tc.private {
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(string(out), tc.want) || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
			t.Errorf("mps-exec %s: %v, %q; want one line saying %q", tc.arg, err, out, tc.want)
		}
	}
}

// The spec's JSON keys, which the helper decodes.
func TestSpecJSON(t *testing.T) {
	b, err := json.Marshal(Spec{DriverRoot: "/driver-root", DevRoot: "/dev", Shm: "/s", Pipe: "/p", Log: "/l",
		Binary: "/b", Args: []string{"-d"}, Env: []string{"A=1"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"driverRoot":"/driver-root","devRoot":"/dev","shm":"/s","pipe":"/p","log":"/l","binary":"/b","args":["-d"],"env":["A=1"]}`
	if string(b) != want {
		t.Errorf("spec JSON = %s\nwant %s", b, want)
	}
	// binds, new, is left out when empty: an MPS spec is as before.
	b, err = json.Marshal(Spec{DriverRoot: "/driver-root", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/t"}}})
	if err != nil {
		t.Fatal(err)
	}
	want = `{"driverRoot":"/driver-root","binary":"/b","binds":[{"source":"/s","target":"/tmp/t"}]}`
	if string(b) != want {
		t.Errorf("spec JSON = %s\nwant %s", b, want)
	}
	if got, err := decode(want); err != nil || !reflect.DeepEqual(got, Spec{DriverRoot: "/driver-root", Binary: "/b", Binds: []Bind{{Source: "/s", Target: "/tmp/t"}}}) {
		t.Errorf("decode(%s) = %+v, %v", want, got, err)
	}
}

// The binary's environment is PATH, the spec's and the directories:
// nothing of the plugin's own.
func TestEnviron(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("LD_PRELOAD", "/evil.so")
	got := environ([]string{"CUDA_VISIBLE_DEVICES=GPU-1", "PATH=/tmp", "A=new"}, "/pipe", "/log")
	want := []string{basePath, "CUDA_VISIBLE_DEVICES=GPU-1", "A=new", "CUDA_MPS_PIPE_DIRECTORY=/pipe", "CUDA_MPS_LOG_DIRECTORY=/log"}
	if !slices.Equal(got, want) {
		t.Errorf("environ = %q, want %q", got, want)
	}
}

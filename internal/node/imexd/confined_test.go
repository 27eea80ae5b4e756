package imexd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// standInRoot is a whole driver root with e2e/imexstub, built static (it
// has no libc to link), as usr/bin/nvidia-imex and nvidia-imex-ctl, and
// the mount points the helper binds on.
func standInRoot(t *testing.T) string {
	root := filepath.Join(t.TempDir(), "driver")
	for _, dir := range []string{"usr/bin", "dev", "proc", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, self, _, _ := runtime.Caller(0)
	bin := filepath.Join(root, "usr/bin/nvidia-imex")
	cmd := exec.Command("go", "build", "-o", bin, "./imexstub")
	cmd.Dir = filepath.Join(filepath.Dir(self), "../../../e2e")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building e2e/imexstub: %v\n%s", err, out)
	}
	if err := os.Link(bin, filepath.Join(root, "usr/bin/nvidia-imex-ctl")); err != nil {
		t.Fatal(err)
	}
	return root
}

// freePort is a TCP port free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// mounts is this process's mount table where a leaked mount would be.
func mounts(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, os.TempDir()) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// The stand-in nvidia-imex runs confined for real: chrooted into the
// driver root, in a mount namespace of its own, with only PATH, its
// config read through the bound directory and its PID file written there
// naming the very process started (the helper execs it). Killed, it is
// started again; stopped, it ends, and no mount or mount point is left.
func TestConfinedStandIn(t *testing.T) {
	self := mpstest.NeedConfinement(t)
	root, dir := standInRoot(t), t.TempDir()
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1") // the plugin's own, not the daemon's
	started := make(chan int, 10)
	ds := New(Options{Dir: dir, BindIP: "127.0.0.1", ServerPort: freePort(t), CmdPort: freePort(t), DriverRoot: root,
		Self: self, RestartDelay: time.Millisecond, Started: func(_ string, pid int) { started <- pid }})
	before := mounts(t)
	if err := ds.Ensure(t.Context(), uid, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Stop(uid) })
	first := next(t, started)
	readyWithin(t, ds)
	checkDaemon(t, root, dir, first)

	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	again := next(t, started)
	if again == first {
		t.Error("the same PID after a restart")
	}
	readyWithin(t, ds)
	checkDaemon(t, root, dir, again)

	if err := ds.Stop(uid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(again, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("daemon %d still there after Stop: %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(dir, uid)); !os.IsNotExist(err) {
		t.Errorf("directory left after Stop: %v", err)
	}
	if entries, err := os.ReadDir(filepath.Join(root, "tmp")); err != nil || len(entries) != 0 {
		t.Errorf("the driver root's /tmp holds %d entries here (%v): a mount point was made in the root", len(entries), err)
	}
	if after := mounts(t); after != before {
		t.Errorf("this process's mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// checkDaemon checks the running daemon pid is confined.
func checkDaemon(t *testing.T, root, dir string, pid int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, uid, "nvidia-imex.pid"))
	if err != nil {
		t.Fatalf("no PID file in the domain's directory (the daemon writes it at %s/%s): %v", RootDir, uid, err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(b))); got != pid {
		t.Errorf("the PID file names %d; the process started is %d", got, pid)
	}
	inRoot, err := os.Stat(fmt.Sprintf("/proc/%d/root/usr/bin/nvidia-imex", pid))
	if err != nil {
		t.Fatal(err)
	}
	if installed, err := os.Stat(filepath.Join(root, "usr/bin/nvidia-imex")); err != nil || !os.SameFile(inRoot, installed) {
		t.Errorf("daemon %d's root is not the driver root (%v)", pid, err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if own, _ := os.Readlink("/proc/self/ns/mnt"); err != nil || ns == own {
		t.Errorf("daemon %d runs in the test's mount namespace (%v)", pid, err)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimRight(string(env), "\x00"); got != "PATH=/usr/sbin:/usr/bin:/sbin:/bin" {
		t.Errorf("daemon %d's environment = %q; want PATH alone", pid, got)
	}
}

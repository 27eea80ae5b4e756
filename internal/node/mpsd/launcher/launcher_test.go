package launcher

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

// The test binary is both helpers, as the plugin's executable is.
func TestMain(m *testing.M) {
	mpsexec.RunIfHelper()
	RunIfHelper()
	os.Exit(m.Run())
}

const testGPU = "GPU-8c1e7d5a-0000-4000-8000-000000000001"

func TestValidGPU(t *testing.T) {
	for _, tc := range []struct {
		name, uuid string
		ok         bool
	}{
		{"a GPU's UUID", testGPU, true},
		{"empty", "", false},
		{"a MIG device's", "MIG-8c1e7d5a-0000-4000-8000-000000000001", false},
		{"a path out of the root", "GPU-../../etc", false},
		{"a path below it", "GPU-a/pipe", false},
		{"a new line", "GPU-a\nb", false},
		{"the prefix alone", "GPU-", false},
		{"too long", "GPU-" + strings.Repeat("a", 65), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidGPU(tc.uuid)
			if (err == nil) != tc.ok {
				t.Errorf("ValidGPU(%q) = %v", tc.uuid, err)
			}
			if err != nil && !strings.Contains(err.Error(), "not a GPU UUID") {
				t.Errorf("error %q does not say what is wrong", err)
			}
		})
	}
}

// fixture is a launcher serving on a socket in a temporary directory, its
// driver root holding the stand-in control program.
type fixture struct {
	socket, root, driverRoot, bin string
	// proc is the process table the launcher reads, empty but for what a
	// test puts there.
	proc string
	// specs are the runs the launcher built.
	mu    sync.Mutex
	specs []mpsexec.Spec
}

// makeDirs makes the GPU's directories, as the plugin does before it asks.
func (f *fixture) makeDirs(t *testing.T, uuid string) {
	t.Helper()
	for _, which := range []string{sharing.MPSPipe, sharing.MPSLog, sharing.MPSShm} {
		if err := os.MkdirAll(sharing.MPSDir(f.root, uuid, which), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// serve starts a launcher until the test ends. confined runs the control
// program as production does (mpsexec, this test binary the helper);
// otherwise it runs in place, recording each spec.
func serve(t *testing.T, confined bool) *fixture {
	t.Helper()
	f := &fixture{root: filepath.Join(t.TempDir(), "mps")}
	f.socket = filepath.Join(f.root, "launcher.sock")
	f.driverRoot, f.bin = mpstest.DriverRoot(t)
	f.proc = t.TempDir()
	o := Options{Socket: f.socket, Root: f.root, DriverRoot: f.driverRoot, DevRoot: "/dev", ProcRoot: f.proc}
	if confined {
		o.Self = mpstest.NeedConfinement(t)
	} else {
		o.Command = func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error) {
			f.mu.Lock()
			f.specs = append(f.specs, s)
			f.mu.Unlock()
			cmd := exec.CommandContext(ctx, filepath.Join(s.DriverRoot, s.Binary), s.Args...)
			cmd.Env = append(os.Environ(), s.Env...)
			cmd.Env = append(cmd.Env, "CUDA_MPS_PIPE_DIRECTORY="+s.Pipe, "CUDA_MPS_LOG_DIRECTORY="+s.Log)
			return cmd, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		srv := New(o)
		l, err := listen(o.Socket)
		close(ready)
		if err != nil {
			done <- err
			return
		}
		done <- srv.serveOn(ctx, l)
	}()
	<-ready
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(f.socket); !os.IsNotExist(err) {
			t.Errorf("the socket is left after Serve returned: %v", err)
		}
	})
	return f
}

// quit stops the daemon of uuid, as the plugin's Manager would.
func (f *fixture) quit(t *testing.T, uuid string) {
	t.Helper()
	if _, err := ask(filepath.Join(sharing.MPSDir(f.root, uuid, sharing.MPSPipe), "control"), "quit"); err != nil {
		t.Logf("quit: %v", err)
	}
}

// ask sends one command to a control daemon's socket and returns its
// answer.
func ask(sock, cmd string) (string, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := fmt.Fprintln(c, cmd); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// The launcher starts the daemon of the GPU asked for, with its own
// paths, program and arguments, and the socket is root's only.
func TestStart(t *testing.T) {
	f := serve(t, false)
	fi, err := os.Stat(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	f.makeDirs(t, testGPU)
	if err := Start(t.Context(), f.socket, testGPU); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.quit(t, testGPU) })
	if got, err := ask(filepath.Join(sharing.MPSDir(f.root, testGPU, sharing.MPSPipe), "control"), "get_default_active_thread_percentage"); err != nil || got != "100.0" {
		t.Errorf("the daemon answers %q, %v", got, err)
	}
	want := mpsexec.Spec{
		DriverRoot: f.driverRoot, DevRoot: "/dev", Binary: mpsexec.DefaultBinary, Args: []string{"-d"},
		Env:  []string{"CUDA_VISIBLE_DEVICES=" + testGPU},
		Pipe: sharing.MPSDir(f.root, testGPU, sharing.MPSPipe), Log: sharing.MPSDir(f.root, testGPU, sharing.MPSLog), Shm: sharing.MPSDir(f.root, testGPU, sharing.MPSShm),
	}
	if len(f.specs) != 1 || !specEqual(f.specs[0], want) {
		t.Errorf("the launcher ran %+v, want %+v", f.specs, want)
	}
}

func specEqual(a, b mpsexec.Spec) bool {
	return a.DriverRoot == b.DriverRoot && a.DevRoot == b.DevRoot && a.Binary == b.Binary && a.Pipe == b.Pipe &&
		a.Log == b.Log && a.Shm == b.Shm && slices.Equal(a.Args, b.Args) && slices.Equal(a.Env, b.Env)
}

// A request names a GPU and nothing else: paths, programs, arguments and
// environment are refused, as are GPUs whose directories the plugin did
// not make; nothing runs, and the answer says why.
func TestRefuses(t *testing.T) {
	f := serve(t, false)
	f.makeDirs(t, testGPU)
	for _, tc := range []struct {
		name, request, want string
	}{
		{"not JSON", "start GPU-1\n", "not a request"},
		{"a path", `{"gpu":"GPU-../../../../tmp"}`, "not a GPU UUID"},
		{"a MIG device", `{"gpu":"MIG-8c1e7d5a-0000-4000-8000-000000000001"}`, "not a GPU UUID"},
		{"no GPU", `{}`, "not a GPU UUID"},
		{"a program", `{"gpu":"` + testGPU + `","binary":"/bin/sh"}`, `unknown field "binary"`},
		{"arguments", `{"gpu":"` + testGPU + `","args":["-f"]}`, `unknown field "args"`},
		{"environment", `{"gpu":"` + testGPU + `","env":["LD_PRELOAD=/tmp/x.so"]}`, `unknown field "env"`},
		{"a directory", `{"gpu":"` + testGPU + `","pipe":"/tmp"}`, `unknown field "pipe"`},
		{"a GPU without directories", `{"gpu":"GPU-8c1e7d5a-0000-4000-8000-000000000002"}`, "same mpsRoot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", f.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := fmt.Fprint(c, tc.request); err != nil {
				t.Fatal(err)
			}
			if u, ok := c.(*net.UnixConn); ok {
				_ = u.CloseWrite()
			}
			var resp Response
			if err := json.NewDecoder(c).Decode(&resp); err != nil {
				t.Fatal(err)
			}
			if resp.OK || !strings.Contains(resp.Error, tc.want) || strings.Contains(resp.Error, "\n") {
				t.Errorf("answer %+v, want one line refusing it with %q", resp, tc.want)
			}
		})
	}
	if len(f.specs) != 0 {
		t.Errorf("the launcher ran %+v", f.specs)
	}
}

// A daemon that does not start is the launcher's answer: one line with
// what the program said, which the plugin logs and the GPU's shares wait
// on.
func TestStartFails(t *testing.T) {
	f := serve(t, false)
	f.makeDirs(t, testGPU)
	// The stand-in's control socket cannot be made: a directory (not
	// empty, so not removed) holds its name.
	if err := os.MkdirAll(filepath.Join(sharing.MPSDir(f.root, testGPU, sharing.MPSPipe), "control", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := Start(t.Context(), f.socket, testGPU)
	if err == nil || !strings.Contains(err.Error(), "did not start GPU "+testGPU) || strings.Contains(err.Error(), "\n") {
		t.Errorf("err = %v; want one line saying the launcher did not start the daemon", err)
	}
}

// No launcher: the start fails at once, in a line that says what to
// check.
func TestNotAnswering(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "launcher.sock")
	err := Start(t.Context(), sock, testGPU)
	if !errors.Is(err, ErrNotAnswering) || !strings.Contains(err.Error(), "the MPS launcher at "+sock+" does not answer") || !strings.Contains(err.Error(), "DaemonSet") {
		t.Errorf("err = %v; want one saying nothing answers at %s and what to check", err, sock)
	}
	// Through the helper command, as the plugin runs it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := Command(t.Context(), self, sock, []string{"CUDA_VISIBLE_DEVICES=" + testGPU})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "does not answer") || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		t.Errorf("%s: %v, said %q; want exit 1 and one line", HelperCommand, err, out)
	}
	if _, err := Command(t.Context(), self, sock, []string{"CUDA_VISIBLE_DEVICES=0"}); err == nil {
		t.Error("Command took a GPU index for a UUID")
	}
}

// A stale socket a killed launcher left is replaced; a file that is not a
// socket is not.
func TestListenReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "launcher.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err := listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l.remove()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen on a file: %v", err)
	}
}

// The issue this package is for: the process that asks (the plugin) ends,
// taking its whole PID namespace (its container) with it, and the daemon
// the launcher started keeps answering. Started by the asking process
// itself, as the plugin did before, the daemon dies with it.
func TestDaemonOutlivesRequester(t *testing.T) {
	f := serve(t, true)
	self := mpstest.NeedConfinement(t)
	for _, tc := range []struct {
		name     string
		request  func(uuid string) *exec.Cmd
		survives bool
	}{
		{"started through the launcher", func(uuid string) *exec.Cmd {
			return exec.Command(self, HelperCommand, f.socket, uuid)
		}, true},
		{"started by the requester", func(uuid string) *exec.Cmd {
			cmd := exec.Command(f.bin, "-d")
			cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+uuid,
				"CUDA_MPS_PIPE_DIRECTORY="+sharing.MPSDir(f.root, uuid, sharing.MPSPipe), "CUDA_MPS_LOG_DIRECTORY="+sharing.MPSDir(f.root, uuid, sharing.MPSLog))
			return cmd
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uuid := "GPU-8c1e7d5a-0000-4000-8000-00000000000" + map[bool]string{true: "3", false: "4"}[tc.survives]
			f.makeDirs(t, uuid)
			t.Cleanup(func() { f.quit(t, uuid) })
			cmd := tc.request(uuid)
			// PID 1 of a namespace of its own, as the plugin is in its
			// container: when it exits, the kernel kills every process
			// left in the namespace before its parent's wait returns.
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the requester: %v: %s", err, out)
			}
			sock := filepath.Join(sharing.MPSDir(f.root, uuid, sharing.MPSPipe), "control")
			got, err := ask(sock, "get_default_active_thread_percentage")
			switch {
			case tc.survives && (err != nil || got != "100.0"):
				t.Errorf("after the requester ended, the daemon answers %q, %v; want it running", got, err)
			case !tc.survives && err == nil:
				t.Errorf("the daemon the requester started itself outlived it (answered %q): the test does not model a container", got)
			}
		})
	}
}

// The launcher lists a GPU's MPS servers from the host's process table,
// and starts no daemon while one of an earlier daemon runs.
func TestServers(t *testing.T) {
	f := serve(t, false)
	f.makeDirs(t, testGPU)
	if pids, err := Servers(t.Context(), f.socket, testGPU); err != nil || len(pids) != 0 {
		t.Fatalf("no servers: %v, %v", pids, err)
	}
	dir := filepath.Join(f.proc, "77")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/bin/nvidia-cuda-mps-server", filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte("CUDA_VISIBLE_DEVICES="+testGPU+"\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pids, err := Servers(t.Context(), f.socket, testGPU); err != nil || !slices.Equal(pids, []int{77}) {
		t.Errorf("servers: %v, %v; want [77]", pids, err)
	}
	if err := Start(t.Context(), f.socket, testGPU); err == nil || !strings.Contains(err.Error(), "77") {
		t.Errorf("a start beside an orphaned server: %v", err)
	}
	if len(f.specs) != 0 {
		t.Errorf("the launcher ran %+v", f.specs)
	}
}

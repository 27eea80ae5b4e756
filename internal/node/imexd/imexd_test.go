package imexd

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
)

// The test binary is the mps-exec helper, and the fake nvidia-imex and
// nvidia-imex-ctl run unconfined: the daemon checks its config, says it is
// up by a file beside it, and ends at SIGINT; the ctl prints READY while
// that file is there. IMEXD_BIND (target=source) stands for the bind a
// chroot would make: a path under target is read under source.
func TestMain(m *testing.M) {
	mpsexec.RunIfHelper()
	bound := func(p string) string {
		target, source, _ := strings.Cut(os.Getenv("IMEXD_BIND"), "=")
		if rest, ok := strings.CutPrefix(p, target+"/"); ok && target != "" {
			return filepath.Join(source, rest)
		}
		return p
	}
	switch os.Getenv("IMEXD_FAKE") {
	case "nvidia-imex":
		cfg := bound(os.Args[len(os.Args)-1])
		b, err := os.ReadFile(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		kv, err := computedomain.ParseConfigFile(string(b))
		if err == nil {
			_, err = os.Stat(bound(kv["IMEX_NODE_CONFIG_FILE"]))
		}
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
		cfg := bound(os.Args[len(os.Args)-1])
		if _, err := os.Stat(filepath.Join(filepath.Dir(cfg), "up")); err == nil {
			fmt.Println("READY")
		} else {
			fmt.Println("UNAVAILABLE")
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// driverRoot is a whole driver root with nvidia-imex and nvidia-imex-ctl
// (this dynamic test binary, its loader present), which the daemons are
// chrooted into.
func driverRoot(t *testing.T) string {
	root := filepath.Join(t.TempDir(), "driver")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		t.Fatal("the test binary is static; the fixture wants a dynamic program")
	}
	install(t, self, filepath.Join(root, "usr/bin/nvidia-imex"))
	install(t, self, filepath.Join(root, "usr/bin/nvidia-imex-ctl"))
	install(t, "/dev/null", filepath.Join(root, interp))
	return root
}

// install copies from to to.
func install(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// fakeCommand runs the spec's program as this test binary, unconfined,
// and sends each spec it is given to specs.
func fakeCommand(specs chan<- mpsexec.Spec) func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error) {
	return func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error) {
		if err := s.Validate(); err != nil {
			return nil, err
		}
		select {
		case specs <- s:
		default:
		}
		cmd := exec.CommandContext(ctx, os.Args[0], s.Args...)
		cmd.Env = append(os.Environ(), "IMEXD_FAKE="+path.Base(s.Binary))
		for _, b := range s.Binds {
			cmd.Env = append(cmd.Env, "IMEXD_BIND="+b.Target+"="+b.Source)
		}
		return cmd, nil
	}
}

const uid = "0b7d3c1e-5f1a-4c2e-9d7e-1a2b3c4d5e6f"

func newDaemons(t *testing.T) (*Daemons, chan int, string) {
	dir := t.TempDir()
	started := make(chan int, 10)
	ds := New(Options{Dir: dir, BindIP: "10.0.0.1", DriverRoot: driverRoot(t), Command: fakeCommand(nil), RestartDelay: time.Millisecond,
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

// The commands a chrooting driver root gets: the helper's spec names the
// driver root, the plugin's /dev, the program at its in-root path, the
// config at RootDir/<UID> with the domain's directory bound there, and no
// environment of ours; config.cfg names the in-root paths.
func TestConfinedSpec(t *testing.T) {
	dir, root := t.TempDir(), driverRoot(t)
	specs := make(chan mpsexec.Spec, 10)
	ds := New(Options{Dir: dir, BindIP: "10.0.0.1", DriverRoot: root, DevRoot: "/host/dev", Command: fakeCommand(specs), RestartDelay: time.Millisecond})
	if err := ds.Ensure(t.Context(), uid, []string{"10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Stop(uid) })
	seen := RootDir + "/" + uid
	bind := []mpsexec.Bind{{Source: filepath.Join(dir, uid), Target: seen}}
	want := mpsexec.Spec{DriverRoot: root, DevRoot: "/host/dev", Binary: "/usr/bin/nvidia-imex", Args: []string{"-c", seen + "/config.cfg"}, Binds: bind}
	if got := <-specs; !reflect.DeepEqual(got, want) {
		t.Errorf("nvidia-imex spec = %+v\nwant %+v", got, want)
	}
	readyWithin(t, ds)
	want.Binary, want.Args = "/usr/bin/nvidia-imex-ctl", []string{"-q", "-c", seen + "/config.cfg"}
	if got := <-specs; !reflect.DeepEqual(got, want) {
		t.Errorf("nvidia-imex-ctl spec = %+v\nwant %+v", got, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, uid, "config.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := computedomain.ParseConfigFile(string(b))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"IMEX_NODE_CONFIG_FILE": seen + "/nodes_config.cfg", "IMEX_DAEMON_PID_FILE": seen + "/nvidia-imex.pid",
		"LOG_FILE_NAME": seen + "/nvidia-imex.log"} {
		if kv[k] != v {
			t.Errorf("config.cfg: %s=%q, want %q", k, kv[k], v)
		}
	}
}

// A root of programs and libraries only (its loader not in it) runs them
// in place: no chroot, no bind, the config naming the directory itself.
func TestInPlaceSpec(t *testing.T) {
	dir, root := t.TempDir(), driverRoot(t)
	if err := os.RemoveAll(filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(root, "lib64")); err != nil {
		t.Fatal(err)
	}
	specs := make(chan mpsexec.Spec, 10)
	ds := New(Options{Dir: dir, BindIP: "10.0.0.1", DriverRoot: root, Command: fakeCommand(specs), RestartDelay: time.Millisecond})
	if err := ds.Ensure(t.Context(), uid, []string{"10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Stop(uid) })
	got := <-specs
	if got.DriverRoot != "" || len(got.Binds) != 0 || got.Binary != filepath.Join(root, "usr/bin/nvidia-imex") ||
		!slices.Equal(got.Args, []string{"-c", filepath.Join(dir, uid, "config.cfg")}) {
		t.Errorf("in-place spec = %+v", got)
	}
	readyWithin(t, ds)
}

// What cannot run is refused at Ensure, in one line saying what to do: no
// program in the driver root; a directory the helper could not bind.
func TestEnsureRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no nvidia-imex", Options{Dir: t.TempDir(), DriverRoot: t.TempDir()}, "--driver-root"},
		{"a relative directory", Options{Dir: "compute-domains", DriverRoot: driverRoot(t)}, `binds[0].source "compute-domains/` + uid + `" is not an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Command = fakeCommand(nil)
			err := New(tc.o).Ensure(t.Context(), uid, []string{"10.0.0.1"})
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Ensure: %v; want one line saying %q", err, tc.want)
			}
		})
	}
}

// A SIGKILLed plugin run as a host process leaves its daemon running: the
// next run's Sweep kills it by its PID file, whether its domain is kept or
// not, and never a process whose command line does not name the domain.
func TestSweepKillsOrphans(t *testing.T) {
	ds, _, dir := newDaemons(t)
	kept, gone := uid, "11111111-2222-3333-4444-555555555555"
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command("sh", append([]string{"-c", "while :; do sleep 1; done", "nvidia-imex"}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	orphan := func(domain string) *exec.Cmd {
		cmd := start("-c", filepath.Join(dir, domain, "config.cfg"))
		if err := os.MkdirAll(filepath.Join(dir, domain), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, domain, "nvidia-imex.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	a, b := orphan(kept), orphan(gone)
	// A PID file naming a process of another domain's (a PID reused).
	decoy := start("-c", "/elsewhere/config.cfg")
	other := "22222222-2222-3333-4444-555555555555"
	if err := os.MkdirAll(filepath.Join(dir, other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, other, "nvidia-imex.pid"), []byte(strconv.Itoa(decoy.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ds.Sweep([]string{kept}); err != nil {
		t.Fatal(err)
	}
	for name, cmd := range map[string]*exec.Cmd{"kept domain's": a, "removed domain's": b} {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("the %s orphan exited cleanly; want killed", name)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the %s orphan still runs after Sweep", name)
		}
	}
	if err := decoy.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a process not naming its domain was signalled: %v", err)
	}
}

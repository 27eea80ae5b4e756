package ocihook_test

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/ocihook"
)

// shimEnv makes the test binary act as the runtime: in mount and PID namespaces of its own
// it mounts that namespace's procfs at <rootfs>/proc, as runc has done by createContainer
// time, and execs the hook with the rest of its arguments. Like runc 1.1 with a hook entry
// that names no env, it hands the hook the container's environment and leaves its own
// descriptors open: a pipe (runc's log pipe) and a directory of the host (what a leaky
// runtime, CVE-2024-21626, hands on).
const shimEnv = "OCIHOOK_TEST_RUNTIME_ROOTFS"

// volumesEnv lists HOSTDIR=PATH binds the shim makes into the rootfs first, as the
// runtime mounts a pod's volumes: PATH is inside the rootfs.
const volumesEnv = "OCIHOOK_TEST_VOLUMES"

// leakEnv names the host directory the shim leaves open for the hook.
const leakEnv = "OCIHOOK_TEST_LEAK_DIR"

// containerEnv is what the image sets: each would steer a Go program or a dynamic one.
func containerEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"GODEBUG=madvdontneed=0,panicnil=1", "GOMAXPROCS=1", "LD_PRELOAD=/evil.so", "HOME=/root",
	}
}

var (
	buildDir  string // built binaries, shared by every test
	buildOnce sync.Once
	hookBin   string
	libcuda   string
	buildErr  error
)

func TestMain(m *testing.M) {
	if rootfs := os.Getenv(shimEnv); rootfs != "" {
		runtimeShim(rootfs, os.Args[1:])
	}
	if len(os.Args) > 1 && os.Args[1] == cleanChild {
		cleanProcessChild()
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func runtimeShim(rootfs string, argv []string) {
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "shim: %s: %v\n", what, err)
		os.Exit(100)
	}
	for _, v := range strings.Fields(os.Getenv(volumesEnv)) {
		host, inRoot, _ := strings.Cut(v, "=")
		if err := syscall.Mount(host, filepath.Join(rootfs, inRoot), "", syscall.MS_BIND, ""); err != nil {
			fail("mounting volume "+v, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "proc")); err == nil && fi.IsDir() {
		if err := syscall.Mount("proc", filepath.Join(rootfs, "proc"), "proc", 0, ""); err != nil {
			fail("mounting proc", err)
		}
	}
	// Without O_CLOEXEC: both survive the exec, as runc's do.
	var logPipe [2]int
	if err := syscall.Pipe(logPipe[:]); err != nil {
		fail("pipe", err)
	}
	if dir := os.Getenv(leakEnv); dir != "" {
		if _, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0); err != nil {
			fail("opening "+dir, err)
		}
	}
	fail("exec", syscall.Exec(argv[0], argv, containerEnv()))
}

// needRoot skips a test that needs root, or fails it where CI=true.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true")
	}
	t.Skip("needs root")
}

// build compiles, once, the hook (static, CGO_ENABLED=0) and a tiny libcuda.so.1.
func build(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "ocihook-test-"); buildErr != nil {
			return
		}
		hookBin = filepath.Join(buildDir, ocihook.Name)
		libcuda = filepath.Join(buildDir, "libcuda.so.1")
		cmd := exec.Command("go", "build", "-o", hookBin, "github.com/gpu-device-plugin/gpu-device-plugin/cmd/gpu-device-plugin-cdi-hook")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		if buildErr = checkStatic(hookBin); buildErr != nil {
			return
		}
		buildErr = gcc(filepath.Join(buildDir, "empty.c"), "", "-shared", "-Wl,-soname,libcuda.so.1", "-o", libcuda)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// checkStatic fails for an executable that needs a dynamic loader: the hook runs on hosts
// whose libc nobody knows.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

func gcc(src, code string, args ...string) error {
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		return err
	}
	out, err := exec.Command("gcc", append(args, src)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gcc: %w\n%s", err, out)
	}
	return nil
}

// bundle is a fake OCI bundle in the layout containerd writes: config.json beside rootfs.
type bundle struct {
	dir, rootfs string
	sentinel    string   // outside the rootfs; no attack may change it
	volumes     []string // HOSTDIR=PATH binds into the rootfs (volumesEnv)
}

const (
	rhelLib   = "/usr/lib64"
	debianLib = "/usr/lib/x86_64-linux-gnu"
)

// newBundle makes a bundle whose rootfs has /proc, /etc/ld.so.conf including
// ld.so.conf.d, libcuda.so.1 in libDir and, when withLdconfig, this machine's static
// ldconfig at /sbin/ldconfig.
func newBundle(t *testing.T, libDir string, withLdconfig bool) bundle {
	t.Helper()
	build(t)
	top := t.TempDir()
	b := bundle{dir: filepath.Join(top, "bundle"), rootfs: filepath.Join(top, "bundle", "rootfs"), sentinel: filepath.Join(top, "sentinel")}
	for _, d := range []string{"proc", "sbin", "etc/ld.so.conf.d", libDir} {
		mkdir(t, filepath.Join(b.rootfs, d))
	}
	mkdir(t, b.sentinel)
	writeFile(t, filepath.Join(b.sentinel, "secret"), "host data\n", 0o644)
	writeFile(t, filepath.Join(b.rootfs, "etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n", 0o644)
	copyFile(t, libcuda, filepath.Join(b.rootfs, libDir, "libcuda.so.1"))
	if withLdconfig {
		copyFile(t, "/sbin/ldconfig", filepath.Join(b.rootfs, "sbin/ldconfig"))
	}
	writeFile(t, filepath.Join(b.dir, "config.json"), `{"ociVersion":"1.2.0","root":{"path":"rootfs"}}`, 0o644)
	return b
}

// run runs the hook the way runc does: the OCI state on stdin, a clean environment.
func (b bundle) run(t *testing.T, args ...string) (stderr string, code int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(map[string]any{"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": b.dir})
	cmd := exec.Command(self, append([]string{hookBin}, args...)...)
	cmd.Env = []string{shimEnv + "=" + b.rootfs, leakEnv + "=" + b.sentinel, volumesEnv + "=" + strings.Join(b.volumes, " ")}
	// As under runc: the hook's PID namespace is the container's, whose pid 1 (the runtime's
	// init, here the shim) still has the host's / as its root.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Cloneflags: syscall.CLONE_NEWPID}
	cmd.Stdin = bytes.NewReader(state)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if exit, ok := err.(*exec.ExitError); ok {
		return out.String(), exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

func createContainerArgs(libDir string) []string {
	return []string{"create-container", "--link", "libcuda.so.1::" + libDir + "/libcuda.so", "--folder", libDir}
}

func TestCreateContainerLayouts(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name, libDir string
		absoluteRoot bool
		noConf       bool // no /etc/ld.so.conf nor ld.so.conf.d: only ldconfig's command line names the folder
	}{
		{name: "debian", libDir: debianLib},
		{name: "rhel", libDir: rhelLib, absoluteRoot: true},
		{name: "folder known only from the command line", libDir: "/opt/nvidia/lib", noConf: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t, tc.libDir, true)
			if tc.absoluteRoot {
				writeFile(t, filepath.Join(b.dir, "config.json"), `{"root":{"path":"`+b.rootfs+`"}}`, 0o644)
			}
			if tc.noConf {
				removeAll(t, filepath.Join(b.rootfs, "etc/ld.so.conf"), filepath.Join(b.rootfs, "etc/ld.so.conf.d"))
			}
			for i := range 2 { // the second run finds everything done and must still succeed
				stderr, code := b.run(t, createContainerArgs(tc.libDir)...)
				if code != 0 || strings.Contains(stderr, "leaving") {
					t.Fatalf("run %d: exit %d, stderr:\n%s", i, code, stderr)
				}
			}
			if got, err := os.Readlink(filepath.Join(b.rootfs, tc.libDir, "libcuda.so")); err != nil || got != "libcuda.so.1" {
				t.Errorf("libcuda.so -> %q, %v; want libcuda.so.1", got, err)
			}
			conf := filepath.Join(b.rootfs, "etc/ld.so.conf.d", ocihook.ConfName)
			if data, err := os.ReadFile(conf); tc.noConf != (err != nil) || (err == nil && !strings.Contains(string(data), "\n"+tc.libDir+"\n")) {
				t.Errorf("%s: %q, %v", conf, data, err)
			}
			out, err := exec.Command("/sbin/ldconfig", "-p", "-C", filepath.Join(b.rootfs, "etc/ld.so.cache")).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "\tlibcuda.so.1 (") || !strings.Contains(string(out), "=> "+tc.libDir+"/libcuda.so.1\n") {
				t.Errorf("the container's ld cache does not list %s/libcuda.so.1 (%v):\n%s", tc.libDir, err, out)
			}
			if fi, err := os.Stat(filepath.Join(b.rootfs, "etc/ld.so.cache")); err != nil || fi.Mode() != 0o644 {
				t.Errorf("ld.so.cache: %v, %v; want a 0644 file", fi, err)
			}
			entries, _ := os.ReadDir(filepath.Join(b.rootfs, "etc"))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("temporary file left in /etc: %s", e.Name())
				}
			}
		})
	}
}

func TestMissingLdconfig(t *testing.T) {
	needRoot(t)
	b := newBundle(t, rhelLib, false)
	stderr, code := b.run(t, createContainerArgs(rhelLib)...)
	if code != 0 || !strings.Contains(stderr, "no ldconfig in the image") {
		t.Fatalf("exit %d, want 0 and a note about ldconfig; stderr:\n%s", code, stderr)
	}
	if got, err := os.Readlink(filepath.Join(b.rootfs, rhelLib, "libcuda.so")); err != nil || got != "libcuda.so.1" {
		t.Errorf("libcuda.so -> %q, %v; want libcuda.so.1", got, err)
	}
}

func TestFailures(t *testing.T) {
	needRoot(t)
	b := newBundle(t, rhelLib, true)
	t.Run("missing bundle", func(t *testing.T) {
		removeAll(t, b.dir)
		if stderr, code := b.run(t, createContainerArgs(rhelLib)...); code != 1 || !strings.Contains(stderr, "bundle") {
			t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr)
		}
	})
}

// TestSymlinkAttacks plants symlinks in the image that point at the host; each must
// resolve inside the rootfs, and nothing outside it may change. The hook still exits 0.
func TestSymlinkAttacks(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, b bundle) // replaces part of the image with a symlink
		check func(t *testing.T, b bundle, stderr string)
	}{{
		name:  "library folder is an absolute symlink to the host",
		plant: func(t *testing.T, b bundle) { replaceWithSymlink(t, b.sentinel, b.rootfs, rhelLib) },
		check: wantStderr("not creating " + rhelLib + "/libcuda.so"),
	}, {
		name:  "ld.so.conf.d is an absolute symlink to the host",
		plant: func(t *testing.T, b bundle) { replaceWithSymlink(t, b.sentinel, b.rootfs, "etc/ld.so.conf.d") },
		check: wantStderr("ld.so.conf.d is not a directory"),
	}, {
		name: "ld.so.conf.d is a relative symlink out of the rootfs",
		plant: func(t *testing.T, b bundle) {
			rel, err := filepath.Rel(filepath.Join(b.rootfs, "etc"), b.sentinel)
			if err != nil {
				t.Fatal(err)
			}
			replaceWithSymlink(t, rel, b.rootfs, "etc/ld.so.conf.d")
		},
		check: wantStderr("ld.so.conf.d is not a directory"),
	}, {
		name: "ld.so.conf.d is a long ../ chain",
		plant: func(t *testing.T, b bundle) {
			replaceWithSymlink(t, strings.Repeat("../", 40)+b.sentinel[1:], b.rootfs, "etc/ld.so.conf.d")
		},
		check: wantStderr("ld.so.conf.d is not a directory"),
	}, {
		name: "the conf file is a symlink to a host file",
		plant: func(t *testing.T, b bundle) {
			symlink(t, filepath.Join(b.sentinel, "secret"), filepath.Join(b.rootfs, "etc/ld.so.conf.d", ocihook.ConfName))
		},
		check: wantRegular("etc/ld.so.conf.d/" + ocihook.ConfName),
	}, {
		name: "the link path is a symlink to a host file",
		plant: func(t *testing.T, b bundle) {
			symlink(t, filepath.Join(b.sentinel, "secret"), filepath.Join(b.rootfs, rhelLib, "libcuda.so"))
		},
		check: wantStderr("leaving " + rhelLib + "/libcuda.so alone"),
	}, {
		name: "the link path is a ../ chain to a host file",
		plant: func(t *testing.T, b bundle) {
			symlink(t, strings.Repeat("../", 40)+b.sentinel[1:]+"/secret", filepath.Join(b.rootfs, rhelLib, "libcuda.so"))
		},
		check: wantStderr("leaving " + rhelLib + "/libcuda.so alone"),
	}, {
		name:  "/etc is a symlink to the host",
		plant: func(t *testing.T, b bundle) { replaceWithSymlink(t, b.sentinel, b.rootfs, "etc") },
		check: wantStderr("not installing the ld cache: /etc is not a directory"),
	}, {
		name: "ld.so.cache is a symlink to a host file",
		plant: func(t *testing.T, b bundle) {
			symlink(t, filepath.Join(b.sentinel, "secret"), filepath.Join(b.rootfs, "etc/ld.so.cache"))
		},
		check: wantRegular("etc/ld.so.cache"),
	}, {
		name: "/sbin/ldconfig is a symlink to a host program",
		plant: func(t *testing.T, b bundle) {
			writeFile(t, filepath.Join(b.sentinel, "ldconfig"), "#!/bin/sh\necho pwned > "+b.sentinel+"/pwned\n", 0o755)
			replaceWithSymlink(t, filepath.Join(b.sentinel, "ldconfig"), b.rootfs, "sbin/ldconfig")
		},
		check: wantStderr("no ldconfig in the image"),
	}, {
		// Magic links: /proc/1 is the runtime's init (here the host's), whose root is the
		// host's /. The kernel follows these whatever the chroot.
		name: "ld.so.conf.d is a symlink through /proc/1/root",
		plant: func(t *testing.T, b bundle) {
			replaceWithSymlink(t, "/proc/1/root"+b.sentinel, b.rootfs, "etc/ld.so.conf.d")
		},
		check: wantStderr("ld.so.conf.d is not a directory"),
	}, {
		name: "ld.so.conf.d is a relative symlink through ../proc/1/root",
		plant: func(t *testing.T, b bundle) {
			replaceWithSymlink(t, "../proc/1/root"+b.sentinel, b.rootfs, "etc/ld.so.conf.d")
		},
		check: wantStderr("ld.so.conf.d is not a directory"),
	}, {
		name:  "library folder is a symlink through /proc/1/root",
		plant: func(t *testing.T, b bundle) { replaceWithSymlink(t, "/proc/1/root"+b.sentinel, b.rootfs, rhelLib) },
		check: wantStderr("not creating " + rhelLib + "/libcuda.so"),
	}, {
		name: "library folder is a symlink through /proc/1/cwd",
		plant: func(t *testing.T, b bundle) {
			wd, err := os.Getwd() // the shim's too
			if err != nil {
				t.Fatal(err)
			}
			rel, err := filepath.Rel(wd, b.sentinel)
			if err != nil {
				t.Fatal(err)
			}
			replaceWithSymlink(t, "/proc/1/cwd/"+rel, b.rootfs, rhelLib)
		},
		check: wantStderr("not creating " + rhelLib + "/libcuda.so"),
	}, {
		name: "/etc is a symlink through /proc/1/root",
		plant: func(t *testing.T, b bundle) {
			mkdir(t, filepath.Join(b.sentinel, "ld.so.conf.d")) // so that each write would land
			replaceWithSymlink(t, "/proc/1/root"+b.sentinel, b.rootfs, "etc")
		},
		check: wantStderr("not installing the ld cache: /etc is not a directory"),
	}, {
		name: "/sbin is a symlink through /proc/1/root to a host ldconfig",
		plant: func(t *testing.T, b bundle) {
			writeFile(t, filepath.Join(b.sentinel, "ldconfig"), "#!/bin/sh\necho pwned > "+b.sentinel+"/pwned\n", 0o755)
			replaceWithSymlink(t, "/proc/1/root"+b.sentinel, b.rootfs, "sbin")
		},
		check: wantStderr("no ldconfig in the image"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t, rhelLib, true)
			tc.plant(t, b)
			before := snapshot(t, b.sentinel)
			stderr, code := b.run(t, createContainerArgs(rhelLib)...)
			if code != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", code, stderr)
			}
			if after := snapshot(t, b.sentinel); !maps.Equal(before, after) {
				t.Errorf("the host directory changed:\nbefore %v\nafter  %v\nstderr:\n%s", before, after, stderr)
			}
			tc.check(t, b, stderr)
		})
	}
}

// evilLdconfig is an image's "ldconfig" that tries every way out of its confinement it
// can think of, and reports the privileges it was given. MODE picks the attack: 0 probes,
// 1 fills the disk, 2 loops for ever.
const evilLdconfig = `
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void try_create(const char *what, const char *path) {
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	fprintf(stderr, "evil: %s %s: %s\n", what, path, fd >= 0 ? "ESCAPED" : strerror(errno));
	if (fd >= 0) { write(fd, "pwned\n", 6); close(fd); }
}

static void try_call(const char *what, long r) {
	fprintf(stderr, "evil: %s: %s\n", what, r >= 0 ? "ESCAPED" : strerror(errno));
}

int main(void) {
	char p[8192];
	struct rlimit rl;
#if MODE == 1
	getrlimit(RLIMIT_FSIZE, &rl);
	fprintf(stderr, "evil: RLIMIT_FSIZE %llu\n", (unsigned long long)rl.rlim_max);
	static char buf[1 << 20];
	long total = 0;
	int fd = open("/proc/fill", O_WRONLY | O_CREAT, 0644);
	while (fd >= 0 && write(fd, buf, sizeof buf) > 0) total += sizeof buf;
	fprintf(stderr, "evil: wrote %ld bytes: %s\n", total, strerror(errno));
	return 0;
#elif MODE == 2
	getrlimit(RLIMIT_CPU, &rl);
	fprintf(stderr, "evil: RLIMIT_CPU %llu\n", (unsigned long long)rl.rlim_max);
	for (volatile unsigned long i = 0;; i++) ;
#endif
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2] = {{0}};
	int bnd = 0;
	syscall(SYS_capget, &h, d);
	for (int c = 0; c < 64; c++) if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd++;
	fprintf(stderr, "evil: uid=%d gid=%d groups=%d capeff=%08x%08x capprm=%08x%08x capinh=%08x%08x capbnd=%d nnp=%d\n",
		getuid(), getgid(), getgroups(0, NULL), d[1].effective, d[0].effective, d[1].permitted, d[0].permitted,
		d[1].inheritable, d[0].inheritable, bnd, prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));

	extern char **environ;
	for (char **e = environ; *e; e++) fprintf(stderr, "evil: env %s\n", *e);
	struct stat in;
	fstat(0, &in);
	fprintf(stderr, "evil: stdin %s\n", S_ISCHR(in.st_mode) && in.st_rdev == makedev(1, 3) ? "is /dev/null" : "ESCAPED");
	for (int fd = 3; fd < 1024; fd++) {
		if (fcntl(fd, F_GETFD) < 0) continue;
		// A runtime's log pipe takes forged lines; a host directory, files.
		fprintf(stderr, "evil: inherited fd %d: ESCAPED\n", fd);
		write(fd, "{\"level\":\"panic\",\"msg\":\"pwned\"}\n", 35);
		int f = openat(fd, "fd-pwned", O_WRONLY | O_CREAT, 0644);
		if (f >= 0) close(f);
	}
	snprintf(p, sizeof p, "%s/absolute", SENTINEL); try_create("absolute host path", p);
	snprintf(p, sizeof p, "/proc/1/root%s/proc1", SENTINEL); try_create("through /proc/1/root", p);
	try_create("root-owned file in the image", "/etc/evil");
	try_create("world-writable directory in the image", "/tmp/evil");
	try_create("sysctl", "/proc/sys/kernel/domainname");
	try_call("open a device node in the image", open("/evil-null", O_RDWR));
	try_call("exec another program of the image", execl("/bin/other", "other", (char *)NULL));
	struct io_uring_params up = {0};
	try_call("io_uring_setup", syscall(SYS_io_uring_setup, 1, &up));
	try_call("add_key", syscall(SYS_add_key, "user", "evil", "secret", 6, KEY_SPEC_USER_KEYRING));
	try_call("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0));
	try_call("socket", socket(AF_INET, SOCK_STREAM, 0));
	try_call("setuid(0)", setuid(0));
	try_call("unshare(CLONE_NEWUSER)", unshare(CLONE_NEWUSER));
	try_call("ptrace", syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, 1, 0, 0));
	mkdir("/proc/x", 0755);
	if (chroot("/proc/x") == 0) {
		for (int i = 0; i < 64; i++) chdir("..");
		chroot(".");
		snprintf(p, sizeof p, "%s/chroot", SENTINEL); try_create("after chroot escape", p);
	} else fprintf(stderr, "evil: chroot: %s\n", strerror(errno));
	int forks = 0;
	for (int i = 0; i < 100; i++) {
		pid_t c = fork();
		if (c == 0) { pause(); _exit(0); }
		if (c > 0) forks++;
	}
	fprintf(stderr, "evil: forks: %d\n", forks);
	return 3;
}
`

// hostileImage is a bundle whose /sbin/ldconfig is evilLdconfig in the given mode, with a
// world-writable /tmp, a device node anyone may open and a second program.
func hostileImage(t *testing.T, mode int) bundle {
	t.Helper()
	b := newBundle(t, rhelLib, true)
	evil := filepath.Join(t.TempDir(), "evil.c")
	if err := gcc(evil, evilLdconfig, "-static", "-O1", fmt.Sprintf("-DSENTINEL=%q", b.sentinel), fmt.Sprintf("-DMODE=%d", mode), "-o", filepath.Join(b.rootfs, "sbin/ldconfig")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(b.rootfs, "tmp"))
	if err := os.Chmod(filepath.Join(b.rootfs, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(b.rootfs, "evil-null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(b.rootfs, "evil-null"), 0o666); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(b.rootfs, "bin"))
	copyFile(t, filepath.Join(b.rootfs, "sbin/ldconfig"), filepath.Join(b.rootfs, "bin/other"))
	return b
}

func TestHostileLdconfig(t *testing.T) {
	needRoot(t)
	b := hostileImage(t, 0)
	before := snapshot(t, b.sentinel)
	stderr, code := b.run(t, createContainerArgs(rhelLib)...)
	if code != 0 {
		t.Errorf("exit %d, want 0: a failing ldconfig must not stop the container; stderr:\n%s", code, stderr)
	}
	defer func() {
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr)
		}
	}()
	if after := snapshot(t, b.sentinel); !maps.Equal(before, after) {
		t.Errorf("the host directory changed:\nbefore %v\nafter  %v", before, after)
	}
	// An identity of its own, fresh for each run: not nobody, whom other images share.
	id := regexp.MustCompile(`evil: uid=(\d+) gid=(\d+) `).FindStringSubmatch(stderr)
	if id == nil || id[1] != id[2] {
		t.Errorf("no uid=N gid=N line")
	} else if uid, _ := strconv.Atoi(id[1]); uid < 0x7f000000 || uid > 0x7fffffff {
		t.Errorf("ldconfig ran as uid %d, want one of its own from 0x7f000000 up", uid)
	}
	for _, want := range []string{
		" groups=0 capeff=0000000000000000 capprm=0000000000000000 capinh=0000000000000000 capbnd=0 nnp=1\n",
		"evil: root-owned file in the image /etc/evil: Read-only file system\n",
		"evil: world-writable directory in the image /tmp/evil: Read-only file system\n", // no filling the disk
		"evil: open a device node in the image: Permission denied\n",                     // nodev
		"evil: exec another program of the image: Permission denied\n",                   // noexec
		"evil: io_uring_setup: Function not implemented\n",                               // seccomp
		"evil: add_key: Function not implemented\n",
		"evil: keyctl: Function not implemented\n",
		"evil: socket: Function not implemented\n",
		"evil: setuid(0): Function not implemented\n",
		"evil: unshare(CLONE_NEWUSER): Function not implemented\n",
		"evil: ptrace: Function not implemented\n",
		"evil: chroot: Function not implemented\n",
		"evil: forks: 0\n", // no fork bomb
		"evil: stdin is /dev/null\n",
		// The whole environment: nothing of the image's (containerEnv) reaches it.
		"evil: env " + "PATH=/usr/sbin:/usr/bin:/sbin:/bin\nevil: stdin",
		"/sbin/ldconfig failed: exit status 3",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if strings.Contains(stderr, "ESCAPED") {
		t.Errorf("the image's ldconfig got out:\n%s", stderr)
	}
	for _, f := range []string{"etc/evil", "tmp/evil", "etc/ld.so.cache"} {
		if _, err := os.Lstat(filepath.Join(b.rootfs, f)); err == nil {
			t.Errorf("%s exists in the image: the image's ldconfig wrote it, or its failed cache was installed", f)
		}
	}
	if got, err := os.Readlink(filepath.Join(b.rootfs, rhelLib, "libcuda.so")); err != nil || got != "libcuda.so.1" {
		t.Errorf("libcuda.so -> %q, %v; want libcuda.so.1", got, err)
	}
}

// TestHostileLdconfigLimits: an ldconfig that fills its disk or never ends is stopped by
// its rlimits, and the container still starts.
func TestHostileLdconfigLimits(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name string
		mode int
		want *regexp.Regexp
	}{
		// RLIMIT_FSIZE: SIGXFSZ kills it, or where that is ignored the write fails.
		{"fills the disk", 1, regexp.MustCompile(`(?s)evil: RLIMIT_FSIZE 67108864\n.*(evil: wrote 67108864 bytes: File too large|/sbin/ldconfig failed: signal: file size limit exceeded)`)},
		// RLIMIT_CPU: SIGXCPU, or SIGKILL at the hard limit; not the hook's wall-clock
		// limit ("killed after").
		{"loops for ever", 2, regexp.MustCompile(`(?s)evil: RLIMIT_CPU 5\n.*/sbin/ldconfig failed: signal: (CPU time limit exceeded|killed);`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := hostileImage(t, tc.mode)
			stderr, code := b.run(t, createContainerArgs(rhelLib)...)
			if code != 0 || !tc.want.MatchString(stderr) {
				t.Errorf("exit %d, want 0 and %q; stderr:\n%s", code, tc.want, stderr)
			}
			if _, err := os.Lstat(filepath.Join(b.rootfs, "etc/ld.so.cache")); err == nil {
				t.Errorf("a cache was installed")
			}
		})
	}
}

func TestInstall(t *testing.T) {
	build(t)
	want, err := os.ReadFile(hookBin)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "opt", "bin") // created by install
	installed := filepath.Join(dir, ocihook.Name)
	install := func() {
		t.Helper()
		// umask 077 shows the mode is set, not left to the umask.
		if out, err := exec.Command("sh", "-c", `umask 077 && exec "$0" install --dir "$1"`, hookBin, dir).CombinedOutput(); err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		got, err := os.ReadFile(installed)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("installed copy differs from the executable (%v)", err)
		}
		if fi, _ := os.Stat(installed); fi.Mode() != 0o755 {
			t.Fatalf("installed mode %v, want 0755", fi.Mode())
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Fatalf("install left %d entries in %s, want only %s", len(entries), dir, ocihook.Name)
		}
	}

	install()
	install() // idempotent

	// An old copy open for reading and one running: replaced by rename, so the reader
	// still sees the old bytes whole and the running copy (ETXTBSY to a write in place)
	// does not stop the install.
	writeFile(t, installed, "old copy", 0o755)
	old, err := os.Open(installed)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	install()
	if got, _ := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", old.Fd())); string(got) != "old copy" {
		t.Errorf("the old copy was changed in place: %q", got)
	}
	running := exec.Command(installed, "create-container") // blocks reading the state from stdin
	stdin, err := running.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	install()
	stdin.Close()
	running.Wait()
}

func wantStderr(s string) func(*testing.T, bundle, string) {
	return func(t *testing.T, _ bundle, stderr string) {
		t.Helper()
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr)
		}
	}
}

// wantRegular checks that a symlink planted at path was replaced, not written through.
func wantRegular(path string) func(*testing.T, bundle, string) {
	return func(t *testing.T, b bundle, stderr string) {
		t.Helper()
		if fi, err := os.Lstat(filepath.Join(b.rootfs, path)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, %v; want the planted symlink replaced by a file\n%s", path, fi, err, stderr)
		}
	}
}

// snapshot records every entry under dir: its mode, and a file's content or a link's target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			v += fmt.Sprintf(" %x", sha256.Sum256(data))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			v += " -> " + target
		}
		m[path] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func replaceWithSymlink(t *testing.T, target, rootfs, rel string) {
	t.Helper()
	removeAll(t, filepath.Join(rootfs, rel))
	symlink(t, target, filepath.Join(rootfs, rel))
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func removeAll(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, string(data), 0o755)
}

// TestVolumeRefusals: an image whose paths lead into one of the pod's volumes would have
// root write there, where the pod's user may not, with bytes the image chose. The hook
// refuses the container in one line naming the path, and writes nothing anywhere.
func TestVolumeRefusals(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, b bundle, vol string) // vol: the volume's host directory, mounted at /vol
		path  string                                   // named in the refusal
	}{{
		name: "/etc is a symlink into a volume",
		plant: func(t *testing.T, b bundle, vol string) {
			mkdir(t, filepath.Join(vol, "etc/ld.so.conf.d"))
			replaceWithSymlink(t, "/vol/etc", b.rootfs, "etc")
		},
		path: "/etc/ld.so.conf.d",
	}, {
		name: "ld.so.conf.d is a relative symlink into a volume",
		plant: func(t *testing.T, b bundle, vol string) {
			mkdir(t, filepath.Join(vol, "conf"))
			replaceWithSymlink(t, "../vol/conf", b.rootfs, "etc/ld.so.conf.d")
		},
		path: "/etc/ld.so.conf.d",
	}, {
		name: "the library folder is a symlink into a volume",
		plant: func(t *testing.T, b bundle, vol string) {
			mkdir(t, filepath.Join(vol, "lib"))
			replaceWithSymlink(t, "/vol/lib", b.rootfs, rhelLib)
		},
		path: rhelLib,
	}, {
		name: "/sbin is a symlink into a volume holding an ldconfig",
		plant: func(t *testing.T, b bundle, vol string) {
			mkdir(t, filepath.Join(vol, "sbin"))
			copyFile(t, "/sbin/ldconfig", filepath.Join(vol, "sbin/ldconfig"))
			replaceWithSymlink(t, "/vol/sbin", b.rootfs, "sbin")
		},
		path: "/sbin/ldconfig.real", // the first one looked for
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t, rhelLib, true)
			vol := t.TempDir()
			mkdir(t, filepath.Join(b.rootfs, "vol"))
			b.volumes = []string{vol + "=/vol"}
			tc.plant(t, b, vol)
			volBefore, rootBefore := snapshot(t, vol), snapshot(t, b.rootfs)
			stderr, code := b.run(t, createContainerArgs(rhelLib)...)
			want := ocihook.Name + ": refusing the container: open " + tc.path + ": leads off the container's own filesystem"
			if code != 1 || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want 1 and one line starting %q; stderr:\n%s", code, want, stderr)
			}
			if after := snapshot(t, vol); !maps.Equal(volBefore, after) {
				t.Errorf("the volume changed:\nbefore %v\nafter  %v", volBefore, after)
			}
			if after := snapshot(t, b.rootfs); !maps.Equal(rootBefore, after) {
				t.Errorf("the rootfs changed before the refusal:\nbefore %v\nafter  %v", rootBefore, after)
			}
		})
	}
}

// TestLdconfigNotAFile: an image whose ldconfig is a device node or a FIFO would have root
// open a device (whose driver acts on open) or block on the FIFO. The sandbox's view of the
// rootfs is nodev, and it opens O_NONBLOCK and checks with fstat: the container is refused
// in one line, promptly.
func TestLdconfigNotAFile(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name string
		mode uint32
		want string
	}{
		{"a device node anyone may open", syscall.S_IFCHR | 0o666, "permission denied"},
		{"a FIFO", syscall.S_IFIFO | 0o666, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t, rhelLib, false)
			if err := syscall.Mknod(filepath.Join(b.rootfs, "sbin/ldconfig.real"), tc.mode, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			stderr, code := b.run(t, createContainerArgs(rhelLib)...)
			want := ocihook.Name + ": refusing the container: open /sbin/ldconfig.real: " + tc.want
			if code != 1 || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want 1 and one line starting %q; stderr:\n%s", code, want, stderr)
			}
		})
	}
}

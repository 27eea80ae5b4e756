package ocihook_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/ocihook"
)

// shimEnv makes the test binary act as the runtime: in a mount namespace of its own it
// mounts a procfs at <rootfs>/proc, as runc has done by createContainer time, and execs
// the hook with the rest of its arguments.
const shimEnv = "OCIHOOK_TEST_RUNTIME_ROOTFS"

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
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func runtimeShim(rootfs string, argv []string) {
	if fi, err := os.Lstat(filepath.Join(rootfs, "proc")); err == nil && fi.IsDir() {
		if err := syscall.Mount("proc", filepath.Join(rootfs, "proc"), "proc", 0, ""); err != nil {
			fmt.Fprintln(os.Stderr, "shim: mounting proc:", err)
			os.Exit(100)
		}
	}
	err := syscall.Exec(argv[0], argv, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"})
	fmt.Fprintln(os.Stderr, "shim:", err)
	os.Exit(100)
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
	sentinel    string // outside the rootfs; no attack may change it
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
	cmd.Env = []string{shimEnv + "=" + b.rootfs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
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
		check: wantStderr("installing /etc/ld.so.cache"),
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

// evilLdconfig is an image's "ldconfig" that tries every way out of the sandbox it can
// think of, and reports the privileges it was given.
const evilLdconfig = `
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void try_create(const char *what, const char *path) {
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	fprintf(stderr, "evil: %s %s: %s\n", what, path, fd >= 0 ? "ESCAPED" : strerror(errno));
	if (fd >= 0) { write(fd, "pwned\n", 6); close(fd); }
}

int main(void) {
	char p[8192];
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2] = {{0}};
	int bnd = 0;
	syscall(SYS_capget, &h, d);
	for (int c = 0; c < 64; c++) if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd++;
	fprintf(stderr, "evil: uid=%d gid=%d groups=%d capeff=%08x%08x capprm=%08x%08x capinh=%08x%08x capbnd=%d nnp=%d\n",
		getuid(), getgid(), getgroups(0, NULL), d[1].effective, d[0].effective, d[1].permitted, d[0].permitted,
		d[1].inheritable, d[0].inheritable, bnd, prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));

	snprintf(p, sizeof p, "%s/absolute", SENTINEL); try_create("absolute host path", p);
	snprintf(p, sizeof p, "/proc/1/root%s/proc1", SENTINEL); try_create("through /proc/1/root", p);
	try_create("root-owned file in the image", "/etc/evil");
	try_create("sysctl", "/proc/sys/kernel/domainname");
	if (setuid(0) == 0) fprintf(stderr, "evil: setuid(0): ESCAPED\n");
	if (unshare(CLONE_NEWUSER) == 0) fprintf(stderr, "evil: unshare(CLONE_NEWUSER): ESCAPED\n");
	else fprintf(stderr, "evil: unshare(CLONE_NEWUSER): %s\n", strerror(errno));
	mkdir("/proc/x", 0755);
	if (chroot("/proc/x") == 0) {
		for (int i = 0; i < 64; i++) chdir("..");
		chroot(".");
		snprintf(p, sizeof p, "%s/chroot", SENTINEL); try_create("after chroot escape", p);
	} else fprintf(stderr, "evil: chroot: %s\n", strerror(errno));
	if (fork() == 0) { pause(); } // a straggler holding stderr: must not keep the hook waiting
	return 3;
}
`

func TestHostileLdconfig(t *testing.T) {
	needRoot(t)
	b := newBundle(t, rhelLib, true)
	evil := filepath.Join(t.TempDir(), "evil.c")
	if err := gcc(evil, evilLdconfig, "-static", "-O1", fmt.Sprintf("-DSENTINEL=%q", b.sentinel), "-o", filepath.Join(b.rootfs, "sbin/ldconfig")); err != nil {
		t.Fatal(err)
	}
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
	for _, want := range []string{
		"evil: uid=65534 gid=65534 groups=0 capeff=0000000000000000 capprm=0000000000000000 capinh=0000000000000000 capbnd=0 nnp=1\n",
		"evil: chroot: Operation not permitted\n",
		"evil: unshare(CLONE_NEWUSER): Operation not permitted\n", // refused to a chrooted process
		"/sbin/ldconfig failed: exit status 3",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if strings.Contains(stderr, "ESCAPED") {
		t.Errorf("the image's ldconfig got out:\n%s", stderr)
	}
	if _, err := os.Lstat(filepath.Join(b.rootfs, "etc/evil")); err == nil {
		t.Error("the image's ldconfig wrote into a root-owned directory of the image")
	}
	if _, err := os.Lstat(filepath.Join(b.rootfs, "etc/ld.so.cache")); err == nil {
		t.Error("the cache of a failed ldconfig was installed")
	}
	if got, err := os.Readlink(filepath.Join(b.rootfs, rhelLib, "libcuda.so")); err != nil || got != "libcuda.so.1" {
		t.Errorf("libcuda.so -> %q, %v; want libcuda.so.1", got, err)
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
			v += " " + string(data)
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

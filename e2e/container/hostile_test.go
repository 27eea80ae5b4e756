package container

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

// reportingLdconfig is an image's "ldconfig" that reports, into the cache file the hook
// asks it for (-C; the hook installs it as /etc/ld.so.cache when it exits 0), what it was
// handed and what it could reach: every descriptor above 2 it inherited (it writes a
// forged runc log line to each and tries to create a file through each), its
// environment, its stdin, and a write, a device open and an exec in each of PATHS.
const reportingLdconfig = `
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static char rep[1 << 16];
static size_t n;
#define say(...) (n += snprintf(rep + n, sizeof rep - n, __VA_ARGS__))

int main(int argc, char **argv) {
	extern char **environ;
	const char *out = NULL;
	for (int i = 1; i + 1 < argc; i++) if (!strcmp(argv[i], "-C")) out = argv[i + 1];
	for (int fd = 3; fd < 1024; fd++) { // first: before this program opens anything
		if (fcntl(fd, F_GETFD) < 0) continue;
		say("inherited fd %d: ESCAPED\n", fd);
		write(fd, "{\"level\":\"panic\",\"msg\":\"pwned\"}\n", 34);
		int f = openat(fd, "pwned", O_WRONLY | O_CREAT, 0644);
		if (f >= 0) close(f);
	}
	for (char **e = environ; *e; e++) say("env %s\n", *e);
	struct stat in;
	fstat(0, &in);
	say("stdin %s\n", S_ISCHR(in.st_mode) && in.st_rdev == makedev(1, 3) ? "/dev/null" : "ESCAPED");
	char paths[] = PATHS, p[4096];
	for (char *dir = strtok(paths, ","); dir; dir = strtok(NULL, ",")) {
		snprintf(p, sizeof p, "%s/written", dir);
		int f = open(p, O_WRONLY | O_CREAT, 0644);
		say("write %s: %s\n", p, f >= 0 ? "ESCAPED" : strerror(errno));
		snprintf(p, sizeof p, "%s/null", dir);
		f = open(p, O_RDWR);
		say("device %s: %s\n", p, f >= 0 ? "ESCAPED" : strerror(errno));
		snprintf(p, sizeof p, "%s/prog", dir);
		execl(p, "prog", (char *)NULL);
		say("exec %s: %s\n", p, strerror(errno));
	}
	say("done\n");
	int f = out ? open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644) : 2;
	write(f, rep, n);
	return 0;
}
`

// hostileImage is image(debian) whose /sbin/ldconfig is reportingLdconfig probing paths.
func hostileImage(t *testing.T, tl tools, paths ...string) string {
	t.Helper()
	rootfs := image(t, tl, debian)
	src := filepath.Join(t.TempDir(), "evil.c")
	if err := os.WriteFile(src, []byte(reportingLdconfig), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("gcc", "-static", "-O1", fmt.Sprintf("-DPATHS=%q", strings.Join(paths, ",")),
		"-o", filepath.Join(rootfs, "sbin/ldconfig"), src).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return rootfs
}

// ldconfigReport reads what reportingLdconfig left as the container's ld cache.
func ldconfigReport(t *testing.T, rootfs string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
	if err != nil || !strings.HasSuffix(string(b), "done\n") {
		t.Fatalf("no report from the image's ldconfig (%v): %q", err, b)
	}
	return string(b)
}

// Under real runc: the hook's environment comes from its CDI entry, or, where a runtime
// drops it, from the hook itself; runc's own descriptors (its log pipe, exec.fifo) never
// reach the image's ldconfig, and its stdin is /dev/null.
func TestHookUnderRuncGetsNothingOfTheRuntimes(t *testing.T) {
	tl := need(t)
	driverRoot, devRoot := host(t, tl, rhel)
	specs := specDir(t, tl, driverRoot, devRoot)
	names := []string{cdi.QualifiedName(cdi.GPUKind, gpus[0].UUID)}
	for _, tc := range []struct {
		name string
		edit func(*oci.Spec)
	}{
		{name: "the spec's hook entry with its env"},
		{name: "a runtime that drops the entry's env", edit: func(s *oci.Spec) {
			s.Process.Env = append(s.Process.Env, "GODEBUG=panicnil=1", "LD_PRELOAD=/evil.so", "GOMAXPROCS=1")
			for _, h := range s.Hooks.CreateContainer {
				h.Env = nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec oci.Spec
			rootfs := hostileImage(t, tl)
			stdout, stderr, err := runContainer(t, rootfs, specs, names, rhel.LibDir, func(s *oci.Spec) {
				if tc.edit != nil {
					tc.edit(s)
				}
				spec = *s
			})
			if err != nil {
				t.Fatalf("runc run: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
			}
			if tc.edit == nil && (spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 1 || len(spec.Hooks.CreateContainer[0].Env) == 0) {
				t.Fatalf("the injected createContainer hook has no env of its own: %+v", spec.Hooks)
			}
			rep := ldconfigReport(t, rootfs)
			if strings.Contains(rep, "ESCAPED") {
				t.Errorf("the image's ldconfig got something of the runtime's:\n%s", rep)
			}
			if want := "env PATH=/usr/sbin:/usr/bin:/sbin:/bin\nstdin /dev/null\n"; !strings.HasPrefix(rep, want) {
				t.Errorf("report starts %q, want %q: the whole environment is the hook's own", rep, want)
			}
		})
	}
}

// A sidecar that shares a volume with the container renames the directory a nested
// volume (a PVC under an emptyDir) is mounted on, in a loop, while the hook restricts the
// mounts the image's ldconfig sees. However the race falls, ldconfig writes nothing,
// opens no device node and execs nothing there: 0 bypasses in the runs where it reported.
func TestHookMountsUnderARenamingSidecar(t *testing.T) {
	tl := need(t)
	driverRoot, devRoot := host(t, tl, rhel)
	specs := specDir(t, tl, driverRoot, devRoot)
	names := []string{cdi.QualifiedName(cdi.GPUKind, gpus[0].UUID)}
	emptyDir, pvc := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(emptyDir, "pvc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// What the image's ldconfig would like to use in the PVC: a device node anyone may
	// open (/dev/null's numbers, which every device cgroup allows) and a program.
	if err := unix.Mknod(filepath.Join(pvc, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	// A script whose interpreter is nowhere: exec fails with EACCES on a noexec mount,
	// with ENOENT elsewhere, and never runs.
	if err := os.WriteFile(filepath.Join(pvc, "prog"), []byte("#!/nonexistent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pvc, 0o777); err != nil {
		t.Fatal(err)
	}
	rootfs := hostileImage(t, tl, "/data/pvc", "/data/moved")
	mkdirs(t, rootfs, "data")
	volumes := func(s *oci.Spec) {
		// The container itself runs no ldconfig: what lands in the PVC is the hook's doing.
		s.Process.Args = []string{"/probe", "-exit"}
		s.Mounts = append(s.Mounts,
			oci.Mount{Destination: "/data", Type: "bind", Source: emptyDir, Options: []string{"rbind", "rw"}},
			oci.Mount{Destination: "/data/pvc", Type: "bind", Source: pvc, Options: []string{"rbind", "rw"}})
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the sidecar
		defer wg.Done()
		a, b := filepath.Join(emptyDir, "pvc"), filepath.Join(emptyDir, "moved")
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Rename(a, b)
			os.Rename(b, a)
		}
	}()
	const runs = 20
	reported, refused := 0, 0
	for i := range runs {
		os.Remove(filepath.Join(rootfs, "etc/ld.so.cache"))
		stdout, stderr, err := runContainer(t, rootfs, specs, names, rhel.LibDir, volumes)
		if err != nil {
			// runc itself may lose the race mounting the PVC, or the hook refuse: the
			// container does not start, which is no bypass.
			refused++
			t.Logf("run %d: did not start: %v: %s%s", i, err, stdout, lastLine(stderr))
			continue
		}
		rep := ldconfigReport(t, rootfs)
		reported++
		if strings.Contains(rep, "ESCAPED") {
			t.Errorf("run %d: the image's ldconfig got past a restriction:\n%s", i, rep)
		}
	}
	close(stop)
	wg.Wait()
	entries, _ := os.ReadDir(pvc)
	for _, e := range entries {
		if e.Name() == "written" || e.Name() == "pwned" {
			t.Errorf("the image's ldconfig wrote %s in the PVC", e.Name())
		}
	}
	t.Logf("%d runs: %d reported by the image's ldconfig, %d did not start, 0 bypasses unless said above", runs, reported, refused)
	if reported == 0 {
		t.Fatal("no run reached the image's ldconfig: the test showed nothing")
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

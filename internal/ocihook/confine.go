package ocihook

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The image's ldconfig is the one piece of foreign code the hook runs, as root's child,
// before the pod's own seccomp profile, LSM label and device cgroup apply. It runs under
// confinement of the hook's own (see Ldconfig), started in two steps: the sandbox starts
// the launcher (this executable again, "ldconfig") while it can still reach its own
// executable, before it enters the rootfs; the launcher waits until the sandbox has
// prepared the rootfs, then confines itself and execs a copy of the image's ldconfig.

const (
	// Where the sandbox puts the copy of the image's ldconfig: a read-only tmpfs over the
	// container's /sys, the one mount ldconfig sees that is not noexec.
	execDir  = "/sys"
	execCopy = execDir + "/ldconfig"
	maxExec  = 64 << 20

	// The range a fresh identity for ldconfig is drawn from: high enough that no account
	// or image file has it, below 2^31 for tools that read uids as signed.
	idBase  = 0x7f000000
	idRange = 0x00ffffff

	goMessage = "go\n"
)

// ldconfigLimits bound what ldconfig may take: it reads headers of a few thousand
// libraries and writes one cache file. Soft and hard limits are equal, so it cannot raise
// them. RLIMIT_NPROC is set after the uid change (see Ldconfig).
var ldconfigLimits = []struct {
	resource int
	max      uint64
}{
	{unix.RLIMIT_AS, 4 << 30},     // it maps each library whole to read its header
	{unix.RLIMIT_FSIZE, maxCache}, // the cache is its only output
	{unix.RLIMIT_NOFILE, 64},
	{unix.RLIMIT_CPU, 5}, // seconds; the wall-clock limit is ldconfigTimeout
	{unix.RLIMIT_CORE, 0},
	{unix.RLIMIT_MEMLOCK, 0},
	{unix.RLIMIT_MSGQUEUE, 0},
	{unix.RLIMIT_LOCKS, 0},
	{unix.RLIMIT_SIGPENDING, 16},
}

// ErrAborted: the sandbox closed fd 3 without the word to go, having nothing for ldconfig
// to do; the launcher exits 0.
var ErrAborted = errors.New("aborted by the sandbox")

// launcher is a started, waiting launcher.
type launcher struct {
	cmd     *exec.Cmd
	goW     *os.File
	statusR *os.File
	id      int
}

// errConfinement: the launcher could not confine the image's ldconfig, which did not run.
// The sandbox refuses the container on it.
var errConfinement = errors.New("confining the image's ldconfig")

// startLauncher starts the launcher for rootfs; it waits for run or abort. It gets the
// word to go on fd 3 and says on fd 4 why it could not exec, if it could not.
func startLauncher(rootfs string, id int, folders []string, out io.Writer) (*launcher, error) {
	goR, goW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer goR.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		goW.Close()
		return nil, err
	}
	defer statusW.Close()
	args := []string{Name, "ldconfig", "--rootfs", rootfs, "--uid", strconv.Itoa(id)}
	for _, f := range folders {
		args = append(args, "--folder", f)
	}
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: args, Env: []string{cleanPath}, Stdout: out, Stderr: out, ExtraFiles: []*os.File{goR, statusW}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID, // whatever it leaves running dies with it
		Pdeathsig:  syscall.SIGKILL,
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		goW.Close()
		statusR.Close()
		return nil, fmt.Errorf("starting the ldconfig launcher: %w", err)
	}
	return &launcher{cmd: cmd, goW: goW, statusR: statusR, id: id}, nil
}

// abort lets a waiting launcher exit without running anything.
func (l *launcher) abort() {
	l.goW.Close()
	l.cmd.Wait()
	l.statusR.Close()
}

// run tells the launcher to exec ldconfig, and waits for it at most timeout. An error
// wrapping errConfinement means ldconfig did not run because it could not be confined.
func (l *launcher) run(timeout time.Duration) error {
	defer l.statusR.Close()
	_, err := io.WriteString(l.goW, goMessage)
	l.goW.Close()
	if err != nil {
		l.cmd.Process.Kill()
		l.cmd.Wait()
		return fmt.Errorf("starting ldconfig: %w", err)
	}
	timer := time.AfterFunc(timeout, func() { l.cmd.Process.Kill() })
	err = l.cmd.Wait()
	stopped := timer.Stop()
	// Written only by the launcher itself, before its exec: ldconfig never holds fd 4.
	if why, _ := io.ReadAll(io.LimitReader(l.statusR, 4096)); len(why) > 0 {
		return fmt.Errorf("%w: %s", errConfinement, why)
	}
	if !stopped {
		return fmt.Errorf("killed after %s: %w", timeout, err)
	}
	return err
}

// ldconfigIdentity draws a uid (and the same gid) for one ldconfig run: one that no other
// process on the host has, so nothing it leaves behind keyed by its uid (keyrings, files
// in a shared volume) is seen by another run. Where the hook runs in a user namespace that
// does not map the range, it falls back to nobody.
func ldconfigIdentity() (int, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	id := idBase + int(binary.LittleEndian.Uint32(b[:])%idRange)
	for _, cand := range []int{id, nobody} {
		uok, err := idMapped("/proc/self/uid_map", cand)
		if err != nil {
			return 0, err
		}
		gok, err := idMapped("/proc/self/gid_map", cand)
		if err != nil {
			return 0, err
		}
		if uok && gok {
			return cand, nil
		}
	}
	return 0, errors.New("neither a fresh uid nor nobody (65534) is mapped in the hook's user namespace")
}

func idMapped(file string, id int) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var inside, outside, count uint64
		if _, err := fmt.Sscan(sc.Text(), &inside, &outside, &count); err != nil {
			return false, fmt.Errorf("%s: %q: %w", file, sc.Text(), err)
		}
		if uint64(id) >= inside && uint64(id)-inside < count {
			return true, nil
		}
	}
	return false, sc.Err()
}

// Ldconfig is the launcher, started by the sandbox as the init of a PID namespace of its
// own, before the sandbox enters the rootfs. It waits on fd 3 for the word to go, then, on
// this one thread, which then execs:
//
//  1. takes a mount namespace of its own with the rootfs bound onto itself, enters it
//     (chroot; no procfs is left in it, the sandbox detached them), and makes every mount
//     in it read-only, nodev, noexec and nosuid (restrictRootfs), except the sandbox's
//     two tmpfs: the scratch over /proc (writable, noexec: the cache goes there) and the
//     read-only one over /sys that holds the copy of ldconfig. So ldconfig can write only
//     the cache, open no device node whatever the runtime's device cgroup says, and exec
//     nothing but itself. The mount table, read again, must show every mount so;
//  2. sets rlimits (address space, file size, open files, CPU time, no core, no locked
//     memory, no message queues);
//  3. empties its capability bounding, inheritable and ambient sets and changes to an
//     identity of its own, drawn fresh for each run (ldconfigIdentity), with no
//     supplementary groups; RLIMIT_NPROC 1 after that, so it cannot fork;
//  4. marks every descriptor above 2 close-on-exec, sets no_new_privs and a seccomp
//     allow-list (seccompFilter);
//  5. execs the copy of ldconfig with the cache going to the scratch tmpfs.
//
// It returns only on failure, after writing the reason on fd 4 (close-on-exec): the
// sandbox then refuses the container, for a confinement that did not hold is not a
// failure of the image's ldconfig.
func Ldconfig(rootfs string, id int, folders []string) error {
	if os.Getpid() != 1 {
		return errors.New("the ldconfig launcher must be started by the sandbox, in a PID namespace of its own")
	}
	// Every step below, namespaces and credentials included, applies to this thread, the
	// one that execs. It is never unlocked.
	runtime.LockOSThread()
	status := os.NewFile(4, "status")
	unix.CloseOnExec(4)
	goR := os.NewFile(3, "go")
	msg, err := io.ReadAll(io.LimitReader(goR, int64(len(goMessage))))
	goR.Close() // not for ldconfig
	if err != nil || string(msg) != goMessage {
		return ErrAborted
	}
	err = confineAndExec(rootfs, id, folders)
	fmt.Fprint(status, err)
	return err
}

func confineAndExec(rootfs string, id int, folders []string) error {
	prog, err := seccompFilter()
	if err != nil {
		return err
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("taking a mount namespace: %w", err)
	}
	if err := unix.Mount(rootfs, rootfs, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding the rootfs: %w", err)
	}
	// Both are read after the chroot, where the rootfs's /proc is the scratch tmpfs.
	mountinfo, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	defer mountinfo.Close()
	fdDir, err := os.Open("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing open files: %w", err)
	}
	defer fdDir.Close()
	if err := unix.Chroot(rootfs); err != nil {
		return fmt.Errorf("entering the rootfs: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering the rootfs: %w", err)
	}
	if err := restrictRootfs(mountinfo, rootfs); err != nil {
		return err
	}
	for _, l := range ldconfigLimits {
		if err := unix.Setrlimit(l.resource, &unix.Rlimit{Cur: l.max, Max: l.max}); err != nil {
			return fmt.Errorf("setting rlimit %d: %w", l.resource, err)
		}
	}
	if err := dropPrivileges(id); err != nil {
		return err
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: 1, Max: 1}); err != nil {
		return fmt.Errorf("setting RLIMIT_NPROC: %w", err)
	}
	if err := closeFrom3(fdDir); err != nil {
		return err
	}
	if err := installSeccomp(prog); err != nil {
		return err
	}
	argv := append([]string{"ldconfig"}, ldconfigArgs(folders)...)
	return fmt.Errorf("exec %s: %w", execCopy, syscall.Exec(execCopy, argv, []string{cleanPath}))
}

// ldconfigArgs: -X, the links in library folders are CDI's business, not ldconfig's. -i:
// no aux cache under /var/cache, which it could not write. Folders on the command line go
// into the cache even where the image's ld.so.conf does not include ld.so.conf.d.
func ldconfigArgs(folders []string) []string {
	return append([]string{"-i", "-X", "-C", scratchCache}, folders...)
}

// dropPrivileges leaves this thread, and so the ldconfig it execs, with no capability and
// no way to gain one: after exec a process's capabilities come only from the bounding,
// inheritable and ambient sets, all emptied, and a non-zero uid clears the rest.
// no_new_privs stops a setuid binary from giving uid 0 back. Credentials are changed with
// raw calls, for this thread alone: Go's Setuid changes every thread, which a locked,
// namespace-changed thread does not want, and cgo builds refuse.
func dropPrivileges(id int) error {
	for c := 0; c < 64; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability this kernel knows
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	// EINVAL: a kernel older than 4.3 has no ambient set to clear.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing inheritable capabilities: %w", err)
	}
	for _, c := range []struct {
		what string
		nr   uintptr
		args [3]uintptr
	}{
		{"setgroups", unix.SYS_SETGROUPS, [3]uintptr{0, 0, 0}},
		{"setresgid", unix.SYS_SETRESGID, [3]uintptr{uintptr(id), uintptr(id), uintptr(id)}},
		{"setresuid", unix.SYS_SETRESUID, [3]uintptr{uintptr(id), uintptr(id), uintptr(id)}},
	} {
		if _, _, errno := unix.RawSyscall(c.nr, c.args[0], c.args[1], c.args[2]); errno != 0 {
			return fmt.Errorf("%s to %d: %w", c.what, id, errno)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return nil
}

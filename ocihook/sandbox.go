package ocihook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// ConfName is the file written in the image's /etc/ld.so.conf.d, so that an ldconfig
	// run later inside the container keeps the folders.
	ConfName = "00-gpu-device-plugin.conf"

	// The image's ldconfig runs as nobody: without uid 0 it cannot write root-owned files,
	// sysctls or /proc/sysrq-trigger, whatever the runtime has not yet masked.
	nobody = 65534

	// scratch is where the image's ldconfig writes the new cache: a tmpfs that the sandbox
	// mounts over the container's /proc, so that the procfs is out of sight as well.
	scratch      = "/proc"
	scratchCache = scratch + "/ld.so.cache"
	maxCache     = 64 << 20
)

// ldconfigPaths are where images keep ldconfig, best first: Ubuntu's /sbin/ldconfig is a
// shell script around /sbin/ldconfig.real.
var ldconfigPaths = []string{"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig"}

// Sandbox does req inside rootfs. It must run as the init of fresh mount and PID
// namespaces, as CreateContainer starts it. It returns an error only when it could not
// enter the rootfs or could not drop privileges; the rest is reported on stderr.
func Sandbox(rootfs string, req Request, stderr io.Writer) error {
	if os.Getpid() != 1 {
		return errors.New("sandbox must be started by create-container, in namespaces of its own")
	}
	if !filepath.IsAbs(rootfs) {
		return fmt.Errorf("rootfs %q is not an absolute path", rootfs)
	}
	// Credentials, NO_NEW_PRIVS and the bounding set belong to a thread: the thread that
	// drops them must be the one that starts ldconfig.
	runtime.LockOSThread()
	// Mounts made below must not propagate back to the runtime's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// From here every path, absolute symlinks and .. included, resolves inside the rootfs.
	if err := unix.Chroot(rootfs); err != nil {
		return fmt.Errorf("entering rootfs %s: %w", rootfs, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering rootfs %s: %w", rootfs, err)
	}
	log := func(format string, args ...any) { fmt.Fprintf(stderr, Name+": "+format+"\n", args...) }
	for _, l := range req.Links {
		ensureLink(l, log)
	}
	if len(req.Folders) > 0 {
		writeConf(req.Folders, log)
	}
	return updateCache(req.Folders, stderr, log)
}

type logFunc func(format string, args ...any)

func ensureLink(l Link, log logFunc) {
	dir := filepath.Dir(l.Path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		log("not creating %s: %s is not a directory in the container", l.Path, dir)
		return
	}
	// symlink(2) fails with EEXIST on anything already there, a dangling symlink included,
	// and never follows it.
	err := os.Symlink(l.Target, l.Path)
	if errors.Is(err, fs.ErrExist) {
		if got, rerr := os.Readlink(l.Path); rerr == nil && got == l.Target {
			return
		}
		log("leaving %s alone: it exists and is not a symlink to %s", l.Path, l.Target)
		return
	}
	if err != nil {
		log("creating symlink %s -> %s: %v", l.Path, l.Target, err)
	}
}

func writeConf(folders []string, log logFunc) {
	const dir = "/etc/ld.so.conf.d"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		log("%s is not a directory in the container; folders go into the ld cache only", dir)
		return
	}
	conf := "# Written by " + Name + ": GPU driver libraries mounted by CDI.\n" + strings.Join(folders, "\n") + "\n"
	if err := writeFileAtomic(dir, ConfName, 0o644, strings.NewReader(conf)); err != nil {
		log("writing %s/%s: %v", dir, ConfName, err)
	}
}

// updateCache runs the image's own ldconfig, which alone knows the image's cache format
// and layout, stripped of every privilege, and installs the cache it writes.
func updateCache(folders []string, out io.Writer, log logFunc) error {
	ldconfig := findLdconfig()
	if ldconfig == "" {
		log("no ldconfig in the image (looked for %s); ld cache not updated", strings.Join(ldconfigPaths, ", "))
		return nil
	}
	if err := mountScratch(); err != nil {
		log("not running %s: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	if err := dropPrivileges(); err != nil {
		return fmt.Errorf("dropping privileges to run the image's %s: %w", ldconfig, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ldconfigTimeout)
	defer cancel()
	// -X: the links in library folders are CDI's business, not ldconfig's. -i: no aux cache
	// under /var/cache, which nobody could not write. Folders on the command line go into
	// the cache even where the image's ld.so.conf does not include ld.so.conf.d.
	cmd := exec.CommandContext(ctx, ldconfig, append([]string{"-i", "-X", "-C", scratchCache}, folders...)...)
	cmd.Env = []string{cleanPath}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}},
		Cloneflags: syscall.CLONE_NEWPID, // whatever it leaves running dies with it
		Pdeathsig:  syscall.SIGKILL,
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		log("%s failed: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	cache, err := readScratchCache()
	if err != nil {
		log("reading the cache %s wrote: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	if err := writeFileAtomic("/etc", "ld.so.cache", 0o644, bytes.NewReader(cache)); err != nil {
		log("installing /etc/ld.so.cache: %v", err)
	}
	return nil
}

func findLdconfig() string {
	for _, p := range ldconfigPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// mountScratch covers the container's /proc and /sys. The runtime has mounted them but not
// yet made /proc/sys read-only or masked /proc/sysrq-trigger and the like, and ldconfig
// needs neither. The tmpfs over /proc is the one place nobody may write.
func mountScratch() error {
	fi, err := os.Lstat(scratch)
	if errors.Is(err, fs.ErrNotExist) {
		// Every runtime creates /proc; an image without one gets it a little early.
		if err = os.Mkdir(scratch, 0o555); err == nil {
			fi, err = os.Lstat(scratch)
		}
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s in the image is not a directory", scratch)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", scratch, "tmpfs", flags, fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", maxCache, nobody, nobody)); err != nil {
		return fmt.Errorf("mounting a tmpfs over %s: %w", scratch, err)
	}
	if fi, err := os.Lstat("/sys"); err == nil && fi.IsDir() {
		if err := unix.Mount("tmpfs", "/sys", "tmpfs", flags|unix.MS_RDONLY, "size=4k"); err != nil {
			return fmt.Errorf("mounting a tmpfs over /sys: %w", err)
		}
	}
	return nil
}

// dropPrivileges leaves this thread, and so the ldconfig it starts, unable to gain any
// capability: after exec a process's capabilities come only from the bounding,
// inheritable and ambient sets, all emptied here, whatever its uid or file capabilities.
// NO_NEW_PRIVS stops a setuid binary in the image from giving back uid 0.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
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
	return nil
}

// readScratchCache reads what ldconfig, untrusted, left in the scratch tmpfs: it must be a
// regular file, not a symlink into the image or a FIFO that would block.
func readScratchCache() ([]byte, error) {
	f, err := os.OpenFile(scratchCache, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", scratchCache)
	}
	return readBounded(f, maxCache)
}

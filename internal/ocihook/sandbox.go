package ocihook

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// ConfName is the file written in the image's /etc/ld.so.conf.d, so that an ldconfig
	// run later inside the container keeps the folders.
	ConfName = "00-gpu-device-plugin.conf"

	// The identity the image's ldconfig falls back to where the hook's user namespace does
	// not map a fresh one (see ldconfigIdentity).
	nobody = 65534

	// scratch is where the image's ldconfig writes the new cache: a tmpfs that the sandbox
	// mounts over the container's /proc, whose procfs it has already detached.
	scratch      = "/proc"
	scratchCache = scratch + "/ld.so.cache"
	maxCache     = 64 << 20
)

// ldconfigPaths are where images keep ldconfig, best first: Ubuntu's /sbin/ldconfig is a
// shell script around /sbin/ldconfig.real.
var ldconfigPaths = []string{"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig"}

// Sandbox does req inside rootfs. It must run as the init of fresh mount and PID
// namespaces, as CreateContainer starts it. It returns an error only when it could not
// make the rootfs safe to work in, enter it, or confine ldconfig; the rest is reported on
// stderr.
func Sandbox(rootfs string, req Request, stderr io.Writer) error {
	if os.Getpid() != 1 {
		return errors.New("sandbox must be started by create-container, in namespaces of its own")
	}
	if !filepath.IsAbs(rootfs) {
		return fmt.Errorf("rootfs %q is not an absolute path", rootfs)
	}
	runtime.LockOSThread()
	// Mounts made below must not propagate back to the runtime's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// The mount table names real paths; the runtime's may go through symlinks of the host.
	real, err := filepath.EvalSymlinks(rootfs)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", rootfs, err)
	}
	// Before the first path inside the rootfs is resolved: no magic links.
	if err := hideProcfs(real); err != nil {
		return fmt.Errorf("rootfs %s: %w", real, err)
	}
	log := func(format string, args ...any) { fmt.Fprintf(stderr, Name+": "+format+"\n", args...) }
	// The launcher must start while this executable can still be reached; it waits.
	var l *launcher
	if id, err := ldconfigIdentity(); err != nil {
		log("not running the image's ldconfig: choosing its identity: %v", err)
	} else if l, err = startLauncher(real, id, req.Folders, stderr); err != nil {
		log("not running the image's ldconfig: %v", err)
	}
	// From here every path, absolute symlinks and .. included, resolves inside the rootfs.
	if err := unix.Chroot(real); err != nil {
		return fmt.Errorf("entering rootfs %s: %w", real, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering rootfs %s: %w", real, err)
	}
	for _, l := range req.Links {
		ensureLink(l, log)
	}
	if len(req.Folders) > 0 {
		writeConf(req.Folders, log)
	}
	if l == nil {
		return nil
	}
	updateCache(l, log)
	return nil
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
// and layout, confined (see Ldconfig), and installs the cache it writes.
func updateCache(l *launcher, log logFunc) {
	ldconfig := findLdconfig()
	if ldconfig == "" {
		l.abort()
		log("no ldconfig in the image (looked for %s); ld cache not updated", strings.Join(ldconfigPaths, ", "))
		return
	}
	if err := prepareLdconfig(ldconfig, l.id); err != nil {
		l.abort()
		log("not running %s: %v; ld cache not updated", ldconfig, err)
		return
	}
	if err := l.run(ldconfigTimeout); err != nil {
		log("%s failed: %v; ld cache not updated", ldconfig, err)
		return
	}
	cache, err := readScratchCache()
	if err != nil {
		log("reading the cache %s wrote: %v; ld cache not updated", ldconfig, err)
		return
	}
	if err := writeFileAtomic("/etc", "ld.so.cache", 0o644, bytes.NewReader(cache)); err != nil {
		log("installing /etc/ld.so.cache: %v", err)
	}
}

func findLdconfig() string {
	for _, p := range ldconfigPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// prepareLdconfig mounts the two tmpfs the launcher leaves writable or executable: the
// scratch over /proc, the one place ldconfig may write, owned by its identity; and a
// read-only one over /sys holding a copy of the image's ldconfig, the one file it may exec.
// The runtime has mounted both /proc (the sandbox has detached it) and /sys, and ldconfig
// needs neither.
func prepareLdconfig(ldconfig string, id int) error {
	for _, dir := range []string{scratch, execDir} {
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			// Every runtime creates both; an image without them gets them a little early.
			if err = os.Mkdir(dir, 0o555); err == nil {
				fi, err = os.Lstat(dir)
			}
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s in the image is not a directory", dir)
		}
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV
	if err := unix.Mount("tmpfs", scratch, "tmpfs", flags|unix.MS_NOEXEC, fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", maxCache, id, id)); err != nil {
		return fmt.Errorf("mounting a tmpfs over %s: %w", scratch, err)
	}
	if err := unix.Mount("tmpfs", execDir, "tmpfs", flags, fmt.Sprintf("size=%d,mode=0755", maxExec+4096)); err != nil {
		return fmt.Errorf("mounting a tmpfs over %s: %w", execDir, err)
	}
	if err := copyExecutable(ldconfig, execCopy); err != nil {
		return err
	}
	if err := unix.Mount("", execDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", execDir, err)
	}
	return nil
}

// copyExecutable copies the image's ldconfig, which must be an ELF executable: a script
// would need an interpreter from the image, whose mounts are noexec for ldconfig.
func copyExecutable(from, to string) error {
	src, err := os.OpenFile(from, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", from)
	}
	data, err := readBounded(src, maxExec)
	if err != nil {
		return fmt.Errorf("reading %s: %w", from, err)
	}
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return fmt.Errorf("%s is not an ELF executable (a script?); only a compiled ldconfig is run", from)
	}
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return err
	}
	if _, err := dst.Write(data); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
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

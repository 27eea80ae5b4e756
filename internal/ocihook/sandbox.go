package ocihook

import (
	"bytes"
	"debug/elf"
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

// ExitRefused is the sandbox's exit status when it refused the container: it has written
// the one line saying why, and create-container fails without adding its own.
const ExitRefused = 3

// ErrRefused: the sandbox refused the container and has said why on stderr.
var ErrRefused = errors.New("refused by the sandbox")

// Sandbox does req inside rootfs. It must run as the init of fresh mount and PID
// namespaces, as CreateContainer starts it. It returns an error when it could not make the
// rootfs safe to work in or enter it, and a *Refusal when the image asks it to write or
// run something off the rootfs, or the image's ldconfig could not be confined: then it has
// written nothing. What is merely missing or taken in the image is reported on stderr.
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
	if err := noDevices(real); err != nil {
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
	p, err := plan(req, l != nil, log)
	if err != nil {
		if l != nil {
			l.abort()
		}
		return err
	}
	defer p.close()
	for _, lk := range p.links {
		ensureLink(lk.dir, lk.link, log)
	}
	if p.confDir != nil {
		writeConf(p.confDir, req.Folders, log)
	}
	if l == nil {
		return nil
	}
	return updateCache(l, p, log)
}

// Refusal is a path the sandbox will not act on, and why.
type Refusal struct{ Err error }

func (r *Refusal) Error() string {
	return "refusing the container: " + r.Err.Error() + "; nothing was written"
}
func (r *Refusal) Unwrap() error { return r.Err }

// work is every directory the sandbox will write in, opened before anything is written,
// so that a refusal leaves the rootfs as it was.
type work struct {
	links    []linkIn
	confDir  *os.File // nil: no ld.so.conf.d
	etc      *os.File // nil: no /etc for the cache
	ldconfig *os.File // nil: none in the image, or no cache to update
	open     []*os.File
}

type linkIn struct {
	dir  *os.File
	link Link
}

func (w *work) close() {
	for _, f := range w.open {
		f.Close()
	}
}

// plan opens the directories req writes in. One that is missing is noted and skipped; one
// that leads off the rootfs refuses the container.
func plan(req Request, cache bool, log logFunc) (*work, error) {
	w := &work{}
	dir := func(path, missing string) (*os.File, error) {
		d, err := openDir(path)
		switch {
		case err == nil:
			w.open = append(w.open, d)
			return d, nil
		case errors.Is(err, errOtherFS):
			return nil, &Refusal{Err: fmt.Errorf("%w; nothing was written", err)}
		default:
			log(missing+" (%v)", unwrapPath(err))
			return nil, nil
		}
	}
	fail := func(err error) (*work, error) {
		w.close()
		return nil, err
	}
	for _, l := range req.Links {
		d, err := dir(filepath.Dir(l.Path), "not creating "+l.Path+": "+filepath.Dir(l.Path)+" is not a directory in the container")
		if err != nil {
			return fail(err)
		}
		if d != nil {
			w.links = append(w.links, linkIn{dir: d, link: l})
		}
	}
	var err error
	if len(req.Folders) > 0 {
		if w.confDir, err = dir(confDir, confDir+" is not a directory in the container; folders go into the ld cache only"); err != nil {
			return fail(err)
		}
	}
	if cache {
		if w.etc, err = dir("/etc", "not installing the ld cache: /etc is not a directory in the container"); err != nil {
			return fail(err)
		}
	}
	if w.etc != nil {
		if w.ldconfig, err = findLdconfig(); err != nil {
			return fail(err)
		}
		if w.ldconfig != nil {
			w.open = append(w.open, w.ldconfig)
		} else {
			log("no ldconfig in the image (looked for %s; a symlink there is not followed); ld cache not updated", strings.Join(ldconfigPaths, ", "))
		}
	}
	return w, nil
}

// unwrapPath drops a PathError's own path, which the message names already.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

type logFunc func(format string, args ...any)

const confDir = "/etc/ld.so.conf.d"

func ensureLink(dir *os.File, l Link, log logFunc) {
	name := filepath.Base(l.Path)
	// symlinkat(2) fails with EEXIST on anything already there, a dangling symlink
	// included, and never follows it.
	err := unix.Symlinkat(l.Target, int(dir.Fd()), name)
	if errors.Is(err, unix.EEXIST) {
		buf := make([]byte, len(l.Target)+1)
		if n, rerr := unix.Readlinkat(int(dir.Fd()), name, buf); rerr == nil && string(buf[:n]) == l.Target {
			return
		}
		log("leaving %s alone: it exists and is not a symlink to %s", l.Path, l.Target)
		return
	}
	if err != nil {
		log("creating symlink %s -> %s: %v", l.Path, l.Target, err)
	}
}

func writeConf(dir *os.File, folders []string, log logFunc) {
	conf := "# Written by " + Name + ": GPU driver libraries mounted by CDI.\n" + strings.Join(folders, "\n") + "\n"
	if err := writeFileAt(dir, ConfName, 0o644, strings.NewReader(conf)); err != nil {
		log("writing %s/%s: %v", confDir, ConfName, err)
	}
}

// updateCache runs the image's own ldconfig, which alone knows the image's cache format
// and layout, confined (see Ldconfig), and installs the cache it writes in /etc. It
// returns a *Refusal only when ldconfig could not be confined.
func updateCache(l *launcher, w *work, log logFunc) error {
	if w.ldconfig == nil {
		l.abort()
		return nil
	}
	ldconfig := w.ldconfig.Name()
	if err := prepareLdconfig(w.ldconfig, l.id); err != nil {
		l.abort()
		log("not running %s: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	if err := l.run(ldconfigTimeout); errors.Is(err, errConfinement) {
		return &Refusal{Err: err}
	} else if err != nil {
		log("%s failed: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	cache, err := readScratchCache()
	if err != nil {
		log("reading the cache %s wrote: %v; ld cache not updated", ldconfig, err)
		return nil
	}
	if err := writeFileAt(w.etc, "ld.so.cache", 0o644, bytes.NewReader(cache)); err != nil {
		log("installing /etc/ld.so.cache: %v", err)
	}
	return nil
}

// findLdconfig opens the first of ldconfigPaths that is there. A symlink at the last
// component is taken for absent; one off the rootfs or not a regular file refuses.
func findLdconfig() (*os.File, error) {
	for _, p := range ldconfigPaths {
		f, err := openRegular(p)
		switch {
		case err == nil:
			return f, nil
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
			continue
		default:
			return nil, &Refusal{Err: fmt.Errorf("%w; nothing was written", err)}
		}
	}
	return nil, nil
}

// noDevices makes the sandbox's own view of the rootfs nosuid and nodev (Linux 5.12),
// so that no name the image swaps under it makes root open a device node: the open
// fails before the driver sees it. Older kernels rely on openRegular's O_NONBLOCK and
// fstat, and on openInRoot keeping every open on the rootfs, which nothing but the
// runtime changes before the container starts.
func noDevices(rootfs string) error {
	if err := unix.Mount(rootfs, rootfs, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding the rootfs: %w", err)
	}
	err := unix.MountSetattr(unix.AT_FDCWD, rootfs, unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID})
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("making the rootfs nodev: %w", err)
	}
	return nil
}

// prepareLdconfig mounts the two tmpfs the launcher leaves writable or executable: the
// scratch over /proc, the one place ldconfig may write, owned by its identity; and a
// read-only one over /sys holding a copy of the image's ldconfig, the one file it may exec.
// The runtime has mounted both /proc (the sandbox has detached it) and /sys, and ldconfig
// needs neither; what the runtime mounted at /sys is detached too, so that no mount lies
// hidden under the tmpfs, where a remount by path could not reach it.
func prepareLdconfig(src *os.File, id int) error {
	for _, dir := range []string{scratch, execDir} {
		for {
			err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break // not a mount point (any more)
			}
			if err != nil {
				return fmt.Errorf("detaching what is mounted at %s: %w", dir, err)
			}
		}
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
	if err := copyExecutable(src, execCopy); err != nil {
		return err
	}
	if err := unix.Mount("", execDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", execDir, err)
	}
	return nil
}

// copyExecutable copies the image's ldconfig, which must be a static ELF executable for
// the hook's own architecture: a script or a dynamic program would need an interpreter
// from the image, whose mounts are noexec for ldconfig, and another architecture would
// see other syscall numbers than the seccomp filter's.
func copyExecutable(src *os.File, to string) error {
	data, err := readBounded(src, maxExec)
	if err != nil {
		return fmt.Errorf("reading %s: %w", src.Name(), err)
	}
	if err := checkELF(data); err != nil {
		return fmt.Errorf("%s %w; only a static ldconfig for this machine is run", src.Name(), err)
	}
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o555)
	if err != nil {
		return err
	}
	if _, err := dst.Write(data); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// checkELF says what keeps data from being an executable the launcher can run here.
func checkELF(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return errors.New("is not an ELF executable (a script?)")
	}
	machine, ok := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	switch {
	case !ok:
		return errNoFilter
	case f.Class != elf.ELFCLASS64 || f.Machine != machine:
		return fmt.Errorf("is built for %s %s, not this machine's %s", f.Class, f.Machine, machine)
	case f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN:
		return fmt.Errorf("is an ELF %s, not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("is dynamically linked")
		}
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

package mpsexec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// RunIfHelper, when this process was started as the helper (os.Args is
// self, HelperCommand, spec), runs Main and exits 1 with its error; it
// returns otherwise. Programs without the CLI's hidden command (the DRA
// executable) and tests whose binary stands in for the plugin call it
// first.
func RunIfHelper() {
	if len(os.Args) == 3 && os.Args[1] == HelperCommand {
		fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", Main(os.Args[2]))
		os.Exit(1)
	}
}

// Main is the helper (HelperCommand), started by Command: it decodes the
// spec arg, makes the mounts, chroots into the driver root if one is set
// and execs the binary. It returns only on failure, before the binary
// runs.
func Main(arg string) error {
	s, err := decode(arg)
	if err != nil {
		return err
	}
	if err := ownNamespace(); err != nil {
		return err
	}
	pipe, log, where := s.Pipe, s.Log, ""
	if s.chroot() {
		if err := confine(s); err != nil {
			return fmt.Errorf("mps-exec: confining to the driver root %s: %w", s.DriverRoot, err)
		}
		pipe, log, where = ifSet(s.Pipe, RootPipe), ifSet(s.Log, RootLog), " in the driver root "+s.DriverRoot
	} else if s.Shm != "" {
		if err := unix.Mount(s.Shm, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mps-exec: binding %s on /dev/shm: %w", s.Shm, err)
		}
	}
	bin := s.binary()
	err = unix.Exec(bin, append([]string{bin}, s.Args...), environ(s.Env, pipe, log))
	return fmt.Errorf("mps-exec: running %s%s: %w", bin, where, err)
}

// ifSet is v where set is not empty.
func ifSet(set, v string) string {
	if set == "" {
		return ""
	}
	return v
}

// ownNamespace refuses to go on in the parent's mount namespace: the
// helper started by hand, not through Command, would leave its mounts in
// the plugin's container (or on the host).
func ownNamespace() error {
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mps-exec: reading its mount namespace: %w", err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return fmt.Errorf("mps-exec: reading its parent's mount namespace: %w", err)
	}
	if own == parent {
		return errors.New("mps-exec: runs in its parent's mount namespace, where its mounts would stay; start it through mpsexec.Command")
	}
	return nil
}

// confine mounts what the binary needs inside the driver root, then
// chroots there.
func confine(s Spec) error {
	fd, err := unix.Open(s.DriverRoot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening it: %w", err)
	}
	root := dirIn{fd: fd, path: s.DriverRoot}
	defer unix.Close(fd)

	devRoot := s.DevRoot
	if devRoot == "" {
		devRoot = "/dev"
	}
	// Each only where the root has the directory: a root with no /sys gets
	// none rather than a directory made in the host's driver install.
	for _, m := range []struct{ source, at string }{{devRoot, "dev"}, {"/proc", "proc"}, {"/sys", "sys"}} {
		err := root.mount(m.at, m.source, "", unix.MS_BIND|unix.MS_REC, "")
		if err != nil && !errors.Is(err, errAbsent) {
			return err
		}
	}
	if s.Shm != "" {
		if err := root.mount("dev/shm", s.Shm, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	// The tmpfs keeps the host's /tmp out of the binary's reach and holds
	// the mount points of the pipe and log directories, made in it rather
	// than in the driver install.
	if err := root.mount("tmp", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=16m"); err != nil {
		return fmt.Errorf("%w (the MPS pipe and log directories and the spec's binds go under /tmp)", err)
	}
	binds := slices.Clone(s.Binds)
	if s.Pipe != "" {
		binds = append(binds, Bind{Source: s.Pipe, Target: RootPipe})
	}
	if s.Log != "" {
		binds = append(binds, Bind{Source: s.Log, Target: RootLog})
	}
	for _, b := range binds {
		// Validated: under /tmp, each in a directory of its own, so the
		// mount points are made in the tmpfs, never in a bound source.
		at := strings.Split(strings.TrimPrefix(b.Target, "/"), "/")
		for i := 2; i <= len(at); i++ {
			if err := root.mkdir(strings.Join(at[:i], "/")); err != nil {
				return err
			}
		}
		if err := root.mount(strings.Join(at, "/"), b.Source, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := unix.Fchdir(fd); err != nil {
		return fmt.Errorf("entering it: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

// errAbsent: the mount point is not in the root.
var errAbsent = errors.New("no such directory")

// errSymlink: a mount on a symlink lands where it points, which may be out
// of the driver root.
var errSymlink = errors.New("a symlink, which a mount would follow, maybe out of the driver root; not mounting on it")

// dirIn is a directory (the driver root) that paths are resolved in.
type dirIn struct {
	fd   int
	path string
}

func (d dirIn) name(rel string) string { return filepath.Join(d.path, rel) }

// open opens rel, a slash-separated path with no "..", as an O_PATH
// directory, following no symlink (O_NOFOLLOW with O_DIRECTORY fails on
// one). A missing directory is errAbsent.
func (d dirIn) open(rel string) (int, error) {
	cur, owned := d.fd, false
	closeCur := func() {
		if owned {
			unix.Close(cur)
		}
	}
	parts := strings.Split(rel, "/")
	for i, c := range parts {
		here := d.name(strings.Join(parts[:i+1], "/"))
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			switch {
			case errors.Is(err, fs.ErrNotExist):
				err = errAbsent
			case unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
				err = errSymlink
			}
			closeCur()
			return -1, fmt.Errorf("%s: %w", here, err)
		}
		closeCur()
		cur, owned = next, true
	}
	return cur, nil
}

// mount mounts source on rel, resolved by open, through its descriptor:
// the path is not looked up again.
func (d dirIn) mount(rel, source, fstype string, flags uintptr, data string) error {
	fd, err := d.open(rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(source, fmt.Sprintf("/proc/self/fd/%d", fd), fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", source, d.name(rel), err)
	}
	return nil
}

// mkdir makes rel's last element in its parent, resolved by open.
func (d dirIn) mkdir(rel string) error {
	parent, err := d.open(filepath.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if err := unix.Mkdirat(parent, filepath.Base(rel), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("making %s: %w", d.name(rel), err)
	}
	return nil
}

package ocihook

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// The sandbox runs as root inside the rootfs, where the image chose every name. Each file
// it touches is opened once, by a call that cannot leave the rootfs's own filesystem, and
// then used through that descriptor: the checks are made with fstat on it, and writes go
// through the directory's descriptor (openat, symlinkat, renameat, fsync), so no name is
// looked up twice.

// errOtherFS: a path the sandbox would write or run leads off the container's rootfs,
// into a volume (by a symlink or a mount point). Root must not write there: the pod's user
// may not be able to, and a sidecar may share and change it.
var errOtherFS = errors.New("leads off the container's own filesystem (into a volume or another mount); the hook writes and runs only what is on the rootfs")

// openInRoot opens path, inside the chroot, without crossing a mount point (openat2's
// RESOLVE_NO_XDEV, Linux 5.6) and without magic links. On older kernels it opens the path
// and compares the device of what it got with the rootfs's: a volume is another device.
func openInRoot(path string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC | unix.O_NOCTTY
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.EXDEV):
		return -1, &fs.PathError{Op: "open", Path: path, Err: errOtherFS}
	case errors.Is(err, unix.ENOSYS):
		if fd, err = unix.Open(path, flags, 0); err != nil {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		if err := sameDevice(fd, path); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	case err != nil:
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func sameDevice(fd int, path string) error {
	var st, root unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := unix.Stat("/", &root); err != nil {
		return &fs.PathError{Op: "stat", Path: "/", Err: err}
	}
	if st.Dev != root.Dev {
		return &fs.PathError{Op: "open", Path: path, Err: errOtherFS}
	}
	return nil
}

// openDir opens a directory of the rootfs to write in. Symlinks inside the rootfs are
// followed (they are the image's layout); mount points are not crossed.
func openDir(path string) (*os.File, error) {
	fd, err := openInRoot(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openRegular opens a regular file of the rootfs for reading: not through a symlink at
// its last component, not blocking on a FIFO, and refused unless fstat says regular.
func openRegular(path string) (*os.File, error) {
	fd, err := openInRoot(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: path, Err: errors.New("not a regular file")}
	}
	return f, nil
}

// writeFileAt replaces name in dir with src's content. The temporary file is created with
// O_EXCL|O_NOFOLLOW, which never follows a symlink; renameat replaces the entry at name,
// never what a symlink there points to; the directory is synced through the same
// descriptor. On failure nothing is left behind.
func writeFileAt(dir *os.File, name string, mode fs.FileMode, src io.Reader) (err error) {
	dfd := int(dir.Fd())
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := "." + name + "-" + hex.EncodeToString(suffix[:])
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	defer func() {
		if err != nil {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err = io.Copy(f, src); err != nil {
		return err
	}
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, name, err)
	}
	// Make the rename itself durable.
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("syncing the directory: %w", err)
	}
	return nil
}

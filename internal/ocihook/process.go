package ocihook

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The runtime starts the hook as root with whatever it had open and, where the hook
// entry names no environment, the container's environment (runc 1.1 does both: its log
// pipe and exec.fifo stay open across exec, and the image's variables are set). Neither
// may reach the sandbox or the image's ldconfig, and the image's variables may not steer
// the hook itself (GODEBUG, GOMAXPROCS, GOTRACEBACK are read by the Go runtime).

// CleanProcess makes the calling process fit to run a sub-command: it closes every file
// descriptor above 2 that it inherited, except those in keep (the pipes a parent hook
// hands its launcher on purpose), points a missing stdin at /dev/null, and, when its
// environment is not exactly the hook's own, re-executes itself with that one. argv is
// os.Args. It returns only on failure or when nothing was left to change.
//
// An fd without FD_CLOEXEC at the start of main was inherited across execve: the Go
// runtime opens all of its own with O_CLOEXEC, so closing only those leaves the runtime's
// poller alone while nothing the runtime leaked survives. Before the image's ldconfig
// runs, closeFrom3 marks every descriptor close-on-exec as a second line.
func CleanProcess(argv []string, keep ...int) error {
	if err := closeInherited(keep); err != nil {
		return err
	}
	if err := ensureStdin(); err != nil {
		return err
	}
	if env := os.Environ(); len(env) == 1 && env[0] == cleanPath {
		return nil
	}
	return fmt.Errorf("re-executing with a clean environment: %w", syscall.Exec("/proc/self/exe", argv, []string{cleanPath}))
}

// closeInherited closes every fd above 2 not marked close-on-exec and not in keep.
func closeInherited(keep []int) error {
	fds, err := openFDs()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if fd <= 2 || slices.Contains(keep, fd) {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			continue // closed already: the listing's own descriptor
		}
		if flags&unix.FD_CLOEXEC == 0 {
			if err := unix.Close(fd); err != nil {
				return fmt.Errorf("closing inherited file descriptor %d: %w", fd, err)
			}
		}
	}
	return nil
}

// openFDs lists the process's open descriptors from /proc/self/fd or, where no procfs is
// mounted, by asking each number up to the open-file limit.
func openFDs() ([]int, error) {
	d, err := os.Open("/proc/self/fd")
	if err == nil {
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("listing /proc/self/fd: %w", err)
		}
		fds := make([]int, 0, len(names))
		for _, n := range names {
			if fd, err := strconv.Atoi(n); err == nil {
				fds = append(fds, fd)
			}
		}
		return fds, nil
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("no /proc/self/fd, and no open-file limit: %w", err)
	}
	top := min(lim.Cur, 1<<20)
	var fds []int
	for fd := 3; uint64(fd) < top; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

// ensureStdin opens /dev/null as fd 0 where the runtime left it closed, so that the first
// file the hook opens is never taken for its input.
func ensureStdin() error {
	if _, err := unix.FcntlInt(0, unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		return nil
	}
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY, 0) // lowest free: 0
	if err != nil {
		return fmt.Errorf("opening %s as stdin: %w", os.DevNull, err)
	}
	if fd != 0 {
		unix.Close(fd)
		return fmt.Errorf("opening %s as stdin: got fd %d", os.DevNull, fd)
	}
	return nil
}

// closeFrom3 marks every descriptor above 2 close-on-exec, right before the exec of the
// image's ldconfig: whatever is still open then, ours or not, does not reach it. Marking
// rather than closing leaves the Go runtime's own descriptors working until the exec.
// fdDir is /proc/self/fd opened before the chroot, for kernels without close_range
// (5.11).
func closeFrom3(fdDir *os.File) error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("close_range: %w", err)
	}
	return cloexecListed(fdDir)
}

// cloexecListed marks close-on-exec every descriptor above 2 that fdDir lists.
func cloexecListed(fdDir *os.File) error {
	if _, err := fdDir.Seek(0, 0); err != nil {
		return fmt.Errorf("listing open files: %w", err)
	}
	names, err := fdDir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("listing open files: %w", err)
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd <= 2 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("marking fd %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}

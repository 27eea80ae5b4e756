package ocihook

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ldconfigSyscalls is what glibc's ldconfig needs, on every architecture the hook is built
// for, to read ld.so.conf, walk the library folders, read ELF headers and write a cache
// (strace of ldconfig from glibc 2.17 to 2.41), plus what the Go runtime may do on the
// launching thread between installing the filter and execve. Everything else, among it
// fork and clone, sockets, keyctl, io_uring, bpf, ptrace, mount, chroot, unshare and ioctl,
// fails with ENOSYS, which glibc treats as "not on this kernel".
var ldconfigSyscalls = []uintptr{
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV, unix.SYS_PREAD64,
	unix.SYS_OPENAT, unix.SYS_CLOSE, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX, unix.SYS_LSEEK,
	unix.SYS_FACCESSAT, unix.SYS_FACCESSAT2, unix.SYS_GETDENTS64, unix.SYS_READLINKAT, unix.SYS_GETCWD,
	unix.SYS_CHDIR, unix.SYS_FCHDIR, unix.SYS_RENAMEAT, unix.SYS_RENAMEAT2, unix.SYS_UNLINKAT,
	unix.SYS_MKDIRAT, unix.SYS_FCHMOD, unix.SYS_FCHMODAT, unix.SYS_UMASK, unix.SYS_FSYNC,
	unix.SYS_FDATASYNC, unix.SYS_FTRUNCATE, unix.SYS_FCNTL, unix.SYS_DUP, unix.SYS_DUP3,
	unix.SYS_MMAP, unix.SYS_MPROTECT, unix.SYS_MUNMAP, unix.SYS_MREMAP, unix.SYS_MADVISE, unix.SYS_BRK,
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN, unix.SYS_SIGALTSTACK,
	unix.SYS_UNAME, unix.SYS_SYSINFO, unix.SYS_GETPID, unix.SYS_GETTID, unix.SYS_GETUID,
	unix.SYS_GETEUID, unix.SYS_GETGID, unix.SYS_GETEGID, unix.SYS_TGKILL, unix.SYS_EXIT,
	unix.SYS_EXIT_GROUP, unix.SYS_SET_TID_ADDRESS, unix.SYS_SET_ROBUST_LIST, unix.SYS_RSEQ,
	unix.SYS_PRLIMIT64, unix.SYS_GETRLIMIT, unix.SYS_GETRANDOM, unix.SYS_FUTEX,
	unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES, unix.SYS_GETTIMEOFDAY, unix.SYS_NANOSLEEP,
	unix.SYS_CLOCK_NANOSLEEP, unix.SYS_SCHED_YIELD, unix.SYS_GETGROUPS, unix.SYS_CAPGET,
	// The launcher's own exec of ldconfig. Every other mount ldconfig sees is noexec, so it
	// can only run ldconfig again, under the same filter.
	unix.SYS_EXECVE,
}

// errNoFilter: this architecture has no allow-list, so ldconfig is not run.
var errNoFilter = errors.New("no seccomp allow-list for this architecture")

// seccompFilter is a classic BPF program: the architecture must be the hook's own (a
// 32-bit ldconfig, or x32 calls, would see other numbers), the syscall on the list.
func seccompFilter() ([]unix.SockFilter, error) {
	arch, ok := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	if !ok {
		return nil, errNoFilter
	}
	allowed := append(append([]uintptr{}, ldconfigSyscalls...), archSyscalls...)
	const (
		offNr   = 0 // struct seccomp_data: int nr; __u32 arch; ...
		offArch = 4
		offArg0 = 16 // after nr, arch and the 8-byte instruction pointer; little-endian low word
		ld      = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret     = unix.BPF_RET | unix.BPF_K
	)
	n := len(allowed)
	if n > 250 {
		return nil, fmt.Errorf("%d syscalls do not fit one jump", n) // jt is 8 bits
	}
	prog := []unix.SockFilter{
		{Code: ld, K: offArch},
		{Code: jeq, Jt: 1, K: arch},
		{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS},
		{Code: ld, K: offNr},
	}
	for i, nr := range allowed {
		// On a match, jump over the remaining compares, the prctl compare and the deny.
		prog = append(prog, unix.SockFilter{Code: jeq, Jt: uint8(n - i + 1), K: uint32(nr)})
	}
	deny := unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)}
	allow := unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW}
	return append(prog,
		unix.SockFilter{Code: jeq, Jt: 2, K: unix.SYS_PRCTL},
		deny,
		allow,
		// prctl only to read: whether no_new_privs is set, what the bounding set holds.
		// The option is an int, the low word of args[0].
		unix.SockFilter{Code: ld, K: offArg0},
		unix.SockFilter{Code: jeq, Jt: 2, K: unix.PR_GET_NO_NEW_PRIVS},
		unix.SockFilter{Code: jeq, Jt: 1, K: unix.PR_CAPBSET_READ},
		deny,
		allow,
	), nil
}

// installSeccomp puts the filter on the calling thread only: the thread then execs, and
// the new program keeps it. No other thread of the launcher needs it, and none could run
// with it (the Go runtime needs clone).
func installSeccomp(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	return nil
}

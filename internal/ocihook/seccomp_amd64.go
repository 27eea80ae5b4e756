package ocihook

import "golang.org/x/sys/unix"

// The older calls x86-64 keeps and glibc's ldconfig still makes there.
var archSyscalls = []uintptr{
	unix.SYS_OPEN, unix.SYS_STAT, unix.SYS_LSTAT, unix.SYS_ACCESS, unix.SYS_GETDENTS,
	unix.SYS_READLINK, unix.SYS_RENAME, unix.SYS_UNLINK, unix.SYS_MKDIR, unix.SYS_CHMOD,
	unix.SYS_DUP2, unix.SYS_ARCH_PRCTL, unix.SYS_TIME,
}

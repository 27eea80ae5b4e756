// Package ocihook is gpu-device-plugin-cdi-hook, the OCI createContainer hook that the
// plugin's CDI specs run in every GPU container. CDI bind-mounts the driver libraries
// (libcuda.so.1 and the rest) into the container, at the host's library directory; the
// hook adds what a bind mount cannot:
//
//   - symlinks such as libcuda.so -> libcuda.so.1, for programs that link with -lcuda
//     (--link TARGET::LINK);
//   - the library directories in the container's ld cache, so that `ldconfig -p` lists
//     them whatever the image's distribution (--folder DIR): written to
//     /etc/ld.so.conf.d/00-gpu-device-plugin.conf, so a later ldconfig in the container
//     keeps them, and passed to the image's own ldconfig, so the cache has them now even
//     where ld.so.conf does not include ld.so.conf.d.
//
// It needs nothing on the host but itself: not the NVIDIA container toolkit, not the
// host's ldconfig. `install` puts it on the host from the DaemonSet's init container.
//
// # Safety against a hostile image
//
// The runtime runs the hook as root with the host's filesystem in view, while the rootfs
// holds whatever the image put there, and the pod's volumes, which running pods may share,
// are mounted in it. Before anything else every sub-command closes the descriptors it
// inherited (runc hands on its log pipe and exec.fifo) and, where its environment is not
// its own (runc gives a hook entry without env the container's), re-executes itself with
// PATH alone (CleanProcess); the CDI specs give the hook entry that env too. So the hook
// does nothing inside the rootfs itself. CreateContainer reads the state and config.json
// (trusted: the runtime wrote them) and re-executes itself as Sandbox, in new mount, PID,
// IPC, UTS and network namespaces, with a clean environment and a 30 s limit.
//
// Sandbox makes its mounts private and, before resolving any path inside the rootfs,
// detaches every procfs mounted there (hideProcfs). At createContainer time the runtime
// has mounted the container's /proc, and its magic links (/proc/<pid>/root, cwd, fd/N)
// take the kernel to wherever they point, chroot or not: /proc/1/root of the runtime's
// init is the host's /. Detaching procfs also covers the lookups of the image's ldconfig,
// which we cannot flag. It makes its own view of the rootfs nodev and nosuid, and chroots.
// Every directory it writes in, and the image's ldconfig, is then opened once with
// openat2(RESOLVE_NO_XDEV|RESOLVE_NO_MAGICLINKS) (files with O_NOFOLLOW|O_NONBLOCK,
// checked by fstat), before the first write: a path that leads into a volume refuses the
// container and nothing is written. Files are made through the directory's descriptor
// with O_EXCL or symlinkat(2), and put in place with renameat(2), which replaces a symlink
// rather than writing through it.
//
// The image's ldconfig is the one piece of the image that runs, before the pod's seccomp
// profile and LSM label apply, and maybe before its device cgroup, so the hook confines it
// itself (Ldconfig): the sandbox starts a launcher (this executable again) while it can
// still reach it, and once the rootfs is ready the launcher takes a mount namespace of its
// own in which every mount of the rootfs is read-only, nodev, noexec and nosuid (one
// recursive mount_setattr, or a remount of each, then checked against the mount table),
// save two tmpfs of the sandbox's: a scratch over /proc, the one place ldconfig may write
// (64 MiB), and a read-only one over /sys holding a copy of the image's ldconfig (a static
// ELF for this machine), the one file it may exec. The launcher chroots, sets rlimits
// (4 GiB address space, 64 MiB files, 64 open files, 5 s CPU, no core), empties its
// capability sets, takes a uid and gid of its own, fresh for each run (so nothing keyed by
// uid, a keyring say, is shared with another run; nobody where a user namespace does not
// map the range), RLIMIT_NPROC 1, marks every descriptor close-on-exec, sets no_new_privs
// and a seccomp allow-list (seccomp.go: what glibc's ldconfig calls; fork, sockets, keyctl,
// io_uring, ptrace, mount, chroot, unshare and ioctl get ENOSYS), and execs the copy, in a
// PID namespace of its own (whatever it leaves dies with it) under a 20 s limit. The
// sandbox, still root, checks that what it left is a regular file and installs it as
// /etc/ld.so.cache.
//
// # Exit status
//
// The hook exits 1 when it cannot do its job at all (bad state on stdin, no bundle or
// rootfs, a sandbox that cannot start or runs past its time) and when it refuses the
// container: a path that leads off the rootfs, an ldconfig that is not a regular file, or
// mounts it could not restrict. A refusal is one line naming the path and the reason.
// What is only missing or failing inside the container (a link path already taken, no
// ld.so.conf.d, no ldconfig as in distroless or musl images, an ldconfig that fails) is
// reported on stderr and the hook exits 0: the libraries are still mounted at their usual
// paths, and a failed cache update must not keep every GPU container from starting.
// Runtimes show a hook's stderr mostly when it fails; runc drops it on success.
package ocihook

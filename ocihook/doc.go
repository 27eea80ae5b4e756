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
// holds whatever the image put there. So the hook does nothing inside the rootfs itself.
// CreateContainer reads the state and config.json (trusted: the runtime wrote them) and
// re-executes itself as Sandbox, in new mount, PID, IPC, UTS and network namespaces, with
// a clean environment and a 30 s limit. Sandbox makes its mounts private and chroots
// into the rootfs; from then on every path, absolute symlinks and .. chains included,
// resolves inside the rootfs, so a planted symlink can only point at the image itself.
// Files are created with O_EXCL or symlink(2), which never follow a symlink, and put in
// place with rename(2), which replaces a symlink rather than writing through it.
//
// The image's ldconfig is the one piece of the image that runs. Before it does, the
// sandbox covers the container's /proc and /sys with tmpfs: the runtime has mounted them
// but, at createContainer time, not yet masked /proc/sysrq-trigger nor made /proc/sys
// read-only, and uid 0 needs no capability to write a sysctl such as core_pattern. So
// ldconfig runs as nobody (65534), with empty bounding, inheritable and ambient
// capability sets (exec cannot give it any, whatever its file capabilities),
// no_new_privs (a setuid binary cannot give back uid 0), in a PID namespace of its own
// (whatever it leaves running dies with it), under a 20 s limit. It writes the cache into
// the tmpfs; the sandbox, still root, checks that what it left is a regular file and
// installs it as /etc/ld.so.cache. Being chrooted, it cannot create a user namespace (the
// kernel refuses that to chrooted processes), and without CAP_SYS_CHROOT it cannot
// chroot its way out.
//
// # Exit status
//
// The hook exits 1 only when it cannot do its job at all: bad state on stdin, no bundle or
// rootfs, a sandbox that cannot start or be made safe, or one that runs past its time.
// What goes wrong inside the container (a link path already taken, no ld.so.conf.d, no
// ldconfig as in distroless or musl images, an ldconfig that fails) is reported on stderr
// and the hook exits 0: the libraries are still mounted at their usual paths, and a
// failed cache update must not keep every GPU container from starting. Runtimes show a
// hook's stderr mostly when it fails; runc drops it on success.
package ocihook

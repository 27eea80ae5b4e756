package ocihook

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// What every mount the image's ldconfig sees must be, and the two exceptions the sandbox
// made: the scratch tmpfs it writes the cache to, and the tmpfs holding the copy it execs.
const (
	attrAll = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC
	msAll   = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

	// Passes of the remount fallback: a mount renamed between reading the table and
	// remounting it is found again, under its new name, in the next pass.
	remountPasses = 3
)

// exemption is one of the sandbox's own tmpfs mounts, and what it keeps.
type exemption struct {
	point string // inside the rootfs
	keep  uint64 // MOUNT_ATTR_* left clear
}

func exemptions() []exemption {
	return []exemption{
		{point: scratch, keep: unix.MOUNT_ATTR_RDONLY},
		{point: execDir, keep: unix.MOUNT_ATTR_NOEXEC},
	}
}

// restrictRootfs makes every mount at or under the root (the launcher has chrooted into
// the rootfs, bound onto itself) read-only, nosuid, nodev and noexec, but for the two
// exemptions, then checks the mount table and fails unless each mount ended so.
//
// Where the kernel has mount_setattr (5.12), one recursive call on the root does it: no
// path is walked, so nothing a sidecar renames in a shared volume can make it miss a
// mount. Older kernels remount each mount by its path, which a rename can defeat; the
// check after it catches that. mountinfo is /proc/thread-self/mountinfo, opened before
// the chroot (the rootfs's /proc is the scratch now); rootfs is the rootfs's path as that
// table shows it.
func restrictRootfs(mountinfo *os.File, rootfs string) error {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the rootfs: %w", err)
	}
	defer unix.Close(root)
	err = unix.MountSetattr(root, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attrAll})
	switch {
	case err == nil:
		for _, e := range exemptions() {
			if err := exempt(root, e); err != nil {
				return err
			}
		}
	case errors.Is(err, unix.ENOSYS):
		if err := remountAll(mountinfo, rootfs); err != nil {
			return err
		}
	default:
		return fmt.Errorf("restricting the mounts under %s: mount_setattr: %w", rootfs, err)
	}
	return checkRestricted(mountinfo, rootfs)
}

// exempt clears e.keep on the sandbox's tmpfs at e.point, which must be a tmpfs mount
// root reached without a symlink.
func exempt(root int, e exemption) error {
	fd, err := unix.Openat2(root, strings.TrimPrefix(e.point, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("opening the sandbox's %s: %w", e.point, err)
	}
	defer unix.Close(fd)
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE, &st); err != nil {
		return fmt.Errorf("%s: statx: %w", e.point, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("%s: statfs: %w", e.point, err)
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 || fs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not the sandbox's tmpfs", e.point)
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_clr: e.keep}); err != nil {
		return fmt.Errorf("%s: mount_setattr: %w", e.point, err)
	}
	return nil
}

// remountAll is the fallback for kernels without mount_setattr: a bind remount of each
// mount that is not yet restricted, by its path inside the rootfs, parents first, until
// the table shows none left. Any error fails: a mount that cannot be reached (renamed
// away, covered by another) stays unrestricted, and ldconfig must not run.
func remountAll(mountinfo *os.File, rootfs string) error {
	for pass := 0; ; pass++ {
		left, err := unrestricted(mountinfo, rootfs)
		if err != nil || len(left) == 0 {
			return err
		}
		if pass == remountPasses {
			return nil // checkRestricted names them
		}
		for _, m := range left {
			p := inside(m.point, rootfs)
			flags := uintptr(msAll)
			if e, ok := exemptionAt(p); ok {
				flags &^= attrToMS(e.keep)
			}
			// No atime flag given: a remount keeps the mount's own (which a user
			// namespace may have locked).
			if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("restricting mount %s: %w", p, err)
			}
		}
	}
}

// checkRestricted fails, naming them, when a mount under the rootfs is not what
// restrictRootfs made it.
func checkRestricted(mountinfo *os.File, rootfs string) error {
	left, err := unrestricted(mountinfo, rootfs)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		var names []string
		for _, m := range left {
			names = append(names, fmt.Sprintf("%s (%s)", inside(m.point, rootfs), m.options))
		}
		return fmt.Errorf("mounts under the rootfs still writable, executable, suid or with devices: %s", strings.Join(names, ", "))
	}
	return nil
}

// unrestricted reads the table again and returns the mounts under the rootfs that lack a
// flag they must have, parents first. The rootfs is the topmost mount at its path; what
// is under it is found by parent IDs, not by path, so a renamed mount is not lost.
func unrestricted(mountinfo *os.File, rootfs string) ([]mount, error) {
	if _, err := mountinfo.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	mounts, err := parseMountinfo(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var top *mount
	for i := range mounts {
		if mounts[i].point == rootfs && !slices.ContainsFunc(mounts, func(c mount) bool { return c.parent == mounts[i].id && c.point == rootfs }) {
			top = &mounts[i]
		}
	}
	if top == nil {
		return nil, fmt.Errorf("the rootfs %s is not a mount in the launcher's table", rootfs)
	}
	under := map[int]bool{top.id: true}
	var left []mount
	for grew := true; grew; {
		grew = false
		for _, m := range mounts {
			if under[m.id] || !under[m.parent] {
				continue
			}
			under[m.id], grew = true, true
		}
	}
	for _, m := range mounts {
		if !under[m.id] {
			continue
		}
		want := uint64(attrAll)
		if e, ok := exemptionAt(inside(m.point, rootfs)); ok && m.fstype == "tmpfs" && isTop(mounts, m) {
			want &^= e.keep
		}
		if missing(m.options, want) {
			left = append(left, m)
		}
	}
	slices.SortStableFunc(left, func(a, b mount) int { return strings.Count(a.point, "/") - strings.Count(b.point, "/") })
	return left, nil
}

// isTop: no mount sits on m at its own mount point.
func isTop(mounts []mount, m mount) bool {
	return !slices.ContainsFunc(mounts, func(c mount) bool { return c.parent == m.id && c.point == m.point })
}

func exemptionAt(p string) (exemption, bool) {
	for _, e := range exemptions() {
		if e.point == p {
			return e, true
		}
	}
	return exemption{}, false
}

// missing reports whether the per-mount options lack one of want's flags.
func missing(options string, want uint64) bool {
	opts := strings.Split(options, ",")
	for attr, opt := range map[uint64]string{
		unix.MOUNT_ATTR_RDONLY: "ro", unix.MOUNT_ATTR_NOSUID: "nosuid",
		unix.MOUNT_ATTR_NODEV: "nodev", unix.MOUNT_ATTR_NOEXEC: "noexec",
	} {
		if want&attr != 0 && !slices.Contains(opts, opt) {
			return true
		}
	}
	return false
}

func attrToMS(attr uint64) uintptr {
	var ms uintptr
	for a, m := range map[uint64]uintptr{
		unix.MOUNT_ATTR_RDONLY: unix.MS_RDONLY, unix.MOUNT_ATTR_NOSUID: unix.MS_NOSUID,
		unix.MOUNT_ATTR_NODEV: unix.MS_NODEV, unix.MOUNT_ATTR_NOEXEC: unix.MS_NOEXEC,
	} {
		if attr&a != 0 {
			ms |= m
		}
	}
	return ms
}

// inside turns a mount point of the table into its path inside the rootfs.
func inside(point, rootfs string) string {
	return filepath.Clean("/" + strings.TrimPrefix(strings.TrimPrefix(point, rootfs), "/"))
}

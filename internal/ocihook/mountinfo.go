package ocihook

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mount is one line of a mountinfo file, with the fields the hook uses.
type mount struct {
	id, parent int
	point      string // where it is mounted, as the reading task sees the tree
	options    string // per-mount options: rw,nosuid,nodev,...
	fstype     string
}

// readMountinfo reads the mounts of the calling thread's mount namespace. thread-self,
// not self: a thread that unshared its mount namespace sees its own.
func readMountinfo() ([]mount, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

func parseMountinfo(r io.Reader) ([]mount, error) {
	var mounts []mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 6 || sep < 0 || sep+1 >= len(fields) {
			return nil, fmt.Errorf("mountinfo line %q: not in the kernel's format", sc.Text())
		}
		id, err1 := strconv.Atoi(fields[0])
		parent, err2 := strconv.Atoi(fields[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo line %q: mount IDs are not numbers", sc.Text())
		}
		mounts = append(mounts, mount{id: id, parent: parent, point: unescapeMountinfo(fields[4]), options: fields[5], fstype: fields[sep+1]})
	}
	return mounts, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space and so on).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// under reports whether path is root or inside it.
func under(path, root string) bool {
	return path == root || root == "/" || strings.HasPrefix(path, root+"/")
}

// hideProcfs detaches every procfs mount at or under rootfs, in the calling thread's
// (private) mount namespace. Magic links (/proc/<pid>/root, /proc/<pid>/cwd, /proc/<pid>/fd/N)
// exist only in procfs, and the kernel follows them to wherever they point, chroot or not:
// at createContainer time the container's /proc is mounted and /proc/1/root of the
// runtime's init process is the host's /. With no procfs left in the rootfs, every path the
// hook and the image's ldconfig resolve stays inside it. It fails if any remains.
func hideProcfs(rootfs string) error {
	mounts, err := readMountinfo()
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	var procs []string
	for _, m := range mounts {
		if m.fstype == "proc" && under(m.point, rootfs) {
			procs = append(procs, m.point)
		}
	}
	// Deepest first; a detached parent takes its children with it (EINVAL for them after).
	sort.Slice(procs, func(i, j int) bool { return len(procs[i]) > len(procs[j]) })
	for _, p := range procs {
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detaching the procfs at %s: %w", p, err)
		}
	}
	// What could not be detached (one stacked under another mount, say) fails here.
	mounts, err = readMountinfo()
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	for _, m := range mounts {
		if m.fstype == "proc" && under(m.point, rootfs) {
			return fmt.Errorf("a procfs is still mounted at %s", m.point)
		}
	}
	return nil
}

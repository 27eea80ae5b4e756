package mpsd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// mountShm mounts a tmpfs of ShmSize on dir, the daemon's and its
// clients' /dev/shm, unless one is there: a client filling it fills
// neither the host's /run nor another GPU's. The mount must reach the
// host, where the runtime finds the directory for the clients: where dir
// is on no shared mount (a container's volume without Bidirectional
// propagation), the daemon would get a tmpfs and its clients the
// directory under it, so none is mounted.
func (m *Manager) mountShm(dir string, log *slog.Logger) error {
	if m.o.ShmSize == 0 || isMountPoint(dir) {
		return nil
	}
	if shared, err := onSharedMount(dir); err != nil || !shared {
		log.Warn("the MPS shared memory stays a plain directory: mpsRoot is not on a mount shared with the host (in a pod: mountPropagation Bidirectional), so a tmpfs mounted here would not reach the clients", "dir", dir, "err", err)
		return nil
	}
	opts := fmt.Sprintf("mode=1777,size=%d", m.o.ShmSize)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting the MPS shared memory (a %d MiB tmpfs) on %s: %w", m.o.ShmSize>>20, dir, err)
	}
	return nil
}

// onSharedMount says whether dir is on a mount with shared propagation,
// from /proc/self/mountinfo: the mount whose mount point is dir's longest
// prefix, and its optional fields.
func onSharedMount(dir string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("reading the mount table: %w", err)
	}
	best, shared := "", false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		at := strings.ReplaceAll(f[4], "\\040", " ")
		if !(at == "/" || dir == at || strings.HasPrefix(dir, at+"/")) || len(at) < len(best) {
			continue
		}
		best, shared = at, false
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				shared = true
			}
		}
	}
	return shared, nil
}

// isMountPoint says whether dir is the root of a mount: on another
// device than its parent.
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// mountsAt is what /proc/self/mountinfo says is mounted on dir, or on
// dir under another folder (a volume holding the host's root, say, which
// holds a copy of the mount), for a log line when dir cannot be removed.
func mountsAt(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasSuffix(strings.ReplaceAll(f[4], "\\040", " "), dir) {
			out = append(out, line)
		}
	}
	return out
}

package cudaprobe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// newRoot is where the probe's root is built: a tmpfs mounted on the
// image's /tmp, in the probe's own mount namespace.
const newRoot = "/tmp"

// deviceNodes are the nodes the probe's /dev gets besides its GPU's, where
// the plugin's /dev has them: the driver's control and UVM nodes, which
// CUDA opens, and what any program may open.
var deviceNodes = []struct {
	name     string
	required bool
}{
	{"nvidiactl", true},
	{"nvidia-uvm", false},
	{"nvidia-uvm-tools", false},
	{"null", false}, {"zero", false}, {"random", false}, {"urandom", false},
}

// source is a mount source, opened before the tmpfs covers a path it may
// be under (a test's /tmp), and bound through its descriptor.
type source struct {
	fd   int
	path string
}

func (s source) proc() string { return "/proc/self/fd/" + strconv.Itoa(s.fd) }

// openSource opens path as an O_PATH descriptor, refusing a symlink as its
// last element. want is the file type it must be (unix.S_IFCHR,
// unix.S_IFDIR). A missing path is fs.ErrNotExist.
func openSource(path string, want uint32) (source, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return source{}, fmt.Errorf("opening %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return source{}, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != want {
		unix.Close(fd)
		kind := map[uint32]string{unix.S_IFCHR: "a character device", unix.S_IFDIR: "a directory"}[want]
		return source{}, fmt.Errorf("%s is not %s", path, kind)
	}
	return source{fd: fd, path: path}, nil
}

// confine builds the probe's root and enters it (see the package doc):
// a tmpfs with the GPU's device nodes bound in /dev, a fresh /proc, the
// sysfs read-only, small tmpfs on /tmp and /dev/shm; then pivot_root, the
// old root detached, and the new one read-only.
func confine(f flags) error {
	// Sources first: the tmpfs may cover them.
	nodes := map[string]source{}
	defer func() {
		for _, s := range nodes {
			unix.Close(s.fd)
		}
	}()
	gpu := "nvidia" + strconv.Itoa(f.minor)
	for _, n := range append([]struct {
		name     string
		required bool
	}{{gpu, true}}, deviceNodes...) {
		s, err := openSource(filepath.Join(f.devRoot, n.name), unix.S_IFCHR)
		switch {
		case err == nil:
			nodes[n.name] = s
		case n.required || !errors.Is(err, fs.ErrNotExist):
			return err
		}
	}
	sys, err := openSource(f.sysRoot, unix.S_IFDIR)
	if err != nil {
		return err
	}
	defer unix.Close(sys.fd)

	const private = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", private, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mounting its root, a tmpfs, on %s: %w", newRoot, err)
	}
	at := func(rel string) string { return filepath.Join(newRoot, rel) }
	for _, d := range []string{"dev", "dev/shm", "proc", "sys", "tmp", ".old"} {
		if err := os.Mkdir(at(d), 0o755); err != nil {
			return fmt.Errorf("making its %s: %w", d, err)
		}
	}
	for name, s := range nodes {
		// A bind mount keeps its source's flags: the node opens although
		// the root is nodev.
		if err := os.WriteFile(at("dev/"+name), nil, 0o600); err != nil {
			return fmt.Errorf("making its /dev/%s: %w", name, err)
		}
		if err := unix.Mount(s.proc(), at("dev/"+name), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s on its /dev/%s: %w", s.path, name, err)
		}
	}
	for _, d := range []string{"dev/shm", "tmp"} {
		if err := unix.Mount("tmpfs", at(d), "tmpfs", private, "mode=1777,size=16m"); err != nil {
			return fmt.Errorf("mounting a tmpfs on its /%s: %w", d, err)
		}
	}
	// PID 1 of its namespace, it mounts a procfs that shows its own
	// processes only.
	if err := unix.Mount("proc", at("proc"), "proc", private, ""); err != nil {
		return fmt.Errorf("mounting its /proc: %w", err)
	}
	// The sysfs alone, not what is mounted under it (cgroups, debugfs...),
	// and read-only: CUDA reads the GPU's PCI facts there.
	if err := unix.Mount(sys.proc(), at("sys"), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s on its /sys: %w", sys.path, err)
	}
	if err := unix.Mount("", at("sys"), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|private, ""); err != nil {
		return fmt.Errorf("making its /sys read-only: %w", err)
	}

	if err := unix.PivotRoot(newRoot, at(".old")); err != nil {
		return fmt.Errorf("pivot_root into %s: %w", newRoot, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	if err := unix.Rmdir("/.old"); err != nil {
		return fmt.Errorf("removing the old root's mount point: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|private, ""); err != nil {
		return fmt.Errorf("making its root read-only: %w", err)
	}
	return nil
}

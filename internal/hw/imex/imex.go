package imex

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvcaps"
)

// DeviceName is the driver's name for the IMEX channels' character device
// in /proc/devices, and the directory of their nodes under /dev.
const DeviceName = "nvidia-caps-imex-channels"

// Mode is the mode of a channel node. nvidia-modprobe makes them 0666:
// holding the node grants the channel, and only a process the container
// runtime gave the node can open it.
const Mode = 0o666

// MaxChannel is the highest channel number: the driver allows 2048
// channels (NVreg_ImexChannelCount's default and maximum), numbered from 0.
const MaxChannel = 2047

// Path is channel id's node as a container sees it:
// "/dev/nvidia-caps-imex-channels/channel<id>".
func Path(id int) string {
	return "/dev/" + DeviceName + "/channel" + strconv.Itoa(id)
}

// Major reads the major number of the IMEX channels from procRoot/devices.
// ok is false, with no error, when the file lists no such character
// device: the driver has no IMEX support (before R550, or not on a
// multi-node NVLink system's driver build).
func Major(procRoot string) (major uint32, ok bool, err error) {
	return nvcaps.CharMajor(procRoot, DeviceName)
}

// EnsureChannel makes channel id's node under devRoot, a character device
// major:id of mode Mode in devRoot/nvidia-caps-imex-channels (made 0755
// when missing), and returns its path. A node already there with that
// major and minor is kept. Nothing is followed: the directory is opened
// with O_NOFOLLOW and the node made and checked relative to it, so a
// symbolic link planted at either path (devRoot may be a hostPath others
// write to) is an error, never a way to make a node elsewhere. A path in
// the way that is not that device is an error, never replaced.
func EnsureChannel(devRoot string, major uint32, id int) (string, error) {
	if id < 0 || id > MaxChannel {
		return "", fmt.Errorf("IMEX channel %d: the driver numbers channels 0 to %d", id, MaxChannel)
	}
	if major == 0 {
		return "", errors.New("IMEX channel: major number 0 (the driver's /proc/devices lists no " + DeviceName + ")")
	}
	dirPath := filepath.Join(devRoot, DeviceName)
	name := "channel" + strconv.Itoa(id)
	path := filepath.Join(dirPath, name)
	dir, err := openDir(devRoot)
	if err != nil {
		return "", err
	}
	defer unix.Close(dir)
	want := unix.Mkdev(major, uint32(id))

	var st unix.Stat_t
	err = unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil:
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || uint64(st.Rdev) != want {
			return "", fmt.Errorf("%s exists and is not IMEX channel %d (want a character device %d:%d); remove it", path, id, major, id)
		}
		return path, nil
	case !errors.Is(err, unix.ENOENT):
		return "", fmt.Errorf("checking %s: %w", path, err)
	}
	if err := unix.Mknodat(dir, name, unix.S_IFCHR|Mode, int(want)); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("creating IMEX channel node %s (%d:%d): %w", path, major, id, err)
	}
	// Made or raced: either way it must now be the device.
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", fmt.Errorf("checking %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || uint64(st.Rdev) != want {
		return "", fmt.Errorf("%s exists and is not IMEX channel %d (want a character device %d:%d); remove it", path, id, major, id)
	}
	// mknod's mode passed through the umask; fchmodat on a device never
	// follows (it is not a link: checked above).
	if st.Mode&0o7777 != Mode {
		if err := unix.Fchmodat(dir, name, Mode, 0); err != nil {
			return "", fmt.Errorf("setting the mode of %s: %w", path, err)
		}
	}
	return path, nil
}

// IsChannel says, making nothing, whether channel id's node is in place
// under devRoot (true) or missing, so that EnsureChannel would make it
// (false). Anything else at its path or at the directory's (a symbolic
// link, a file, another device) is the error EnsureChannel would return.
func IsChannel(devRoot string, major uint32, id int) (bool, error) {
	if id < 0 || id > MaxChannel {
		return false, fmt.Errorf("IMEX channel %d: the driver numbers channels 0 to %d", id, MaxChannel)
	}
	dirPath := filepath.Join(devRoot, DeviceName)
	path := filepath.Join(dirPath, "channel"+strconv.Itoa(id))
	fi, err := os.Lstat(dirPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("checking %s: %w", dirPath, err)
	case !fi.IsDir():
		return false, fmt.Errorf("%s is not a directory (a symbolic link or a file); remove it", dirPath)
	}
	var st unix.Stat_t
	err = unix.Lstat(path, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("checking %s: %w", path, err)
	case st.Mode&unix.S_IFMT != unix.S_IFCHR || uint64(st.Rdev) != unix.Mkdev(major, uint32(id)):
		return false, fmt.Errorf("%s exists and is not IMEX channel %d (want a character device %d:%d); remove it", path, id, major, id)
	}
	return true, nil
}

// openDir opens devRoot/nvidia-caps-imex-channels without following a
// link in its last component, making it when missing.
func openDir(devRoot string) (int, error) {
	root, err := unix.Open(devRoot, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", devRoot, err)
	}
	defer unix.Close(root)
	dirPath := filepath.Join(devRoot, DeviceName)
	if err := unix.Mkdirat(root, DeviceName, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("creating %s: %w", dirPath, err)
	}
	dir, err := unix.Openat(root, DeviceName, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s is not a directory (a symbolic link or a file); remove it", dirPath)
		}
		return -1, fmt.Errorf("opening %s: %w", dirPath, err)
	}
	return dir, nil
}

// Channels lists the channel numbers whose nodes exist under devRoot, in
// order: character devices named channel<N> in
// devRoot/nvidia-caps-imex-channels. Other entries are skipped; no
// directory is no channel.
func Channels(devRoot string) ([]int, error) {
	dirPath := filepath.Join(devRoot, DeviceName)
	entries, err := os.ReadDir(dirPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing IMEX channels in %s: %w", dirPath, err)
	}
	var out []int
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), "channel")
		if !ok || e.Type()&fs.ModeCharDevice == 0 || e.Type()&fs.ModeDevice == 0 {
			continue
		}
		id, err := strconv.Atoi(n)
		if err != nil || id < 0 || strconv.Itoa(id) != n {
			continue
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

package nvcaps

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// accessMode is the mode the driver gives MIG access capabilities
// (DeviceFileMode 0444): holding the node open is what grants access, and
// only a process the container runtime gave the node can open it.
const accessMode = 0o444

// EnsureNodes makes /dev/nvidia-caps/nvidia-cap<minor> under devRoot (the
// host's /dev) for each minor that lacks one, as nvidia-modprobe -f does
// after nvidia-smi creates an instance: the driver makes no node when an
// instance is created through NVML, and the container runtime needs the
// host's node to make the container's. The major is nvidia-caps' in
// procRoot's devices file. A path there that is not a character device of
// that major is an error, never replaced.
func EnsureNodes(devRoot, procRoot string, minors []int) error {
	var major uint32
	for _, minor := range minors {
		path := filepath.Join(devRoot, "nvidia-caps", "nvidia-cap"+strconv.Itoa(minor))
		fi, err := os.Lstat(path)
		if err == nil {
			if fi.Mode()&fs.ModeCharDevice == 0 {
				return fmt.Errorf("%s exists and is not a character device", path)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("checking %s: %w", path, err)
		}
		if major == 0 {
			if major, err = capsMajor(procRoot); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
		}
		if err := unix.Mknod(path, unix.S_IFCHR|accessMode, int(unix.Mkdev(major, uint32(minor)))); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating MIG capability node %s (%d:%d): %w", path, major, minor, err)
		}
		// mknod's mode passed through the umask.
		if err := os.Chmod(path, accessMode); err != nil {
			return fmt.Errorf("setting the mode of %s: %w", path, err)
		}
	}
	return nil
}

// capsMajor reads the major number of nvidia-caps from procRoot/devices.
func capsMajor(procRoot string) (uint32, error) {
	n, ok, err := CharMajor(procRoot, "nvidia-caps")
	if err == nil && !ok {
		err = fmt.Errorf("%s lists no nvidia-caps character device: is the NVIDIA driver loaded with MIG support?", filepath.Join(procRoot, "devices"))
	}
	return n, err
}

// CharMajor reads the major number of the character device name from
// procRoot/devices (the driver's nvidia-caps, nvidia-caps-imex-channels).
// ok is false, with no error, when the file does not list it.
func CharMajor(procRoot, name string) (major uint32, ok bool, err error) {
	path := filepath.Join(procRoot, "devices")
	f, err := os.Open(path)
	if err != nil {
		return 0, false, fmt.Errorf("reading the %s major number: %w", name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	chars := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			chars = true
		case strings.HasSuffix(line, ":"):
			chars = false
		case chars:
			num, dev, found := strings.Cut(line, " ")
			if !found || strings.TrimSpace(dev) != name {
				continue
			}
			n, err := strconv.ParseUint(num, 10, 32)
			if err != nil || n == 0 {
				return 0, false, fmt.Errorf("%s: %s major %q is not a number", path, name, num)
			}
			return uint32(n), true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return 0, false, nil
}

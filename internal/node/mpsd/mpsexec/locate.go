package mpsexec

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// controlName is the driver's MPS control program.
const controlName = "nvidia-cuda-mps-control"

// Locate says how to run the driver's control program from driverRoot
// (as this process sees it): the Spec's DriverRoot, Binary and Env.
//   - driverRoot "/": the program at /usr/bin or /bin, no chroot;
//   - a whole root, whose program's dynamic loader is inside it (or a
//     static program): chrooted into it, as a driver container or a host
//     root mounted into the plugin's pod is;
//   - a root of programs and libraries only (bin/, lib64/, as GKE installs
//     the driver): the program run in place, with the root's library
//     directories on LD_LIBRARY_PATH and this process's C library.
func Locate(driverRoot string) (Spec, error) { return LocateProgram(driverRoot, controlName) }

// LocateProgram is Locate for another of the driver's programs (name:
// nvidia-smi), looked for in the same places and run the same way.
func LocateProgram(driverRoot, name string) (Spec, error) {
	root := filepath.Clean(driverRoot)
	if driverRoot == "" {
		root = "/"
	}
	for _, dir := range []string{"usr/bin", "bin"} {
		inRoot := "/" + dir + "/" + name
		p := filepath.Join(root, dir, name)
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if root == "/" {
			return Spec{Binary: inRoot}, nil
		}
		interp, err := interpreter(p)
		if err != nil {
			return Spec{}, err
		}
		if interp == "" || existsIn(root, interp) {
			return Spec{DriverRoot: root, Binary: inRoot}, nil
		}
		var libs []string
		for _, d := range nvml.LibraryDirs(runtime.GOARCH) {
			if fi, err := os.Stat(filepath.Join(root, d)); err == nil && fi.IsDir() {
				libs = append(libs, filepath.Join(root, d))
			}
		}
		return Spec{Binary: p, Env: []string{"LD_LIBRARY_PATH=" + strings.Join(libs, ":")}}, nil
	}
	return Spec{}, fmt.Errorf("%s is not in the driver root %s (usr/bin or bin): install the driver's utilities there (the package with nvidia-smi), or set driverRoot (--driver-root) to the root that has them", name, root)
}

// interpreter is the dynamic loader an ELF program names; "" for a static
// one.
func interpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", fmt.Errorf("reading %s's loader: %w", path, err)
		}
		return strings.TrimRight(string(b), "\x00"), nil
	}
	return "", nil
}

// existsIn says whether path names a file in root, its links resolved
// inside root as a chroot would: an absolute target is root's, and ".."
// stops at root.
func existsIn(root, path string) bool {
	split := func(p string) []string { return strings.Split(strings.Trim(filepath.Clean("/"+p), "/"), "/") }
	done, rest := "/", split(path)
	for hops := 0; len(rest) > 0; {
		next := filepath.Join(done, rest[0])
		rest = rest[1:]
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > 40 { // as the kernel's limit
			return false
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return false
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(done, target)
		}
		done, rest = "/", append(split(target), rest...)
	}
	return true
}

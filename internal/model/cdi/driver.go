package cdi

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// ErrNoDriver means no NVML library was found under the driver root.
var ErrNoDriver = errors.New("no NVIDIA driver libraries found")

// driverLibraries are the user-space driver libraries a GPU container gets,
// by base name; each is mounted when present. They are the ones the NVIDIA
// container toolkit mounts for the utility, compute and video capabilities.
var driverLibraries = []string{
	// utility
	"libnvidia-ml.so",   // NVML: nvidia-smi, DCGM, frameworks' device queries
	"libnvidia-cfg.so",  // GPU configuration queries
	"libnvidia-nscq.so", // NVSwitch queries (fabric manager package), used by DCGM
	// compute
	"libcuda.so",                   // the CUDA driver API
	"libcudadebugger.so",           // GPU side of cuda-gdb (525+)
	"libnvidia-ptxjitcompiler.so",  // JIT-compiles PTX the application ships
	"libnvidia-nvvm.so",            // NVVM, for JIT link-time optimisation (soname .so.4)
	"libnvidia-gpucomp.so",         // compiler back end the JIT libraries load (530+)
	"libnvidia-opencl.so",          // OpenCL ICD
	"libnvidia-allocator.so",       // buffer allocator the CUDA/graphics interop uses
	"libnvidia-pkcs11.so",          // confidential computing (535+)
	"libnvidia-pkcs11-openssl3.so", // the same, against OpenSSL 3
	// video
	"libnvcuvid.so",            // NVDEC
	"libnvidia-encode.so",      // NVENC
	"libnvidia-opticalflow.so", // optical flow
}

// driverBinaries are the driver's tools a GPU container gets when present.
var driverBinaries = []string{
	"nvidia-smi",
	"nvidia-debugdump",
	"nvidia-persistenced",
	"nvidia-cuda-mps-control",
	"nvidia-cuda-mps-server",
}

var (
	binaryDirs   = []string{"usr/bin", "bin"}
	firmwareDirs = []string{"lib/firmware/nvidia", "usr/lib/firmware/nvidia"}
)

// Driver is the NVIDIA driver's user-space part found under a driver root,
// as read-only bind mounts. A container path is the path searched, without
// Root (/usr/bin/nvidia-smi); its host path is the real file or directory
// under Root, symlinks resolved as if Root were "/", so a runtime that
// follows links on the host can neither leave the driver root nor land on
// the host's own copy.
type Driver struct {
	// Root is the absolute driver root, "/" for a driver installed on the host.
	Root string
	// Version is the driver version read from the NVML library's file name
	// (libnvidia-ml.so.550.54.15 is "550.54.15"); empty when it has none.
	Version string
	// Libraries holds each library's versioned file and, at the same host
	// path, each of its soname links (libcuda.so.1), so dlopen by soname
	// works in a container whose linker cache does not know the library.
	Libraries []Mount
	// Binaries are nvidia-smi and the other tools in driverBinaries.
	Binaries []Mount
	// Firmware is the GSP firmware directory of Version, lib/firmware/nvidia/<version>.
	Firmware []Mount
}

// Mounts returns every mount of the driver: libraries, binaries, firmware.
func (d Driver) Mounts() []Mount {
	out := make([]Mount, 0, len(d.Libraries)+len(d.Binaries)+len(d.Firmware))
	out = append(out, d.Libraries...)
	out = append(out, d.Binaries...)
	return append(out, d.Firmware...)
}

// FindDriver finds the driver's libraries, binaries and firmware under
// driverRoot ("" or "/" for the host's own driver; /run/nvidia/driver
// where the GPU operator installs it). Libraries are searched in the usual
// library directories of the running architecture, in order (the first
// directory holding a library wins), the way nvml.LibraryPath finds NVML;
// the linker cache is not read. For each library the file of the driver's
// version is preferred, then the file its soname link points to, then the
// highest version present, so a stale library from an older driver is never
// picked. Binaries come from usr/bin or bin.
//
// Without libnvidia-ml the error wraps ErrNoDriver and the Driver holds only
// Root, so a caller may still build specs with device nodes alone.
func FindDriver(driverRoot string) (Driver, error) {
	return findDriver(driverRoot, runtime.GOARCH)
}

func findDriver(driverRoot, goarch string) (Driver, error) {
	if driverRoot == "" {
		driverRoot = "/"
	}
	root, err := filepath.Abs(driverRoot)
	if err != nil {
		return Driver{}, fmt.Errorf("driver root %q: %w", driverRoot, err)
	}
	d := Driver{Root: root}
	if fi, err := os.Stat(root); err != nil {
		return d, fmt.Errorf("driver root: %w", err)
	} else if !fi.IsDir() {
		return d, fmt.Errorf("driver root %s is not a directory", root)
	}
	t := tree{root: root}

	dirs := nvml.LibraryDirs(goarch)
	var libDirs []libDir
	for _, at := range dirs {
		resolved, err := t.resolve(at)
		if err == nil && t.isDir(resolved) && !slices.ContainsFunc(libDirs, func(d libDir) bool { return d.real == resolved }) {
			libDirs = append(libDirs, libDir{at: at, real: resolved})
		}
	}
	nvml, ok := t.library(libDirs, "libnvidia-ml.so", "")
	if !ok {
		return d, fmt.Errorf("%w under %s: no libnvidia-ml.so.* in %s (is the driver root right?)",
			ErrNoDriver, root, strings.Join(dirs, ", "))
	}
	if v, ok := strings.CutPrefix(path.Base(nvml.file), "libnvidia-ml.so."); ok && isVersion(v) {
		d.Version = v
	}

	for _, base := range driverLibraries {
		if l, ok := t.library(libDirs, base, d.Version); ok {
			for _, at := range l.at {
				d.Libraries = append(d.Libraries, t.mount(l.file, at))
			}
		}
	}
	for _, name := range driverBinaries {
		for _, dir := range binaryDirs {
			at := path.Join(dir, name)
			if p, err := t.resolve(at); err == nil && t.isRegular(p) {
				d.Binaries = append(d.Binaries, t.mount(p, at))
				break
			}
		}
	}
	if d.Version != "" {
		for _, dir := range firmwareDirs {
			at := path.Join(dir, d.Version)
			if p, err := t.resolve(at); err == nil && t.isDir(p) {
				d.Firmware = append(d.Firmware, t.mount(p, at))
				break
			}
		}
	}
	return d, nil
}

// tree reads a directory tree as if root were "/". Paths are slash-separated
// and relative to root, "." being root itself.
type tree struct{ root string }

func (t tree) host(rel string) string { return filepath.Join(t.root, filepath.FromSlash(rel)) }

func (t tree) mount(file, at string) Mount {
	return Mount{HostPath: t.host(file), ContainerPath: "/" + at, Options: ReadOnlyBind()}
}

func (t tree) isRegular(rel string) bool {
	fi, err := os.Lstat(t.host(rel))
	return err == nil && fi.Mode().IsRegular()
}

func (t tree) isDir(rel string) bool {
	fi, err := os.Lstat(t.host(rel))
	return err == nil && fi.IsDir()
}

// resolve follows every symlink in rel the way the kernel would inside a
// chroot at root: absolute targets and ".." stay inside root. It returns
// the real path, relative to root.
func (t tree) resolve(rel string) (string, error) {
	done := "."
	rest := strings.Split(rel, "/")
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c)
		fi, err := os.Lstat(t.host(next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("resolving %s under %s: too many levels of symbolic links", rel, t.root)
		}
		target, err := os.Readlink(t.host(next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = "."
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return done, nil
}

// libDir is a library directory: at is where the container sees it (the
// path searched), real where it is in the tree.
type libDir struct{ at, real string }

// lib is a library found in a directory: the real file to mount and the
// paths (relative to the root) to mount it at: its own name and its soname
// links, in the directory searched.
type lib struct {
	file string
	at   []string
}

// library finds base ("libcuda.so") in the first of dirs that holds it.
func (t tree) library(dirs []libDir, base, version string) (lib, bool) {
	for _, dir := range dirs {
		entries, err := os.ReadDir(t.host(dir.real))
		if err != nil {
			continue
		}
		var versioned, sonames []string
		for _, e := range entries {
			suffix, ok := strings.CutPrefix(e.Name(), base+".")
			switch {
			case !ok:
			case isVersion(suffix):
				versioned = append(versioned, suffix)
			case isNumber(suffix):
				sonames = append(sonames, suffix)
			}
		}
		file := t.pick(dir.real, base, version, versioned, sonames)
		if file == "" {
			continue
		}
		l := lib{file: file, at: []string{path.Join(dir.at, path.Base(file))}}
		slices.SortFunc(sonames, compareVersions)
		for _, s := range sonames {
			if at := path.Join(dir.at, base+"."+s); at != l.at[0] {
				l.at = append(l.at, at)
			}
		}
		return l, true
	}
	return lib{}, false
}

// pick chooses the real file of base in dir: the driver's version, else
// what the highest soname link points to, else the highest version.
func (t tree) pick(dir, base, version string, versioned, sonames []string) string {
	regular := func(suffix string) string {
		p, err := t.resolve(path.Join(dir, base+"."+suffix))
		if err != nil || !t.isRegular(p) {
			return ""
		}
		return p
	}
	if version != "" && slices.Contains(versioned, version) {
		if p := regular(version); p != "" {
			return p
		}
	}
	for _, group := range [][]string{sonames, versioned} {
		sorted := slices.SortedFunc(slices.Values(group), func(a, b string) int { return compareVersions(b, a) })
		for _, s := range sorted {
			if p := regular(s); p != "" {
				return p
			}
		}
	}
	return ""
}

// isVersion reports whether s is a dotted driver version such as 550.54.15.
func isVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if !isNumber(p) {
			return false
		}
	}
	return true
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// compareVersions orders dotted numbers numerically, component by component.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.ParseUint(as[i], 10, 64)
		y, _ := strconv.ParseUint(bs[i], 10, 64)
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(as), len(bs))
}

// Rebase returns the driver as the host sees it when this process reaches
// the driver root at another path (a container with the host's driver
// root mounted at /driver-root, say): every host path under d.Root moves
// under hostRoot. Container paths do not change.
func (d Driver) Rebase(hostRoot string) Driver {
	if hostRoot == "" || filepath.Clean(hostRoot) == filepath.Clean(d.Root) {
		return d
	}
	move := func(ms []Mount) []Mount {
		out := make([]Mount, len(ms))
		for i, m := range ms {
			if rel, err := filepath.Rel(d.Root, m.HostPath); err == nil && !strings.HasPrefix(rel, "..") {
				m.HostPath = filepath.Join(hostRoot, rel)
			}
			out[i] = m
		}
		return out
	}
	d.Libraries, d.Binaries, d.Firmware = move(d.Libraries), move(d.Binaries), move(d.Firmware)
	d.Root = hostRoot
	return d
}

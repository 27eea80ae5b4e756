// Package driverroot finds the NVIDIA driver's user-space files under a
// driver root (the host's /, or where the GPU operator installs the
// driver): its libraries, tools and firmware, as plain values. It reads
// the tree only; what a container gets of them is model/cdi's business.
package driverroot

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
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

// Files are the NVIDIA driver's user-space files found under a driver
// root. A file's Path is the path searched, without Root
// (/usr/bin/nvidia-smi), where a container sees it; its HostPath is the
// real file or directory under Root, symlinks resolved as if Root were
// "/", so a runtime that follows links on the host can neither leave the
// driver root nor land on the host's own copy.
type Files struct {
	// Root is the absolute driver root, "/" for a driver installed on the host.
	Root string
	// Version is the driver version read from the NVML library's file name
	// (libnvidia-ml.so.550.54.15 is "550.54.15"); empty when it has none.
	Version string
	// Libraries holds each library's versioned file and, at the same host
	// path, each of its soname links (libcuda.so.1), so dlopen by soname
	// works in a container whose linker cache does not know the library.
	Libraries []File
	// Binaries are nvidia-smi and the other tools in driverBinaries.
	Binaries []File
	// Firmware is the GSP firmware directory of Version, lib/firmware/nvidia/<version>.
	Firmware []File
}

// File is one file or directory of the driver: the real one on the host,
// and the path it is found at in the driver root.
type File struct {
	HostPath string
	Path     string
}

// All returns every file of the driver: libraries, binaries, firmware.
func (d Files) All() []File {
	out := make([]File, 0, len(d.Libraries)+len(d.Binaries)+len(d.Firmware))
	out = append(out, d.Libraries...)
	out = append(out, d.Binaries...)
	return append(out, d.Firmware...)
}

// Find finds the driver's libraries, binaries and firmware under
// driverRoot ("" or "/" for the host's own driver; /run/nvidia/driver
// where the GPU operator installs it). Libraries are searched in the usual
// library directories of the running architecture, in order (the first
// directory holding a library wins), the way nvml.LibraryPath finds NVML;
// the linker cache is not read. For each library the file of the driver's
// version is preferred, then the file its soname link points to, then the
// highest version present, so a stale library from an older driver is never
// picked. Binaries come from usr/bin or bin.
//
// Without libnvidia-ml the error wraps ErrNoDriver and the Files hold only
// Root, so a caller may still build specs with device nodes alone.
func Find(driverRoot string) (Files, error) {
	return FindArch(driverRoot, runtime.GOARCH)
}

// FindArch is Find for the library directories of goarch rather than the
// running architecture's (a fake root in a test, say).
func FindArch(driverRoot, goarch string) (Files, error) {
	if driverRoot == "" {
		driverRoot = "/"
	}
	root, err := filepath.Abs(driverRoot)
	if err != nil {
		return Files{}, fmt.Errorf("driver root %q: %w", driverRoot, err)
	}
	d := Files{Root: root}
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
				d.Libraries = append(d.Libraries, t.file(l.file, at))
			}
		}
	}
	for _, name := range driverBinaries {
		for _, dir := range binaryDirs {
			at := path.Join(dir, name)
			if p, err := t.resolve(at); err == nil && t.isRegular(p) {
				d.Binaries = append(d.Binaries, t.file(p, at))
				break
			}
		}
	}
	if d.Version != "" {
		for _, dir := range firmwareDirs {
			at := path.Join(dir, d.Version)
			if p, err := t.resolve(at); err == nil && t.isDir(p) {
				d.Firmware = append(d.Firmware, t.file(p, at))
				break
			}
		}
	}
	return d, nil
}

// Rebase returns the files as the host sees them when this process reaches
// the driver root at another path (a container with the host's driver
// root mounted at /driver-root, say): every host path under d.Root moves
// under hostRoot. Container paths do not change.
func (d Files) Rebase(hostRoot string) Files {
	if hostRoot == "" || filepath.Clean(hostRoot) == filepath.Clean(d.Root) {
		return d
	}
	move := func(ms []File) []File {
		out := make([]File, len(ms))
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

package nvml

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// libraryName is the soname the driver installs; dlopen resolves it through
// the linker cache when no directory is given.
const libraryName = "libnvidia-ml.so.1"

// ErrNoDriver means the NVML library could not be loaded or the kernel driver
// is not running: the node has no usable NVIDIA driver.
var ErrNoDriver = errors.New("no NVIDIA driver")

// Library is the part of NVML this project uses. gonvml.New(...) satisfies
// it, and so do go-nvml's mocks, which is how the tests drive discovery.
type Library interface {
	Init() gonvml.Return
	Shutdown() gonvml.Return
	ErrorString(gonvml.Return) string

	SystemGetDriverVersion() (string, gonvml.Return)
	SystemGetNVMLVersion() (string, gonvml.Return)
	SystemGetCudaDriverVersion() (int, gonvml.Return)

	DeviceGetCount() (int, gonvml.Return)
	DeviceGetHandleByIndex(int) (gonvml.Device, gonvml.Return)
	DeviceGetHandleByUUID(string) (gonvml.Device, gonvml.Return)

	// EventSetCreate is for health watching (XID and other critical events).
	EventSetCreate() (gonvml.EventSet, gonvml.Return)

	// Drain states, for resetting a GPU (Resetter). A GPU is named by its
	// PCI info; DeviceDiscoverGpus searches the whole PCI tree.
	DeviceModifyDrainState(*gonvml.PciInfo, gonvml.EnableState) gonvml.Return
	DeviceQueryDrainState(*gonvml.PciInfo) (gonvml.EnableState, gonvml.Return)
	DeviceRemoveGpu(*gonvml.PciInfo) gonvml.Return
	DeviceRemoveGpu_v2(*gonvml.PciInfo, gonvml.DetachGpuState, gonvml.PcieLinkState) gonvml.Return
	DeviceDiscoverGpus() (gonvml.PciInfo, gonvml.Return)

	// Extensions looks up symbols, so functions newer than the oldest
	// supported driver are called only where they exist (CheckSymbols).
	Extensions() gonvml.ExtendedInterface
}

// LibraryPath picks the NVML library to load. An explicit path wins. With no
// driver root, or "/", it returns the bare soname so dlopen searches the
// usual way. Otherwise it returns the first libnvidia-ml.so.1 found in the
// usual library directories under driverRoot (where the GPU operator or a
// host mount puts the driver), or the bare soname when there is none.
func LibraryPath(driverRoot, explicit string) string {
	if explicit != "" {
		return explicit
	}
	if driverRoot == "" || filepath.Clean(driverRoot) == "/" {
		return libraryName
	}
	for _, dir := range LibraryDirs(runtime.GOARCH) {
		p := filepath.Join(driverRoot, dir, libraryName)
		// Stat follows the soname symlink, so a dangling link is skipped.
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return libraryName
}

// LibraryDirs lists where distributions install the driver's libraries,
// relative to a root, slash-separated. Only goarch's multiarch directories
// are listed: a library for another architecture would not load anyway.
func LibraryDirs(goarch string) []string {
	triplets := map[string]string{
		"amd64":   "x86_64-linux-gnu",
		"arm64":   "aarch64-linux-gnu",
		"ppc64le": "powerpc64le-linux-gnu",
	}
	t, ok := triplets[goarch]
	if !ok {
		return []string{"usr/lib64", "usr/lib", "lib64", "lib"}
	}
	return []string{
		"usr/lib/" + t,
		"usr/lib64",
		"usr/lib",
		"lib/" + t,
		"lib64",
		"lib",
		// Debian's packaged driver sits behind an alternatives directory.
		"usr/lib/" + t + "/nvidia/current",
	}
}

// Open loads the NVML library at path and initialises it. When the library
// cannot be loaded, or the kernel driver is not running, the error wraps
// ErrNoDriver and says what to do. The caller must call Shutdown.
func Open(path string) (Library, error) {
	lib := gonvml.New(gonvml.WithLibraryPath(path))
	switch ret := lib.Init(); ret {
	case gonvml.SUCCESS:
		return lib, nil
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		// go-nvml reports any dlopen failure this way and drops dlerror's text.
		if !strings.Contains(path, "/") {
			return nil, fmt.Errorf("%w: NVML library %s is not in the dynamic loader's search path (is the NVIDIA driver installed? if it is installed under another root, set --driver-root)", ErrNoDriver, path)
		}
		return nil, fmt.Errorf("%w: NVML library %q could not be loaded by the dynamic loader (a library it needs is missing, or it was built for another architecture)", ErrNoDriver, path)
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: NVML library %q loaded but the NVIDIA kernel driver is not running (is the nvidia kernel module loaded?)", ErrNoDriver, path)
	default:
		// Return's Error is NVML's own ErrorString once the library is loaded.
		return nil, fmt.Errorf("initialising NVML from %q: %w", path, ret)
	}
}

// Load opens NVML where the settings point (LibraryPath) with open (Open, or
// a mock). When it fails for want of a library, the error names the cause
// in the settings' terms where one can be seen without loading anything: a
// --driver-root that does not exist or holds no library, or a
// --nvml-library that is missing, a directory or no shared library.
func Load(open func(string) (Library, error), driverRoot, explicit string) (Library, string, error) {
	path := LibraryPath(driverRoot, explicit)
	lib, err := open(path)
	if err == nil {
		return lib, path, nil
	}
	if errors.Is(err, ErrNoDriver) {
		if p := libraryProblem(driverRoot, explicit); p != nil {
			return nil, path, fmt.Errorf("%w: %w", ErrNoDriver, p)
		}
	}
	return nil, path, err
}

// libraryProblem says what is wrong with the settings that choose the
// library, or nil when nothing is seen to be.
func libraryProblem(driverRoot, explicit string) error {
	if explicit != "" {
		fi, err := os.Stat(explicit)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("nvmlLibrary (--nvml-library) %q does not exist; give the path of libnvidia-ml.so.1", explicit)
		case err != nil:
			return fmt.Errorf("nvmlLibrary (--nvml-library) %q: %w", explicit, err)
		case fi.IsDir():
			return fmt.Errorf("nvmlLibrary (--nvml-library) %q is a directory; give the library file, such as %s", explicit, filepath.Join(explicit, libraryName))
		}
		f, err := elf.Open(explicit)
		if err != nil {
			return fmt.Errorf("nvmlLibrary (--nvml-library) %q is not a shared library (not an ELF file: %v); give the path of libnvidia-ml.so.1", explicit, err)
		}
		defer f.Close()
		if want, ok := elfMachines[runtime.GOARCH]; ok && f.Machine != want {
			return fmt.Errorf("nvmlLibrary (--nvml-library) %q is a library for %s, not for this machine (%s)", explicit, f.Machine, runtime.GOARCH)
		}
		return nil
	}
	if driverRoot == "" || filepath.Clean(driverRoot) == "/" {
		return nil
	}
	fi, err := os.Stat(driverRoot)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("driverRoot (--driver-root) %q does not exist; set it to the root the NVIDIA driver is installed under (/ on most hosts)", driverRoot)
	case err != nil:
		return fmt.Errorf("driverRoot (--driver-root) %q: %w", driverRoot, err)
	case !fi.IsDir():
		return fmt.Errorf("driverRoot (--driver-root) %q is not a directory", driverRoot)
	}
	if LibraryPath(driverRoot, "") == libraryName {
		return fmt.Errorf("no %s under driverRoot (--driver-root) %q (looked in %s): is the driver installed there? or give the file with --nvml-library",
			libraryName, driverRoot, strings.Join(LibraryDirs(runtime.GOARCH), ", "))
	}
	return nil
}

// elfMachines is the ELF machine of each architecture a library must be built for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "ppc64le": elf.EM_PPC64}

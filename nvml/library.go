package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

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
		return nil, fmt.Errorf("%w: NVML library %q could not be loaded (is the NVIDIA driver installed? set --nvml-library or --driver-root)", ErrNoDriver, path)
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: NVML library %q loaded but the NVIDIA kernel driver is not running (is the nvidia kernel module loaded?)", ErrNoDriver, path)
	default:
		// Return's Error is NVML's own ErrorString once the library is loaded.
		return nil, fmt.Errorf("initialising NVML from %q: %w", path, ret)
	}
}

package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// LibraryName is the soname of the CUDA driver library.
const LibraryName = "libcuda.so.1"

// ErrNoLibrary means no libcuda.so.1 was found under the driver root.
var ErrNoLibrary = errors.New("no " + LibraryName)

// LibraryPath finds libcuda.so.1 under driverRoot ("" or "/": the host's
// or the container's own) in the library directories where it finds NVML
// (nvml.LibraryDirs), as nvml.LibraryPath finds NVML. The linker cache is
// not read, even for "/": the probe loads the library by path, and its
// process has no linker cache of the driver's.
func LibraryPath(driverRoot string) (string, error) {
	return libraryPath(driverRoot, runtime.GOARCH)
}

func libraryPath(driverRoot, goarch string) (string, error) {
	root := filepath.Clean(driverRoot)
	if driverRoot == "" {
		root = "/"
	}
	dirs := nvml.LibraryDirs(goarch)
	for _, dir := range dirs {
		p := filepath.Join(root, dir, LibraryName)
		// Stat follows the soname link, so a dangling one is skipped.
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w under the driver root %s (looked in %s): install the driver's CUDA library there, or set driverRoot (--driver-root) to the root that has it",
		ErrNoLibrary, root, strings.Join(dirs, ", "))
}

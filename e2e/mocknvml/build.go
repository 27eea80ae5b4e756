package mocknvml

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// LibraryName is the soname the mock library is built under, the one the
// NVIDIA driver installs.
const LibraryName = "libnvidia-ml.so.1"

//go:embed mocknvml.c
var source []byte

// cflags are the Makefile's CFLAGS and LDFLAGS (a test keeps them equal).
// NVML_NO_UNVERSIONED_FUNC_DEFS stops nvml.h renaming nvmlInit to
// nvmlInit_v2 and so on, so each function exports under the name it has.
// -z nodelete keeps the library mapped after dlclose: go-nvml closes it at
// the last Shutdown, and the control thread or a waiter may still be leaving.
var cflags = []string{
	"-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-Wextra", "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
	"-Wl,-soname," + LibraryName, "-Wl,-z,nodelete",
}

// Build compiles the mock library into dir (created if missing) and returns
// the path of dir/libnvidia-ml.so.1. It uses $CC, else gcc, and go-nvml's
// nvml.h from the module cache (found with go list, so the go tool must be
// on PATH). A library already built there from the same source, header and
// flags is reused.
func Build(dir string) (string, error) {
	return build(dir, cflags)
}

// r470Flag builds the library as an R470-era driver: the functions, field
// and event NVML gained after R470 are left out.
const r470Flag = "-DMOCK_R470"

// BuildR470 is Build for a library that plays an R470-era driver. It does
// not export nvmlDeviceGetCurrentClocksEventReasons (R535),
// nvmlDeviceGetNumaNodeId, nvmlDeviceGetTemperatureV and the other newer
// functions (R470Missing lists them), answers INVALID_ARGUMENT for the
// recovery-action field, and has no recovery-action event. Give it its own
// dir: the file name is the driver's soname either way.
func BuildR470(dir string) (string, error) {
	return build(dir, append(slices.Clone(cflags), r470Flag))
}

// R470Missing are the functions the normal build exports and the R470
// build does not.
func R470Missing() []string {
	return []string{
		"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetTemperatureV",
		"nvmlSystemGetDriverBranch", "nvmlDeviceGetHandleByUUIDV", "nvmlDeviceGetPciInfoExt",
		"nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3",
		"nvmlDeviceGetGraphicsRunningProcesses_v3",
		"nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
		"nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV", // R525+
	}
}

func build(dir string, cflags []string) (string, error) {
	inc, err := headerDir()
	if err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	header, err := os.ReadFile(filepath.Join(inc, "nvml.h"))
	if err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	h := sha256.New()
	for _, part := range [][]byte{source, header, []byte(cc), []byte(strings.Join(cflags, " "))} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	sum := hex.EncodeToString(h.Sum(nil))

	lib := filepath.Join(dir, LibraryName)
	stamp := lib + ".sha256"
	if b, err := os.ReadFile(stamp); err == nil && string(b) == sum {
		if _, err := os.Stat(lib); err == nil {
			return lib, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".build-*.so")
	if err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())

	// The source goes in on stdin, so gcc names it <stdin> in messages.
	args := append(append([]string{}, cflags...), "-I", inc, "-o", tmp.Name(), "-x", "c", "-")
	cmd := exec.Command(cc, args...)
	cmd.Stdin = bytes.NewReader(source)
	if out, err := cmd.CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("building mock NVML: %s not found (install gcc, or set CC to a C compiler)", cc)
		}
		return "", fmt.Errorf("building mock NVML: %s mocknvml.c: %w\n%s", cc, err, out)
	}
	// Rename so a concurrent Build or a loader never sees half a library.
	if err := os.Rename(tmp.Name(), lib); err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	if err := os.WriteFile(stamp, []byte(sum), 0o644); err != nil {
		return "", fmt.Errorf("building mock NVML: %w", err)
	}
	return lib, nil
}

// headerDir finds go-nvml's pkg/nvml directory, which holds nvml.h, at the
// version the e2e module requires.
func headerDir() (string, error) {
	const mod = "github.com/NVIDIA/go-nvml"
	// Run from this package's source directory when it exists, so the
	// answer is the e2e module's whatever the caller's working directory.
	goCmd := func(args ...string) *exec.Cmd {
		cmd := exec.Command("go", args...)
		if _, file, _, ok := runtime.Caller(0); ok {
			if fi, err := os.Stat(filepath.Dir(file)); err == nil && fi.IsDir() {
				cmd.Dir = filepath.Dir(file)
			}
		}
		return cmd
	}
	var dir string
	for attempt := 0; attempt < 2; attempt++ {
		cmd := goCmd("list", "-m", "-f", "{{.Dir}}", mod)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("locating go-nvml's nvml.h with go list (run from inside the e2e module): %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
		}
		if dir = strings.TrimSpace(string(out)); dir != "" {
			return filepath.Join(dir, "pkg", "nvml"), nil
		}
		// go list names no directory for a module not downloaded yet.
		if out, err := goCmd("mod", "download", mod).CombinedOutput(); err != nil {
			return "", fmt.Errorf("downloading %s for nvml.h: %w: %s", mod, err, bytes.TrimSpace(out))
		}
	}
	return "", fmt.Errorf("locating go-nvml's nvml.h: %s is not in the module cache after go mod download", mod)
}

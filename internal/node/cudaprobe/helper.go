package cudaprobe

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
)

// RunIfHelper, when this process was started as the helper (os.Args[1] is
// HelperCommand), runs Main and exits: 0 when the GPU passed, 1 otherwise.
// It returns otherwise. Programs without the CLI's hidden command (the DRA
// executable) and tests whose binary stands in for the plugin call it
// first.
func RunIfHelper() {
	if len(os.Args) < 2 || os.Args[1] != HelperCommand {
		return
	}
	if err := Main(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ErrFailed is Main's error when the GPU failed the probe; the report says
// how.
var ErrFailed = errors.New("the GPU failed the CUDA probe")

// flags are the helper's arguments, as Options.helperArgs writes them.
type flags struct {
	library, devRoot, sysRoot string
	minor                     int
	target                    cuda.Target
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet(HelperCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.library, "library", "", "libcuda.so.1 to load, as the plugin sees it")
	fs.StringVar(&f.devRoot, "dev-root", "/dev", "where the GPU's device nodes are")
	fs.StringVar(&f.sysRoot, "sys-root", "/sys", "the sysfs to show read-only")
	fs.IntVar(&f.minor, "minor", -1, "the GPU's minor number: /dev/nvidia<minor>")
	fs.StringVar(&f.target.PCIBusID, "pci-bus-id", "", "the GPU's PCI bus ID")
	fs.StringVar(&f.target.UUID, "uuid", "", "the GPU's UUID")
	fs.Uint64Var(&f.target.AllocBytes, "alloc-bytes", 0, "bytes to allocate in the context")
	if err := fs.Parse(args); err != nil {
		return f, fmt.Errorf("%s: %w; it is run by the plugin (package cudaprobe)", HelperCommand, err)
	}
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("%s: unexpected argument %q", HelperCommand, fs.Arg(0))
	case !filepath.IsAbs(f.library):
		return f, fmt.Errorf("%s: --library %q is not an absolute path", HelperCommand, f.library)
	case !filepath.IsAbs(f.devRoot) || !filepath.IsAbs(f.sysRoot):
		return f, fmt.Errorf("%s: --dev-root and --sys-root must be absolute paths", HelperCommand)
	case f.minor < 0:
		return f, fmt.Errorf("%s: --minor is missing: the GPU's /dev/nvidia<minor>", HelperCommand)
	case f.target.PCIBusID == "" && f.target.UUID == "":
		return f, fmt.Errorf("%s: give --pci-bus-id, --uuid or both", HelperCommand)
	}
	return f, nil
}

// Main is the helper: it confines itself, loads libcuda.so.1, probes the
// GPU and writes on stdout a "step <step>" line before each step and one
// "result <json>" line (cuda.Result) at the end. It returns ErrFailed when
// the GPU failed, and other errors only before the report. It refuses to
// run where Run did not start it: its mounts would land in the caller's
// namespace.
func Main(args []string) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	if err := ownNamespaces(); err != nil {
		return err
	}
	out := os.Stdout
	began := func(s cuda.Step) { fmt.Fprintln(out, stepPrefix+string(s)) }
	result := func(r cuda.Result) error {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, resultPrefix+string(b))
		if !r.OK {
			return fmt.Errorf("%w: %s", ErrFailed, r)
		}
		return nil
	}

	began(cuda.StepConfine)
	if err := cleanProcess(); err != nil {
		return result(cuda.Result{Step: cuda.StepConfine, Message: err.Error()})
	}
	// Loaded before the root is swapped: the library and what it links
	// (the C library of the plugin's image) stay out of the probe's root.
	began(cuda.StepLoad)
	lib, err := cuda.Open(f.library)
	if err != nil {
		return result(cuda.Result{Step: cuda.StepLoad, Message: err.Error()})
	}
	began(cuda.StepConfine)
	if err := confine(f); err != nil {
		return result(cuda.Result{Step: cuda.StepConfine, Message: err.Error()})
	}
	return result(lib.Probe(f.target, began))
}

// ownNamespaces refuses to go on where Run did not start the helper: it
// must be PID 1 of a PID namespace of its own, in a mount namespace other
// than its parent's.
func ownNamespaces() error {
	if os.Getpid() != 1 {
		return fmt.Errorf("%s: not PID 1 of a PID namespace of its own; the plugin starts it through cudaprobe.Run", HelperCommand)
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("%s: reading its mount namespace: %w", HelperCommand, err)
	}
	// /proc is still its parent's, where the parent has a PID (getppid
	// says 0 in the new namespace).
	ppid, err := outerParent()
	if err != nil {
		return fmt.Errorf("%s: finding its parent: %w", HelperCommand, err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ppid))
	if err != nil {
		return fmt.Errorf("%s: reading its parent's mount namespace: %w", HelperCommand, err)
	}
	if own == parent {
		return fmt.Errorf("%s: runs in its parent's mount namespace, where its mounts would stay; the plugin starts it through cudaprobe.Run", HelperCommand)
	}
	return nil
}

// outerParent is the parent's PID as /proc/self/status says it.
func outerParent() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("/proc/self/status has no PPid")
}

// cleanProcess closes every descriptor above 2 that the plugin leaked (an
// fd without FD_CLOEXEC: the Go runtime opens all of its own with it, as
// internal/ocihook's CleanProcess reasons), and turns core dumps off.
func cleanProcess() error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing its descriptors: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("listing its descriptors: %w", err)
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd <= 2 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			continue // the listing's own, closed already
		}
		if flags&unix.FD_CLOEXEC == 0 {
			if err := unix.Close(fd); err != nil {
				return fmt.Errorf("closing inherited descriptor %d: %w", fd, err)
			}
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("turning core dumps off: %w", err)
	}
	return nil
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

// driverRootCandidates are where GPU nodes keep the driver when it is not
// under / : GKE and this workplace's GPU machines (/usr/local/nvidia), the
// GPU operator's driver container (/run/nvidia/driver), GKE's host path.
var driverRootCandidates = []string{"/usr/local/nvidia", "/run/nvidia/driver", "/home/kubernetes/bin/nvidia"}

// Files of the bundle (make gpu-check-bundle), beside gpu-check.
const (
	pluginFile = "gpu-device-plugin"
	daemonFile = "gpu-device-plugin-dp" // what serve execs, as installed
	probeFile  = "cudaprobe"
	imageDir   = "image" // the probe's C library and a static ldconfig
	bundleRunc = "runc"  // used when the node has none
	bundleLibs = "lib"   // what the bundled runc needs
)

// checker holds what the steps share: the node, the bundle, and what an
// earlier step made for a later one.
type checker struct {
	o    options
	mock bool
	node harness.Node
	// sysfs and dev are where this process reads the node's files.
	sysfs, dev string
	plugin     string // the gpu-device-plugin binary
	hook       string
	work       string
	log        io.Writer

	listed *listing

	nvmlOnce sync.Once
	lib      nvml.Library
	libErr   error

	// From serve, for health and container.
	served *served

	// keepWork, when set, says why the work folder is left on close.
	keepWork string
}

func newChecker(o options) (*checker, error) {
	c := &checker{
		o:      o,
		plugin: filepath.Join(o.bundle, pluginFile),
		hook:   filepath.Join(o.bundle, cdi.HookName),
		sysfs:  "/sys",
		dev:    "/dev",
		log:    os.Stderr,
	}
	for _, f := range []string{c.plugin, filepath.Join(o.bundle, daemonFile), c.hook, filepath.Join(o.bundle, probeFile), filepath.Join(o.bundle, imageDir)} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("the bundle in %s is incomplete (make gpu-check-bundle builds it): %w", o.bundle, err)
		}
	}
	if o.fixture != "" {
		if err := c.onFixture(o.fixture); err != nil {
			return nil, err
		}
	} else {
		root, err := findDriverRoot(o.driverRoot)
		if err != nil {
			return nil, err
		}
		c.node = harness.Node{DriverRoot: root}
	}
	// gpu-check may run on a shared GPU: the plugins it starts decide and
	// withhold, but never reset one (its remediation step reads only).
	c.node.Env = append(c.node.Env, "GPU_DEVICE_PLUGIN_REMEDIATION_RESET=false")
	work, err := harness.ShortTempDir("gpuchk")
	if err != nil {
		return nil, err
	}
	c.work = work
	return c, nil
}

// onFixture points everything at a fixture's mock node: the plugin, the
// in-process NVML (without the fault FIFO, which the plugin reads) and the
// containers' device nodes.
func (c *checker) onFixture(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	profiles, _ := filepath.Glob(filepath.Join(dir, "*.profile"))
	if len(profiles) != 1 {
		return fmt.Errorf("-fixture %s: want one .profile in it (write it with: cd e2e && go run ./cluster/fixture -profile pcie-4gpu -o %s), found %d", dir, dir, len(profiles))
	}
	c.mock = true
	c.sysfs, c.dev = filepath.Join(dir, "sys"), filepath.Join(dir, "dev")
	c.node = harness.Node{
		DriverRoot: filepath.Join(dir, "driver"),
		SysfsRoot:  c.sysfs,
		DevRoot:    c.dev,
		ProcRoot:   filepath.Join(dir, "proc"),
		Env:        []string{"MOCK_NVML_PROFILE=" + profiles[0], "MOCK_NVML_CONTROL=" + filepath.Join(dir, "control")},
	}
	// The mock library reads its profile when it is loaded into this process.
	return os.Setenv("MOCK_NVML_PROFILE", profiles[0])
}

// findDriverRoot is the driver root asked for, or the first place that
// holds the driver's NVML library.
func findDriverRoot(asked string) (string, error) {
	if asked != "" {
		return asked, nil
	}
	if _, err := driverroot.Find("/"); err == nil {
		return "/", nil
	}
	for _, dir := range driverRootCandidates {
		if _, err := driverroot.Find(dir); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no NVIDIA driver found under / or %s; give -driver-root", strings.Join(driverRootCandidates, ", "))
}

// nvml opens NVML in this process once, as the plugin finds it.
func (c *checker) nvml() (nvml.Library, error) {
	c.nvmlOnce.Do(func() {
		path := nvml.LibraryPath(c.node.DriverRoot, c.node.Library)
		c.lib, c.libErr = nvml.Open(path)
	})
	return c.lib, c.libErr
}

// logger is this process's log for in-process pieces: the plugin's
// daemon in DRA mode, NVML discovery. Warnings and errors only.
func (c *checker) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runPlugin runs one command of the plugin binary on the node.
func (c *checker) runPlugin(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, c.plugin, args...)
	cmd.Env = append(os.Environ(), c.node.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", filepath.Base(c.plugin), strings.Join(args, " "), err, oneLine(errb.String(), 600))
	}
	return out.String(), errb.String(), err
}

// facts describes the machine for the report.
func (c *checker) facts() NodeFacts {
	f := NodeFacts{DriverRoot: c.node.DriverRoot}
	f.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				f.OS = strings.Trim(v, `"`)
			}
		}
	}
	if r, _, err := c.runc(); err == nil {
		f.Runc = r
	} else {
		f.Runc = err.Error()
	}
	if out, _, err := c.runPlugin(context.Background(), "version"); err == nil {
		f.Plugin, _, _ = strings.Cut(strings.TrimSpace(out), "\n")
	}
	return f
}

// runc is the runc to run containers with: the node's, else the bundle's
// with its libraries.
func (c *checker) runc() (path string, env []string, err error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil, nil
	}
	p := filepath.Join(c.o.bundle, bundleRunc)
	if _, err := os.Stat(p); err != nil {
		return "", nil, errors.New("no runc on PATH or in the bundle")
	}
	return p, []string{"LD_LIBRARY_PATH=" + filepath.Join(c.o.bundle, bundleLibs)}, nil
}

func (c *checker) close() {
	if c.served != nil {
		c.served.stop()
	}
	if c.lib != nil {
		c.lib.Shutdown()
	}
	if c.keepWork != "" {
		fmt.Fprintf(c.log, "gpu-check: leaving %s: %s\n", c.work, c.keepWork)
		return
	}
	os.RemoveAll(c.work)
}

// served is the plugin serving the kubelet's client, kept running from
// the serve step through the container step.
type served struct {
	plugin  *harness.Plugin
	kubelet *harness.Kubelet
	ep      harness.Endpoint
	cdiDir  string
	// ids are the healthy GPUs' device IDs in index order.
	ids []string
	// allocations are Allocate's answers for one GPU and for all of them.
	allocations map[string]allocation
}

type allocation struct {
	ids  []string
	resp *api.ContainerAllocateResponse
}

// stop stops the plugin and the kubelet; later calls do nothing.
func (s *served) stop() {
	if s.plugin != nil {
		s.plugin.Stop()
		s.plugin = nil
	}
	if s.kubelet != nil {
		s.kubelet.Stop()
		s.kubelet = nil
	}
}

// Command gpu-check tells, in one run of a few minutes, what the plugin does
// on one GPU node: the real NVIDIA driver, or a mock node written by
// cluster/fixture so that the check cannot rot. It needs root and nothing
// installed beyond the driver: no kubelet, container runtime or network.
//
//  1. inventory: `version` and `list -o json`, and the invariants the plugin
//     relies on (unique UUIDs, minors that match /dev, NUMA nodes that match
//     sysfs, MIG profiles that match their instances);
//  2. serve: the plugin served to the kubelet's own device-manager client
//     (registration, ListAndWatch, Allocate of one and of all GPUs,
//     GetPreferredAllocation), timed as the scenario report times it;
//     before that, ours and NVIDIA's device plugin (from the bundle) in
//     turn against one kubelet stand-in, compared figure by figure;
//  3. health: every health signal read through real NVML for a while, which
//     ones the driver does not support, and no GPU flipping while idle;
//  4. remediation: the read-only parts of GPU remediation on every GPU:
//     NVML's condition (what decides and what a give-back requires), the
//     decision, the process lists, the NVLink reset rule, and the plugin's
//     own confined CUDA probe; it never resets, drains or changes a mode;
//  5. container: runc runs a minimal image (Debian and RHEL library
//     layouts) given the allocated GPUs through our CDI spec and hook; a
//     probe in it loads libcuda.so.1, calls cuInit and cuDeviceGetCount,
//     and lists the ld cache;
//  6. dra: the same node in DRA mode, publishing to an in-process fake API
//     server; the kubelet's DRA manager prepares one claim and the probe
//     runs on its CDI devices; then a claim for a quarter of a GPU's
//     memory, which must come with that much as its MPS limit (on a real
//     GPU, an allocation over it refused);
//  7. mps: the first GPU shared through MPS (2 replicas) in three ways:
//     the plugin in the host's PID namespace or in one of its own (as a
//     pod without hostPID) starting the daemon, and mps-launcher in the
//     host's starting it for a plugin in its own. In each: the daemon up
//     before the replicas are offered, Allocate's mounts and limits,
//     containers as MPS clients, whether the daemon outlives the plugin
//     (with the launcher, adopted by the plugin started again; on a GPU,
//     one client's allocation past its share refused while another holds
//     its own), then the GPU given back: the daemon stopped by a plugin
//     that shares nothing and the compute mode restored, even on failure.
//
// It writes report.json and summary.txt to -out and exits 1 when a check
// failed. `make gpu-check` builds the bundle it runs from (bin/gpu-check)
// and runs it on the mock; docs/gpu-check.md says how to run it on a GPU
// node.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
	"k8s.io/klog/v2"
)

// Steps, in the order they run.
var stepNames = []string{"inventory", "serve", "health", "remediation", "container", "dra", "mps"}

type options struct {
	bundle     string
	fixture    string
	driverRoot string
	out        string
	health     time.Duration
	calls      int
	// compareRuns is how many times each of ours and NVIDIA's device
	// plugin run side by side in the serve step; 0 for none.
	compareRuns int
	steps       []string
}

func main() {
	// The DRA step's daemon runs MPS control daemons through this
	// executable, as the plugin's own does.
	mpsexec.RunIfHelper()
	launcher.RunIfHelper()
	runPluginDirHelperIfAsked()
	var o options
	var steps string
	flag.StringVar(&o.bundle, "bundle", "", "the folder with gpu-device-plugin, its CDI hook, cudaprobe and image/ (default: this program's folder)")
	flag.StringVar(&o.fixture, "fixture", "", "a mock node written by e2e/cluster/fixture, instead of this machine's GPUs")
	flag.StringVar(&o.driverRoot, "driver-root", "", "where the driver is installed (default: / if NVML is found there, else the first of "+strings.Join(driverRootCandidates, ", ")+" that holds it)")
	flag.StringVar(&o.out, "out", "gpu-check-report", "folder for report.json and summary.txt")
	flag.DurationVar(&o.health, "health", time.Minute, "how long to watch health")
	flag.IntVar(&o.calls, "calls", 200, "Allocate and GetPreferredAllocation calls to time per size")
	flag.IntVar(&o.compareRuns, "compare-runs", 2, "runs of each of ours and NVIDIA's device plugin, in turn, in the serve step's side-by-side comparison; 0 for none")
	flag.StringVar(&steps, "steps", strings.Join(stepNames, ","), "the steps to run, comma-separated")
	flag.Parse()
	if flag.NArg() > 0 || o.calls < 1 || o.health <= 0 || o.compareRuns < 0 {
		fmt.Fprintln(os.Stderr, "usage: gpu-check [-fixture DIR] [-driver-root DIR] [-out DIR] [-health 1m] [-calls 200] [-compare-runs 2] [-steps inventory,serve,health,remediation,container,dra,mps]")
		os.Exit(2)
	}
	for _, s := range strings.Split(steps, ",") {
		if !slices.Contains(stepNames, s) {
			fmt.Fprintf(os.Stderr, "gpu-check: -steps: unknown step %q; the steps are %s\n", s, strings.Join(stepNames, ","))
			os.Exit(2)
		}
		o.steps = append(o.steps, s)
	}
	if o.bundle == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpu-check:", err)
			os.Exit(1)
		}
		o.bundle = filepath.Dir(exe)
	}
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		os.Exit(1)
	}
	summary := rep.summary()
	fmt.Print(summary)
	if err := rep.write(o.out, summary); err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		os.Exit(1)
	}
	if !rep.Passed {
		os.Exit(1)
	}
}

// run runs the steps asked for; a step that fails does not stop the
// next, except where the next needs what it made.
func run(ctx context.Context, o options) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root: it serves on private sockets, mounts and runs containers")
	}
	c, err := newChecker(o)
	if err != nil {
		return nil, err
	}
	defer c.close()
	rep := &Report{Mock: c.mock, Started: time.Now(), Node: c.facts()}
	want := func(name string) bool { return slices.Contains(o.steps, name) }
	for _, name := range stepNames {
		s := &Step{Name: name}
		began := time.Now()
		switch {
		case !want(name):
			s.Skipped = "not asked for (-steps)"
		case ctx.Err() != nil:
			s.Skipped = "interrupted"
		default:
			progress(os.Stderr, "%s ...", name)
			c.step(ctx, name, s)
		}
		s.finish(began)
		rep.Steps = append(rep.Steps, s)
	}
	rep.Seconds = roundSeconds(time.Since(rep.Started))
	rep.Passed = true
	for _, s := range rep.Steps {
		if s.Status == "fail" {
			rep.Passed = false
		}
	}
	return rep, nil
}

func (c *checker) step(ctx context.Context, name string, s *Step) {
	switch name {
	case "inventory":
		c.inventory(ctx, s)
	case "serve":
		c.serve(ctx, s)
	case "health":
		c.watchHealth(ctx, s)
	case "remediation":
		c.remediation(ctx, s)
	case "container":
		c.containers(ctx, s)
	case "dra":
		c.dra(ctx, s)
	case "mps":
		c.mps(ctx, s)
	}
}

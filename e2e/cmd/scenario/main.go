// Command scenario runs the real plugin binary on a mock machine against
// the kubelet's own device-plugin code and prints a JSON report: start-up
// and registration times, Allocate and GetPreferredAllocation latency,
// XID detection latency, re-registration after kubelet restarts, and the
// process's peak RSS, its RSS after an idle period (split into anonymous
// and file-backed) and its CPU time. It exits 1 after printing the report
// when the RSS after idle is more than 20 % above the profile's budget
// (budget.go).
//
//	go run ./cmd/scenario -profile dgx-h100 [-idle 30s]
//
// Run it from the e2e module; it builds the binary and the mock library
// into a temporary directory first. Progress goes to stderr, the report to
// stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// waitTimeout bounds every wait for the plugin.
const waitTimeout = 30 * time.Second

type options struct {
	profile    string
	idle       time.Duration
	calls      int
	restarts   int
	healthGPUs int
	poll       time.Duration
	pluginLog  string
}

func main() {
	var o options
	flag.StringVar(&o.profile, "profile", "dgx-h100", "machine profile: a name in e2e/profiles (dgx-h100, pcie-4gpu, hgx-16) or a .profile path")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "how long the plugin idles before its RSS and CPU time are read")
	flag.IntVar(&o.calls, "calls", 1000, "Allocate and GetPreferredAllocation calls per size")
	flag.IntVar(&o.restarts, "restarts", 5, "kubelet restarts to time")
	flag.IntVar(&o.healthGPUs, "health-gpus", 4, "GPUs to inject XID 79 into, one at a time (at most the GPU count)")
	flag.DurationVar(&o.poll, "health-poll-interval", 0, "the plugin's --health-poll-interval; 0 keeps its default")
	flag.StringVar(&o.pluginLog, "plugin-log", "", "also write the plugin's log to this file")
	flag.Parse()
	if flag.NArg() > 0 || o.calls < 1 || o.restarts < 1 || o.healthGPUs < 1 || o.idle < 0 {
		fmt.Fprintln(os.Stderr, "usage: scenario [-profile dgx-h100] [-idle 30s] [-calls 1000] [-restarts 5] [-health-gpus 4]")
		os.Exit(2)
	}
	// The registration server logs each Register through klog's global
	// logger; the report is the output.
	klog.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	rep, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scenario:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "scenario:", err)
		os.Exit(1)
	}
	if b := rep.Process.Budget; b != nil && b.Exceeded {
		fmt.Fprintln(os.Stderr, "scenario:", overBudget(rep.Profile, rep.Process.RSSAfterIdleMiB, b))
		os.Exit(1)
	}
}

// Report is what scenario prints. Durations are in milliseconds unless a
// name says otherwise.
type Report struct {
	Profile  string `json:"profile"`
	GPUs     int    `json:"gpus"`
	HostCPUs int    `json:"hostCPUs"`
	// Startup is measured from just before the process was started.
	Startup struct {
		RegisteredMs float64 `json:"registeredMs"`
		FirstListMs  float64 `json:"firstListAndWatchMs"`
	} `json:"startup"`
	Allocate            []harness.Latency `json:"allocate"`
	PreferredAllocation []harness.Latency `json:"preferredAllocation"`
	HealthDetection     HealthDetection   `json:"healthDetection"`
	Reregistration      Reregistration    `json:"reregistration"`
	Process             Process           `json:"process"`
}

// HealthDetection is from writing an XID to the mock's control FIFO to the
// kubelet's client receiving the list with that GPU Unhealthy.
type HealthDetection struct {
	Signal    string    `json:"signal"`
	GPUs      []int     `json:"gpus"`
	MeanMs    float64   `json:"meanMs"`
	MaxMs     float64   `json:"maxMs"`
	SamplesMs []float64 `json:"samplesMs"`
}

// Reregistration is from a restarted kubelet's registration server
// listening (its Start returned, the plugin's socket wiped) to the device
// manager accepting the plugin's new connection.
type Reregistration struct {
	Restarts  int       `json:"restarts"`
	MedianMs  float64   `json:"medianMs"`
	MaxMs     float64   `json:"maxMs"`
	SamplesMs []float64 `json:"samplesMs"`
}

// Process is the plugin process's cost, read from /proc at the end.
type Process struct {
	IdleSeconds float64 `json:"idleSeconds"`
	// PollInterval is the plugin's --health-poll-interval, "" for its default.
	PollInterval string  `json:"healthPollInterval,omitempty"`
	PeakRSSBytes int64   `json:"peakRSSBytes"`
	PeakRSSMiB   float64 `json:"peakRSSMiB"`
	// RSSAfterIdleMiB is VmRSS at the end of the idle period: RSSAnonMiB
	// (Go heap, stacks, runtime, C allocations) plus RSSFileMiB (the mapped
	// executable, libc and the NVML library).
	RSSAfterIdleMiB float64 `json:"rssAfterIdleMiB"`
	RSSAnonMiB      float64 `json:"rssAnonMiB"`
	RSSFileMiB      float64 `json:"rssFileMiB"`
	// Budget is nil for a profile without one.
	Budget         *Budget `json:"budget,omitempty"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	IdleCPUSeconds float64 `json:"idleCPUSeconds"`
}

func run(ctx context.Context, o options) (*Report, error) {
	profile, err := harness.ProfilePath(o.profile)
	if err != nil {
		return nil, err
	}
	work, err := harness.ShortTempDir("gdps")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	progress("building the plugin and the mock NVML library")
	bin, err := harness.BuildPlugin(work)
	if err != nil {
		return nil, err
	}
	lib, err := harness.BuildMock(work + "/mock")
	if err != nil {
		return nil, err
	}
	dir := work + "/plugins"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	k, err := harness.StartKubelet(dir, klog.Logger{})
	if err != nil {
		return nil, err
	}
	defer k.Stop()

	popts := harness.PluginOptions{Binary: bin, Library: lib, Profile: profile, PluginDir: dir, HealthPollInterval: o.poll}
	if o.pluginLog != "" {
		f, err := os.Create(o.pluginLog)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		popts.Log = f
	}
	progress("starting the plugin on %s", profile)
	p, err := harness.StartPlugin(popts)
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	failed := func(err error) (*Report, error) {
		return nil, fmt.Errorf("%w\nplugin log:\n%s", err, p.Log())
	}

	rep := &Report{Profile: p.Profile.Name, GPUs: len(p.Profile.GPUs), HostCPUs: runtime.NumCPU()}
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	e, err := k.WaitConnected(wait, harness.ResourceName)
	if err != nil {
		cancel()
		return failed(err)
	}
	first, err := k.WaitDevices(wait, harness.ResourceName, "every GPU", harness.DeviceCount(rep.GPUs))
	cancel()
	if err != nil {
		return failed(err)
	}
	rep.Startup.RegisteredMs = ms(e.ConnectedAt.Sub(p.Started))
	rep.Startup.FirstListMs = ms(first.ReceivedAt.Sub(p.Started))
	ids := first.Healthy()
	if len(ids) != rep.GPUs {
		return failed(fmt.Errorf("%d of %d GPUs healthy at start", len(ids), rep.GPUs))
	}
	ids = byIndex(p, ids)

	progress("timing Allocate and GetPreferredAllocation, %d calls per size", o.calls)
	for _, size := range []int{1, 2, 4, 8} {
		if size > rep.GPUs {
			continue
		}
		l, err := harness.Measure(ctx, o.calls, size, waitTimeout, func(ctx context.Context) error {
			_, err := e.Allocate(ctx, ids[:size]...)
			return err
		})
		if err != nil {
			return failed(fmt.Errorf("Allocate of %d: %w", size, err))
		}
		rep.Allocate = append(rep.Allocate, l)
		l, err = harness.Measure(ctx, o.calls, size, waitTimeout, func(ctx context.Context) error {
			got, err := e.GetPreferredAllocation(ctx, ids, nil, size)
			if err == nil && len(got) != size {
				err = fmt.Errorf("%d devices for size %d", len(got), size)
			}
			return err
		})
		if err != nil {
			return failed(fmt.Errorf("GetPreferredAllocation of %d: %w", size, err))
		}
		rep.PreferredAllocation = append(rep.PreferredAllocation, l)
	}

	progress("restarting the kubelet %d times", o.restarts)
	rep.Reregistration.Restarts = o.restarts
	var took []time.Duration
	for range o.restarts {
		if err := k.Restart(); err != nil {
			return failed(err)
		}
		wait, cancel := context.WithTimeout(ctx, waitTimeout)
		e, err = k.WaitConnected(wait, harness.ResourceName)
		if err == nil {
			_, err = k.WaitDevices(wait, harness.ResourceName, "every GPU", harness.DeviceCount(rep.GPUs))
		}
		cancel()
		if err != nil {
			return failed(fmt.Errorf("after a kubelet restart: %w", err))
		}
		took = append(took, e.ConnectedAt.Sub(k.Started()))
	}
	rep.Reregistration.SamplesMs = msAll(took)
	rep.Reregistration.MedianMs = ms(harness.Percentile(took, 50))
	rep.Reregistration.MaxMs = ms(slices.Max(took))

	gpus := spread(rep.GPUs, o.healthGPUs)
	progress("injecting XID 79 into GPUs %v", gpus)
	rep.HealthDetection.Signal = "xid 79 (control FIFO write → Unhealthy received by the kubelet's client)"
	rep.HealthDetection.GPUs = gpus
	took = took[:0]
	for _, i := range gpus {
		id := p.Profile.GPUs[i].UUID
		start := time.Now()
		if err := p.Inject(fmt.Sprintf("xid %d 79", i)); err != nil {
			return failed(err)
		}
		wait, cancel := context.WithTimeout(ctx, waitTimeout)
		l, err := k.WaitDevices(wait, harness.ResourceName, fmt.Sprintf("GPU %d unhealthy", i), harness.DeviceHealth(id, api.Unhealthy))
		cancel()
		if err != nil {
			return failed(err)
		}
		took = append(took, l.ReceivedAt.Sub(start))
	}
	rep.HealthDetection.SamplesMs = msAll(took)
	rep.HealthDetection.MeanMs = ms(mean(took))
	rep.HealthDetection.MaxMs = ms(slices.Max(took))

	before, err := p.Usage()
	if err != nil {
		return failed(err)
	}
	progress("idling %v", o.idle)
	select {
	case <-time.After(o.idle):
	case <-p.Exited():
		return failed(fmt.Errorf("the plugin exited while idle"))
	case <-ctx.Done():
		return failed(ctx.Err())
	}
	after, err := p.Usage()
	if err != nil {
		return failed(err)
	}
	rep.Process = Process{
		IdleSeconds:     o.idle.Seconds(),
		PeakRSSBytes:    after.PeakRSS,
		PeakRSSMiB:      mib(after.PeakRSS),
		RSSAfterIdleMiB: mib(after.RSS),
		RSSAnonMiB:      mib(after.RSSAnon),
		RSSFileMiB:      mib(after.RSSFile),
		CPUSeconds:      harness.Round(after.CPU().Seconds(), 2),
		IdleCPUSeconds:  harness.Round((after.CPU() - before.CPU()).Seconds(), 2),
	}
	if o.poll > 0 {
		rep.Process.PollInterval = o.poll.String()
	}
	rep.Process.Budget = checkBudget(rep.Profile, rep.Process.RSSAfterIdleMiB)
	if err := p.Stop(); err != nil {
		return failed(err)
	}
	return rep, nil
}

// byIndex orders device IDs as the profile lists the GPUs, so Allocate of
// size n takes GPUs 0 to n-1.
func byIndex(p *harness.Plugin, ids []string) []string {
	var out []string
	for _, g := range p.Profile.GPUs {
		if slices.Contains(ids, g.UUID) {
			out = append(out, g.UUID)
		}
	}
	return out
}

// spread picks n GPU indexes of count, evenly apart, so both NUMA nodes
// are sampled.
func spread(count, n int) []int {
	n = min(n, count)
	out := make([]int, n)
	for k := range n {
		out[k] = k * count / n
	}
	return out
}

func mean(samples []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return sum / time.Duration(len(samples))
}

func ms(d time.Duration) float64 { return harness.Millis(d) }

func mib(bytes int64) float64 { return harness.Round(float64(bytes)/(1<<20), 1) }

func msAll(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = ms(d)
	}
	return out
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "scenario: "+format+"\n", args...)
}

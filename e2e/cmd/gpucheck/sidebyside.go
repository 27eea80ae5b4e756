package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// nvidiaPluginFile is NVIDIA's device plugin in the bundle, built by
// bundle.sh from its Go module (e2e/cluster/build.sh nvidia).
const nvidiaPluginFile = "nvidia-device-plugin"

// pluginDirHelper is gpu-check run as `gpu-check kubelet-dir-helper DIR
// BINARY ARGS...`: in the mount namespace of its own it was started in,
// it binds DIR over the kubelet's device-plugin directory and execs
// BINARY. NVIDIA's plugin listens and looks for the kubelet only there.
const pluginDirHelper = "kubelet-dir-helper"

// rssIdle is how long a plugin idles after the timed calls before its
// resident memory is read.
const rssIdle = 3 * time.Second

// Who ran, in sideRun.Plugin.
const (
	ours   = "ours"
	nvidia = "nvidia"
)

// sideBySide is the serve step's comparison with NVIDIA's device plugin:
// the two run in turn against one kubelet stand-in on the same GPUs.
type sideBySide struct {
	NVIDIAVersion string `json:"nvidiaVersion,omitempty"`
	// Skipped says, in one line, why there is no comparison.
	Skipped string `json:"skipped,omitempty"`
	// Runs in the order they ran: ours, NVIDIA's, ours, ...
	Runs  []sideRun `json:"runs,omitempty"`
	Table []sideRow `json:"table,omitempty"`
}

// sideRun is one plugin's run: started, registered, timed, left idle.
type sideRun struct {
	Plugin              string            `json:"plugin"`
	Devices             int               `json:"devices"`
	RegisteredMs        float64           `json:"registeredMs"`
	Allocate            []harness.Latency `json:"allocate"`
	PreferredAllocation []harness.Latency `json:"preferredAllocation"`
	// RSSMiB is resident memory rssIdle after the last call.
	RSSMiB     float64 `json:"rssMiB"`
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	Error      string  `json:"error,omitempty"`
}

// sideRow is one figure: each plugin's median over its runs, and
// ours/NVIDIA's (below 1, ours is faster or smaller).
type sideRow struct {
	Figure string  `json:"figure"`
	Unit   string  `json:"unit"`
	Ours   float64 `json:"ours"`
	NVIDIA float64 `json:"nvidia"`
	Ratio  float64 `json:"ratio"`
}

// runPluginDirHelperIfAsked runs the helper and does not return when
// this process was started as one.
func runPluginDirHelperIfAsked() {
	if len(os.Args) < 4 || os.Args[1] != pluginDirHelper {
		return
	}
	err := execInPluginDir(os.Args[2], os.Args[3], os.Args[3:])
	fmt.Fprintf(os.Stderr, "gpu-check %s: %v\n", pluginDirHelper, err)
	os.Exit(1)
}

// execInPluginDir binds dir over api.DevicePluginPath and execs bin. On a
// node without that directory a tmpfs covers its deepest existing parent
// first, for this namespace only. It returns only on failure.
func execInPluginDir(dir, bin string, argv []string) error {
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("reading its mount namespace: %w", err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return fmt.Errorf("reading its parent's mount namespace: %w", err)
	}
	if own == parent {
		return errors.New("runs in its parent's mount namespace, where its mounts would stay; gpu-check starts it in one of its own")
	}
	target := filepath.Clean(api.DevicePluginPath)
	if _, err := os.Stat(target); err != nil {
		at := filepath.Dir(target)
		for {
			if fi, err := os.Stat(at); err == nil && fi.IsDir() {
				break
			}
			at = filepath.Dir(at)
		}
		if at == "/" {
			return fmt.Errorf("no parent of %s to mount a tmpfs on without covering /", target)
		}
		if err := unix.Mount("tmpfs", at, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
			return fmt.Errorf("mounting a tmpfs on %s: %w", at, err)
		}
		if err := os.MkdirAll(target, 0o750); err != nil {
			return err
		}
	}
	if err := unix.Mount(dir, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s on %s: %w", dir, target, err)
	}
	return syscall.Exec(bin, argv, os.Environ())
}

// sideBySide runs our plugin and NVIDIA's in turn, runs times each,
// against one kubelet stand-in. NVIDIA's not running is a note, not a
// failure; ours failing in a run is a failed check.
func (c *checker) sideBySide(ctx context.Context, s *Step, runs int) *sideBySide {
	sb := &sideBySide{}
	bin := filepath.Join(c.o.bundle, nvidiaPluginFile)
	if _, err := os.Stat(bin); err != nil {
		sb.Skipped = fmt.Sprintf("NVIDIA's device plugin is not in the bundle (%s); make gpu-check-bundle builds it where the Go module proxy answers", bin)
		return sb
	}
	sb.NVIDIAVersion = nvidiaVersion(ctx, bin)
	exe, err := os.Executable()
	if err != nil {
		sb.Skipped = "finding gpu-check to start the plugins through: " + err.Error()
		return sb
	}
	dir := filepath.Join(c.work, "side")
	cdiDir := filepath.Join(c.work, "side-cdi")
	for _, d := range []string{dir, cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			sb.Skipped = err.Error()
			return sb
		}
	}
	k, err := harness.StartKubelet(dir, klog.Logger{})
	if err != nil {
		sb.Skipped = err.Error()
		return sb
	}
	defer k.Stop()
	wrapper := []string{exe, pluginDirHelper, dir}
	start := map[string]func() (*harness.Plugin, error){
		// At its defaults but for what would touch the host: the CDI
		// spec folder, the kubelet's pod-resources socket.
		ours: func() (*harness.Plugin, error) {
			return harness.StartPlugin(harness.PluginOptions{
				Binary: c.plugin, PluginDir: dir, Node: &c.node,
				Args:    []string{"--cdi-spec-dir", cdiDir, "--cdi-hook-path", c.hook, "--pod-resources-socket", ""},
				Wrapper: wrapper, MountNamespace: true,
			})
		},
		// As the migration lane runs it: NVML and /dev under the node's
		// roots, UUIDs in NVIDIA_VISIBLE_DEVICES.
		nvidia: func() (*harness.Plugin, error) {
			return harness.StartCommand(harness.Command{
				Binary: bin,
				Env: append(slices.Clone(c.node.Env),
					"NVIDIA_DRIVER_ROOT="+c.node.DriverRoot, "CONTAINER_DRIVER_ROOT="+c.node.DriverRoot,
					"NVIDIA_DEV_ROOT="+filepath.Dir(c.dev),
					"DEVICE_LIST_STRATEGY=envvar", "DEVICE_ID_STRATEGY=uuid", "FAIL_ON_INIT_ERROR=true"),
				Wrapper: wrapper, MountNamespace: true,
			})
		},
	}
	for i := range 2 * runs {
		who := []string{ours, nvidia}[i%2]
		if i > 0 {
			// A fresh kubelet for each run, as at boot: no stale list
			// or connection of the run before.
			if err := k.Restart(); err != nil {
				s.fail("side by side: kubelet restarts", err)
				break
			}
		}
		progress(os.Stderr, "serve: side by side, %s plugin, run %d of %d", who, i/2+1, runs)
		sb.Runs = append(sb.Runs, c.sideRun(ctx, k, who, start[who]))
	}
	var oursFailed, nvidiaErrs []string
	for _, r := range sb.Runs {
		switch {
		case r.Error == "":
		case r.Plugin == ours:
			oursFailed = append(oursFailed, r.Error)
		default:
			nvidiaErrs = append(nvidiaErrs, r.Error)
		}
	}
	s.check("side by side: our plugin's runs", len(oursFailed) == 0, "%s", strings.Join(oursFailed, "; "))
	sb.Table = sideTable(sb.Runs)
	if len(sb.Table) == 0 && len(nvidiaErrs) > 0 {
		sb.Skipped = "NVIDIA's device plugin did not serve: " + nvidiaErrs[0]
	}
	return sb
}

// nvidiaVersion is what NVIDIA's plugin says its version is.
func nvidiaVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimPrefix(line, "NVIDIA Device Plugin version ")
}

// sideRun starts one plugin, waits for it to register and list its GPUs,
// times Allocate and GetPreferredAllocation of one GPU and of all, lets
// it idle, reads its memory and stops it. A failure ends the run with
// the figures taken so far.
func (c *checker) sideRun(ctx context.Context, k *harness.Kubelet, who string, start func() (*harness.Plugin, error)) sideRun {
	r := sideRun{Plugin: who}
	p, err := start()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer p.Stop()
	failed := func(err error) sideRun {
		log := p.Log()
		if len(log) > 600 {
			log = log[len(log)-600:]
		}
		r.Error = oneLine(fmt.Sprintf("%v; log: %s", err, log), 900)
		return r
	}
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	ep, err := k.WaitConnected(wait, harness.ResourceName)
	if err != nil {
		return failed(err)
	}
	r.RegisteredMs = harness.Millis(ep.ConnectedAt.Sub(p.Started))
	l, err := k.WaitDevices(wait, harness.ResourceName, "a device", func(l harness.List) bool { return len(l.Devices) > 0 })
	if err != nil {
		return failed(err)
	}
	ids := l.Healthy()
	r.Devices = len(ids)
	if len(ids) == 0 {
		return failed(fmt.Errorf("none of %d devices healthy", len(l.Devices)))
	}
	sizes := []int{1}
	if len(ids) > 1 {
		sizes = append(sizes, len(ids))
	}
	for _, size := range sizes {
		a, err := harness.Measure(ctx, c.o.calls, size, waitTimeout, func(ctx context.Context) error {
			_, err := ep.Allocate(ctx, ids[:size]...)
			return err
		})
		if err != nil {
			return failed(fmt.Errorf("Allocate of %d: %w", size, err))
		}
		r.Allocate = append(r.Allocate, a)
		g, err := harness.Measure(ctx, c.o.calls, size, waitTimeout, func(ctx context.Context) error {
			_, err := ep.GetPreferredAllocation(ctx, ids, nil, size)
			return err
		})
		if err != nil {
			return failed(fmt.Errorf("GetPreferredAllocation of %d: %w", size, err))
		}
		r.PreferredAllocation = append(r.PreferredAllocation, g)
	}
	idle := time.NewTimer(rssIdle)
	defer idle.Stop()
	select {
	case <-idle.C:
	case <-ctx.Done():
		return failed(ctx.Err())
	}
	u, err := p.Usage()
	if err != nil {
		return failed(err)
	}
	r.RSSMiB = harness.Round(float64(u.RSS)/(1<<20), 1)
	r.PeakRSSMiB = harness.Round(float64(u.PeakRSS)/(1<<20), 1)
	return r
}

// figure is one value a run measured.
type figure struct {
	name, unit string
	v          float64
}

// figures are a run's values in the table's order; what it did not get
// to is left out.
func (r sideRun) figures() []figure {
	var fs []figure
	if r.RegisteredMs > 0 {
		fs = append(fs, figure{"registration", "ms", r.RegisteredMs})
	}
	for _, k := range []struct {
		name string
		ls   []harness.Latency
	}{{"Allocate", r.Allocate}, {"GetPreferredAllocation", r.PreferredAllocation}} {
		for _, l := range k.ls {
			fs = append(fs,
				figure{fmt.Sprintf("%s of %d p50", k.name, l.Size), "µs", l.P50Us},
				figure{fmt.Sprintf("%s of %d p99", k.name, l.Size), "µs", l.P99Us})
		}
	}
	if r.RSSMiB > 0 {
		fs = append(fs, figure{"RSS after idle", "MiB", r.RSSMiB})
	}
	return fs
}

// sideTable is one row per figure both plugins have from at least one
// run: each side's median, and their ratio.
func sideTable(runs []sideRun) []sideRow {
	type key struct{ name, unit string }
	var order []key
	values := map[string]map[key][]float64{ours: {}, nvidia: {}}
	for _, r := range runs {
		byKey, ok := values[r.Plugin]
		if !ok {
			continue
		}
		for _, f := range r.figures() {
			k := key{f.name, f.unit}
			if !slices.Contains(order, k) {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], f.v)
		}
	}
	var rows []sideRow
	for _, k := range order {
		o, n := values[ours][k], values[nvidia][k]
		if len(o) == 0 || len(n) == 0 {
			continue
		}
		row := sideRow{Figure: k.name, Unit: k.unit, Ours: median(o), NVIDIA: median(n)}
		if row.NVIDIA > 0 {
			row.Ratio = harness.Round(row.Ours/row.NVIDIA, 2)
		}
		rows = append(rows, row)
	}
	return rows
}

// median of vs; of an even count, the mean of the middle two.
func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return harness.Round((s[n/2-1]+s[n/2])/2, 3)
}

// pad is s padded with blanks to width characters (µ is one, in two bytes).
func pad(s string, width int) string {
	return s + strings.Repeat(" ", max(width-utf8.RuneCountInString(s), 0))
}

// notes are the summary's lines for the comparison.
func (sb *sideBySide) notes(runs int) []string {
	if sb == nil {
		return nil
	}
	if len(sb.Table) == 0 {
		why := sb.Skipped
		if why == "" {
			why = "no figure from both plugins"
		}
		return []string{"side by side with NVIDIA's device plugin: none; " + why}
	}
	lines := []string{
		fmt.Sprintf("side by side with NVIDIA's device plugin %s, %d runs each in turn, medians, ratio ours/NVIDIA's:", sb.NVIDIAVersion, runs),
		fmt.Sprintf("  %s %10s %10s %6s", pad("", 38), "ours", "NVIDIA's", "ratio"),
	}
	for _, r := range sb.Table {
		lines = append(lines, fmt.Sprintf("  %s %10.1f %10.1f %6.2f", pad(r.Figure+" ("+r.Unit+")", 38), r.Ours, r.NVIDIA, r.Ratio))
	}
	return lines
}

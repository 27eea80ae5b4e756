// Command firstlook is the body of `make first-look`: a first look at the
// plugin on a machine without a GPU. On a mock node in a temporary folder
// (the mock NVML library answering from a machine profile; sysfs, /dev and
// /proc as files) it runs the plugin's own commands, each under a heading
// that says what it shows: list, allocate, then serve, whose answer to
// the kubelet's Allocate it prints, and which it watches take a GPU out
// when the mock raises an XID. It removes the node, and stops serve, when
// it ends, Ctrl-C included.
//
// It links no kubelet code (make demo drives the plugin with the kubelet's
// own), only the device-plugin API and gRPC, which the plugin links too:
// after the plugin's build, building it compiles two packages.
//
//	make first-look   (e2e/cmd/firstlook/run.sh: builds the plugin and the mock, then runs this)
//	first-look -plugin bin/gpu-device-plugin -mock LIB -profile e2e/profiles/dgx-h100.profile
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// waitTimeout bounds each wait on serve.
const waitTimeout = 30 * time.Second

// xid is the XID the mock raises: 79, the GPU has fallen off the bus, one
// of the plugin's fatal XIDs (xidFatal).
const xid = 79

type options struct {
	plugin  string // the gpu-device-plugin binary
	mock    string // the mock libnvidia-ml.so.1
	profile string // the machine profile's path
}

func main() {
	var o options
	flag.StringVar(&o.plugin, "plugin", "bin/gpu-device-plugin", "the gpu-device-plugin binary")
	flag.StringVar(&o.mock, "mock", "bin/mocknvml/"+mocknvml.LibraryName, "the mock NVML library (make -C e2e/mocknvml)")
	flag.StringVar(&o.profile, "profile", "e2e/profiles/dgx-h100.profile", "the machine profile the mock answers from")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, o, os.Stdout)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "\nfirst-look: interrupted; serve is stopped and the mock node removed")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "first-look:", err)
		os.Exit(1)
	}
}

// run shows the plugin on the mock node, writing to w.
func run(ctx context.Context, o options, w io.Writer) (err error) {
	for _, p := range []*string{&o.plugin, &o.mock, &o.profile} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	n, err := newNode(o.profile, o.mock)
	if err != nil {
		return fmt.Errorf("laying out the mock node: %w", err)
	}
	defer os.RemoveAll(n.dir)
	gpus := n.prof.GPUs

	heading(w, "The mock node: %d × %s (profile %s), its files in %s", len(gpus), gpus[0].Name, n.prof.Name, n.dir)
	fmt.Fprintf(w, "A mock libnvidia-ml.so.1 answers NVML's calls from the profile (MOCK_NVML_PROFILE=%s).\n", n.profile)
	fmt.Fprintln(w, "These settings point the plugin at the node (each is a flag too, e.g. --sysfs-root):")
	width := len("GPU_DEVICE_PLUGIN_DRIVER_ROOT=") + len(n.path("driver"))
	for _, s := range n.hardware() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, s.name+"="+s.value, s.what)
	}
	fmt.Fprintln(w, "Others keep all serve writes (sockets, state, CDI specs, node labels) in there too.")

	heading(w, "1. gpu-device-plugin list: the GPUs NVML reports, with PCI address, NUMA node and health")
	if err := n.command(ctx, w, o.plugin, "list"); err != nil {
		return err
	}

	heading(w, "2. gpu-device-plugin allocate --size 2: the two GPUs the plugin prefers for a pod asking for 2, and why (NVLinks, NUMA)")
	if err := n.command(ctx, w, o.plugin, "allocate", "--size", "2"); err != nil {
		return err
	}

	heading(w, "3. gpu-device-plugin serve: it registers with the kubelet and answers Allocate with what a container gets")
	// CDI names, and the spec they resolve in, show all a container gets;
	// the default strategy (envvar) answers NVIDIA_VISIBLE_DEVICES and the
	// GPUs' device nodes, for NVIDIA's container runtime to add the rest.
	args := []string{"--device-list-strategy", "cdi-cri"}
	fmt.Fprintf(w, "$ gpu-device-plugin serve %s &   (a stand-in kubelet takes its registration and calls it)\n", strings.Join(args, " "))
	s, err := startServe(n, o.plugin, args...)
	if err != nil {
		return err
	}
	defer func() {
		if serr := s.stop(); err == nil && ctx.Err() == nil {
			err = serr
		}
	}()
	watchCtx, endWatch := context.WithCancel(ctx)
	defer endWatch() // before serve stops
	lw, chosen, err := showServe(watchCtx, w, n, s)
	if err != nil {
		return s.failed(err)
	}

	victim := gpus[slices.IndexFunc(gpus, func(g mocknvml.GPU) bool { return g.UUID == chosen[0] })]
	heading(w, "4. A health change: the mock raises XID %d (GPU fallen off the bus) on GPU %d, and serve takes it out", xid, victim.Index)
	if err := showHealthChange(ctx, w, n, s, lw, victim); err != nil {
		return s.failed(err)
	}
	return nil
}

// showServe connects to serve as the kubelet does, and shows its devices,
// its preferred two and its Allocate answer for them; it returns the
// ListAndWatch stream, which lasts as long as ctx, and the two.
func showServe(ctx context.Context, w io.Writer, n *node, s *serve) (*listWatch, []string, error) {
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	req, err := s.connect(wait, n.path("device-plugins"))
	if err != nil {
		return nil, nil, err
	}
	line, err := s.log.wait(wait, s.done, msgRegistered, nil)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(w, "serve: %s\n", short(line))
	lw, err := s.listAndWatch(ctx)
	if err != nil {
		return nil, nil, err
	}
	gpus := n.prof.GPUs
	devices, err := lw.next(wait, "every GPU", func(l []*api.Device) bool { return len(l) == len(gpus) })
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(w, "ListAndWatch: %d devices of %s, %d Healthy\n", len(devices), req.ResourceName, healthy(devices))
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = g.UUID
	}
	chosen, err := s.preferred(wait, ids, 2)
	if err != nil {
		return nil, nil, fmt.Errorf("GetPreferredAllocation: %w", err)
	}
	if len(chosen) != 2 || !slices.Contains(ids, chosen[0]) {
		return nil, nil, fmt.Errorf("GetPreferredAllocation of 2 answered %v", chosen)
	}
	fmt.Fprintf(w, "GetPreferredAllocation of 2: %s\n", strings.Join(chosen, ", "))
	resp, err := s.allocate(wait, chosen)
	if err != nil {
		return nil, nil, fmt.Errorf("Allocate: %w", err)
	}
	fmt.Fprintln(w, "Allocate of them answers with their CDI names:")
	writeAnswer(w, resp)
	if err := writeCDI(w, n.path("cdi"), resp); err != nil {
		return nil, nil, err
	}
	return lw, chosen, nil
}

// showHealthChange has the mock raise the XID on victim, as the e2e
// harness does, and shows serve's log line and ListAndWatch taking it out.
func showHealthChange(ctx context.Context, w io.Writer, n *node, s *serve, lw *listWatch, victim mocknvml.GPU) error {
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	// An event reaches only the event sets registered when it happens, as
	// in NVML: wait until serve says it watches.
	if _, err := s.log.wait(wait, s.done, msgEventsWatched, nil); err != nil {
		return err
	}
	ctl, err := mocknvml.OpenControl(n.control)
	if err != nil {
		return err
	}
	defer ctl.Close()
	cmd := fmt.Sprintf("xid %d %d", victim.Index, xid)
	fmt.Fprintf(w, "$ echo '%s' > $MOCK_NVML_CONTROL   (the mock's fault FIFO, as the e2e harness injects)\n", cmd)
	injected := time.Now()
	if err := ctl.InjectContext(wait, cmd); err != nil {
		return err
	}
	line, err := s.log.wait(wait, s.done, msgHealthChanged, func(l string) bool {
		return strings.Contains(l, "device="+victim.UUID) && strings.Contains(l, "new=Unhealthy")
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "serve: %s\n", short(line))
	after, err := lw.next(wait, victim.UUID+" Unhealthy", func(l []*api.Device) bool {
		i := slices.IndexFunc(l, func(d *api.Device) bool { return d.ID == victim.UUID })
		return i >= 0 && l[i].Health == api.Unhealthy
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "ListAndWatch: %s Unhealthy %s after the XID; %d of %d GPUs left for pods\n",
		victim.UUID, time.Since(injected).Round(time.Millisecond), healthy(after), len(after))
	if _, err := s.allocate(wait, []string{victim.UUID}); err != nil {
		fmt.Fprintf(w, "Allocate of it is refused: %s\n", grpcMessage(err))
	}
	return nil
}

// heading is a step's one-line heading, set off by a blank line.
func heading(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "\n== "+format+"\n", args...)
}

// command runs one of the plugin's commands on the node, its output to w.
// Its logs are left at warnings: its info lines say nothing new here.
func (n *node) command(ctx context.Context, w io.Writer, plugin string, args ...string) error {
	fmt.Fprintf(w, "$ gpu-device-plugin %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, plugin, args...)
	cmd.Env = n.env(false, "GPU_DEVICE_PLUGIN_LOG_LEVEL=warn")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gpu-device-plugin %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

func healthy(l []*api.Device) int {
	n := 0
	for _, d := range l {
		if d.Health == api.Healthy {
			n++
		}
	}
	return n
}

// writeAnswer prints an Allocate answer: what the container runtime gives
// the container.
func writeAnswer(w io.Writer, r *api.ContainerAllocateResponse) {
	keys := make([]string, 0, len(r.Envs))
	for k := range r.Envs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  env     %s=%s\n", k, r.Envs[k])
	}
	for _, d := range r.Devices {
		fmt.Fprintf(w, "  device  %s (%s, host %s)\n", d.ContainerPath, d.Permissions, d.HostPath)
	}
	for _, m := range r.Mounts {
		ro := ""
		if m.ReadOnly {
			ro = ", read-only"
		}
		fmt.Fprintf(w, "  mount   %s (host %s%s)\n", m.ContainerPath, m.HostPath, ro)
	}
	for _, d := range r.CdiDevices {
		fmt.Fprintf(w, "  CDI     %s\n", d.Name)
	}
	for k, v := range r.Annotations {
		fmt.Fprintf(w, "  annotation %s=%s\n", k, v)
	}
}

// grpcMessage is a gRPC error's message without its code.
func grpcMessage(err error) string {
	s := err.Error()
	if _, msg, ok := strings.Cut(s, "desc = "); ok {
		return msg
	}
	return s
}

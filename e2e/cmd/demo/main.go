// Command demo shows the plugin at work on a machine without a GPU: it
// builds the real binary and the mock NVML library, runs the plugin on the
// dgx-h100 profile against the kubelet's own device-plugin code in a
// temporary directory, and prints what a user wants to see: the resource
// registered, the devices with their NUMA nodes, one allocation, and an
// injected XID taking one GPU out.
//
//	make demo     (or: cd e2e && go run ./cmd/demo [-profile hgx-16])
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

func main() {
	profile := flag.String("profile", "dgx-h100", "machine profile: dgx-h100, pcie-4gpu, hgx-16 or a .profile path")
	flag.Parse()
	klog.SetLogger(logr.Discard())
	if err := run(*profile); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(name string) error {
	path, err := harness.ProfilePath(name)
	if err != nil {
		return err
	}
	work, err := harness.ShortTempDir("gdpdemo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	began := time.Now()
	// A line per step, each with its time, so a first run that compiles for
	// minutes is not taken for a hang.
	step := func(what string) func() {
		fmt.Printf("demo: %s ...", what)
		t := time.Now()
		return func() { fmt.Printf(" %s\n", time.Since(t).Round(100*time.Millisecond)) }
	}
	done := step("building gpu-device-plugin (go build; the first time also its modules)")
	bin, err := harness.BuildPlugin(work)
	if err != nil {
		return err
	}
	done()
	done = step("building the mock libnvidia-ml.so.1 (gcc)")
	lib, err := harness.BuildMock(work + "/mock")
	if err != nil {
		return err
	}
	done()
	dir := work + "/device-plugins"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	done = step("starting the kubelet's device manager")
	k, err := harness.StartKubelet(dir, klog.Logger{})
	if err != nil {
		return err
	}
	defer k.Stop()
	done()
	done = step("starting the plugin on the mock " + name)
	p, err := harness.StartPlugin(harness.PluginOptions{Binary: bin, Library: lib, Profile: path, PluginDir: dir})
	if err != nil {
		return err
	}
	defer p.Stop()
	done()
	defer func() { fmt.Printf("\ndemo: done in %s\n", time.Since(began).Round(100*time.Millisecond)) }()
	fail := func(err error) error { return fmt.Errorf("%w\nplugin log:\n%s", err, p.Log()) }

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := k.WaitConnected(ctx, harness.ResourceName)
	if err != nil {
		return fail(err)
	}
	list, err := k.WaitDevices(ctx, harness.ResourceName, "every GPU", harness.DeviceCount(len(p.Profile.GPUs)))
	if err != nil {
		return fail(err)
	}
	fmt.Printf("\nmachine: %s (%d GPUs), mock NVML through the real go-nvml binding\n", p.Profile.Name, len(p.Profile.GPUs))
	fmt.Printf("registered %s with the kubelet %s after start (socket %s)\n\n",
		e.Resource, e.ConnectedAt.Sub(p.Started).Round(time.Millisecond), harness.SocketName)

	fmt.Println("devices the kubelet sees:")
	ids := make([]string, 0, len(p.Profile.GPUs))
	for _, g := range p.Profile.GPUs {
		d := list.Devices[g.UUID]
		if d == nil {
			return fail(fmt.Errorf("GPU %d (%s) not advertised", g.Index, g.UUID))
		}
		fmt.Printf("  %-2d %s  %s  NUMA %s  %s\n", g.Index, g.UUID, g.BusID, numa(d), d.Health)
		ids = append(ids, g.UUID)
	}

	chosen, err := e.GetPreferredAllocation(ctx, ids, nil, 2)
	if err != nil {
		return fail(err)
	}
	resp, err := e.Allocate(ctx, chosen...)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("\nA pod asks for nvidia.com/gpu: 2. Preferred: %s\n", strings.Join(chosen, ", "))
	fmt.Printf("Allocate answers:\n  %s=%s\n", harness.VisibleDevicesEnv, resp.Envs[harness.VisibleDevicesEnv])
	var nodes []string
	for _, d := range resp.Devices {
		nodes = append(nodes, d.ContainerPath)
	}
	fmt.Printf("  device nodes: %s\n", strings.Join(nodes, " "))

	victim := p.Profile.GPUs[slices.Index(ids, chosen[0])]
	fmt.Printf("\nInjecting XID 79 (GPU fallen off the bus) on GPU %d ...\n", victim.Index)
	start := time.Now()
	if err := p.Inject(fmt.Sprintf("xid %d 79", victim.Index)); err != nil {
		return fail(err)
	}
	after, err := k.WaitDevices(ctx, harness.ResourceName, "XID victim unhealthy", harness.DeviceHealth(victim.UUID, api.Unhealthy))
	if err != nil {
		return fail(err)
	}
	fmt.Printf("  %s is Unhealthy in ListAndWatch %s later; %d of %d GPUs allocatable\n",
		victim.UUID, time.Since(start).Round(10*time.Microsecond), len(after.Healthy()), len(ids))
	if _, err := e.Allocate(ctx, victim.UUID); err != nil {
		fmt.Printf("  Allocate of it is refused: %v\n", err)
	}
	return nil
}

func numa(d *api.Device) string {
	if n := d.GetTopology().GetNodes(); len(n) > 0 {
		return fmt.Sprint(n[0].ID)
	}
	return "-"
}

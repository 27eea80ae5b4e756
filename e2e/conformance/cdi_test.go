package conformance

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"

	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

// rdmaNodes adds the dgx-h100 fixture's RDMA nodes to the driver root's
// /dev, as character devices with their usual numbers (uverbsN is
// 231:192+N), so the CDI library can stat them as a runtime does.
func rdmaNodes() string {
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, "char dev/infiniband/uverbs%d 231 %d\n", i, 192+i)
	}
	b.WriteString("char dev/infiniband/rdma_cm 10 58\n")
	return b.String()
}

// devNum is a device node's numbers as the runtime gets them.
type devNum struct {
	major, minor int64
}

// TestCDIRoundTrip runs the whole serve process with only the cdi-cri
// strategy, allocates 2 GPUs and 1 NIC through the kubelet's client, and
// hands the CDI names it gets to the CDI library's own cache, as
// containerd and CRI-O do: every name must resolve from the spec files
// the plugin wrote, and the injected OCI spec must hold the GPUs' and the
// NIC's device nodes and the driver's read-only mounts.
func TestCDIRoundTrip(t *testing.T) {
	nicRoot := sysfstest.Load(t, "dgx-h100")
	driverRoot, chars := cditest.Tree(t, cditest.Manifest(t)+rdmaNodes())
	dir := shortPluginDir(t, resname.GPU, rdmaNUMA0, rdmaNUMA1)
	k, _ := startKubelet(t, dir)

	cfg := config.Default()
	cfg.DevicePluginDir = dir
	cfg.SysfsRoot, cfg.ProcRoot = filepath.Join(nicRoot, "sys"), filepath.Join(nicRoot, "proc")
	cfg.DriverRoot, cfg.DevRoot = driverRoot, filepath.Join(driverRoot, "dev")
	cfg.NICResources = exampleNICResources(t)
	cfg.DeviceListStrategy = []string{gpu.StrategyCDICRI}
	cfg.CDISpecDir = t.TempDir()

	// The GPUs as the daemon will discover them, from the same mock.
	lib := nvmltest.NewDGXA100()
	inv, err := nvml.Discover(lib, cfg.SysfsRoot, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// The NVIDIA Container Toolkit's spec is in the same directory on most
	// GPU nodes: same GPUs, its own kind.
	var tg []cditest.GPU
	for _, g := range inv.GPUs {
		tg = append(tg, cditest.GPU{Index: g.Index, Minor: g.Minor, UUID: g.UUID})
	}
	toolkit := cditest.ToolkitSpec(tg, cfg.DevRoot)
	if err := os.WriteFile(filepath.Join(cfg.CDISpecDir, "nvidia.yaml"), []byte(toolkit), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, cfg, lib)
	gpus := []nvml.GPU{inv.GPUs[5], inv.GPUs[2]}
	const nicAddr = "0000:4f:00.0" // rdma_numa0, uverbs2

	gpuEP := k.waitConnected(t, resname.GPU)
	nicEP := k.waitConnected(t, rdmaNUMA0)
	k.waitDevices(t, resname.GPU, "8 devices", all8)
	k.waitDevices(t, rdmaNUMA0, nicAddr, func(d map[string]*api.Device) bool { return d[nicAddr] != nil })

	gresp, err := allocateOne(gpuEP, gpus[0].UUID, gpus[1].UUID)
	if err != nil {
		t.Fatal(err)
	}
	nresp, err := allocateOne(nicEP, nicAddr)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("only CDI names: no device nodes, no NVIDIA_VISIBLE_DEVICES", func(t *testing.T) {
		if len(gresp.Devices) > 0 || len(nresp.Devices) > 0 {
			t.Errorf("device nodes with only cdi-cri: GPUs %v, NIC %v", gresp.Devices, nresp.Devices)
		}
		if v, ok := gresp.Envs[gpu.VisibleDevicesEnv]; ok {
			t.Errorf("%s = %q with only cdi-cri; the NVIDIA runtime would inject the GPUs a second way", gpu.VisibleDevicesEnv, v)
		}
		// The address list is for the workload, not the runtime: it stays.
		if got := nresp.Envs["PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0"]; got != nicAddr {
			t.Errorf("PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0 = %q, want %q", got, nicAddr)
		}
		if len(gresp.Annotations) > 0 || len(nresp.Annotations) > 0 {
			t.Errorf("CDI annotations without cdi-annotations: %v, %v", gresp.Annotations, nresp.Annotations)
		}
	})

	var names []string
	for _, r := range []*api.ContainerAllocateResponse{gresp, nresp} {
		for _, d := range r.CdiDevices {
			names = append(names, d.Name)
		}
	}
	// GPUs in index order, named by UUID (the default ID strategy).
	want := []string{
		cdi.QualifiedName(cdi.GPUKind, inv.GPUs[2].UUID),
		cdi.QualifiedName(cdi.GPUKind, inv.GPUs[5].UUID),
		cdi.QualifiedName(rdmaNUMA0, nicAddr),
	}
	if !slices.Equal(names, want) {
		t.Fatalf("CDI devices from Allocate = %v, want %v", names, want)
	}

	// The specs are written before the resources register, so a name
	// the kubelet can hand out resolves at once.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDISpecDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the CDI library refused spec files: %v", errs)
	}
	spec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("InjectDevices(%v): unresolved %v: %v (the cache knows %v)", names, unresolved, err, cache.ListDevices())
	}
	t.Run("the toolkit's names still resolve beside ours", func(t *testing.T) {
		theirs := []string{"nvidia.com/gpu=all", "nvidia.com/gpu=0", "nvidia.com/gpu=" + inv.GPUs[7].UUID}
		if unresolved, err := cache.InjectDevices(&oci.Spec{}, theirs...); err != nil {
			t.Errorf("toolkit names %v unresolved: %v", unresolved, err)
		}
	})

	t.Run("device nodes of the two GPUs, the control nodes and the NIC", func(t *testing.T) {
		want := map[string]devNum{
			"/dev/nvidiactl":          {195, 255},
			"/dev/nvidia-uvm":         {508, 0},
			"/dev/nvidia-uvm-tools":   {508, 1},
			"/dev/infiniband/uverbs2": {231, 194},
			"/dev/infiniband/rdma_cm": {10, 58},
		}
		for _, g := range gpus {
			want["/dev/nvidia"+strconv.Itoa(g.Minor)] = devNum{195, int64(g.Minor)}
		}
		if spec.Linux == nil {
			t.Fatal("no Linux section: nothing was injected")
		}
		typ := "c"
		if !chars {
			typ = "p" // mknod not allowed here: the fake nodes are FIFOs
		}
		got := map[string]devNum{}
		for _, d := range spec.Linux.Devices {
			got[d.Path] = devNum{d.Major, d.Minor}
			if d.Type != typ {
				t.Errorf("%s type = %q, want %q", d.Path, d.Type, typ)
			}
		}
		if !chars {
			// A FIFO has no numbers: compare the paths only.
			for p := range want {
				want[p] = devNum{}
			}
			for p := range got {
				got[p] = devNum{}
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("injected device nodes = %v,\nwant %v", got, want)
		}
		if !chars {
			return
		}
		// The device cgroup lets the container use each of them.
		allowed := map[devNum]string{}
		if spec.Linux.Resources != nil {
			for _, r := range spec.Linux.Resources.Devices {
				if r.Allow && r.Type == "c" && r.Major != nil && r.Minor != nil {
					allowed[devNum{*r.Major, *r.Minor}] = r.Access
				}
			}
		}
		for p, n := range want {
			if allowed[n] != "rw" {
				t.Errorf("%s (%d:%d): device cgroup access %q, want rw", p, n.major, n.minor, allowed[n])
			}
		}
	})

	t.Run("driver files are mounted read-only from the driver root", func(t *testing.T) {
		driver, err := driverroot.Find(driverRoot)
		if err != nil {
			t.Fatal(err)
		}
		if len(spec.Mounts) != len(cdi.DriverMounts(driver)) {
			t.Errorf("%d mounts injected, want the driver's %d", len(spec.Mounts), len(cdi.DriverMounts(driver)))
		}
		byPath := map[string]oci.Mount{}
		for _, m := range spec.Mounts {
			byPath[m.Destination] = m
			if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") {
				t.Errorf("mount %s options %v, want ro, nosuid, nodev", m.Destination, m.Options)
			}
			if !strings.HasPrefix(m.Source, driverRoot+"/") {
				t.Errorf("mount %s from %s, outside the driver root %s", m.Destination, m.Source, driverRoot)
			}
		}
		for _, p := range []string{
			"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
			"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
			"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
			"/usr/bin/nvidia-smi",
			"/lib/firmware/nvidia/550.54.15",
		} {
			if _, ok := byPath[p]; !ok {
				t.Errorf("no mount at %s", p)
			}
		}
		// A stale library from the previous driver is never mounted.
		if m, ok := byPath["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]; ok && !strings.HasSuffix(m.Source, "libcuda.so.550.54.15") {
			t.Errorf("libcuda.so.1 is mounted from %s, want the 550.54.15 library", m.Source)
		}
	})

	// The kubelet restarts a container with the CDI names it checkpointed,
	// without asking the plugin again: they must resolve while it is down.
	t.Run("the specs outlive the daemon", func(t *testing.T) {
		if err := stop(); err != nil {
			t.Fatalf("daemon.Run: %v", err)
		}
		if err := cache.Refresh(); err != nil {
			t.Fatal(err)
		}
		if unresolved, err := cache.InjectDevices(&oci.Spec{}, names...); err != nil {
			t.Errorf("after shutdown %v are unresolvable: %v", unresolved, err)
		}
	})
}

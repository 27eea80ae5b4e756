package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/dra"
	"github.com/gpu-device-plugin/gpu-device-plugin/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

// draCheckpointFile, in cfg.DRAPluginDir, keeps prepared claims.
const draCheckpointFile = "checkpoint.json"

// draFront serves the GPUs and NIC pools as one DRA driver: the model's
// sources feed dra.Driver, and the kubeletplugin helper carries it to the
// kubelet (registration, Prepare/Unprepare, health) and the API server
// (ResourceSlices).
type draFront struct {
	drv    *dra.Driver
	helper *kubeletplugin.Helper
	specs  *specStore
	ctx    context.Context

	mu     sync.Mutex
	gspecs *gpuSpecs
	pools  map[string]*nic.Pool
	inv    *nvml.Inventory
}

// startDRA registers the driver with the kubelet. Slices are published
// once the GPUs and every NIC pool have reported. client, when not nil,
// is used instead of the one cfg names (WithKubeClient).
func startDRA(ctx context.Context, cfg config.Config, specs *specStore, client kubernetes.Interface, log *slog.Logger) (*draFront, error) {
	var err error
	if client == nil {
		if client, err = kubeClient(cfg); err != nil {
			return nil, err
		}
	}
	node := cfg.NodeName
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("DRA: no nodeName set and no host name: %w", err)
		}
		node = strings.ToLower(node)
	}
	f := &draFront{specs: specs, pools: map[string]*nic.Pool{}}
	drv, err := dra.New(dra.Options{
		DriverName:     config.DRADriverName,
		NodeName:       node,
		SysfsRoot:      cfg.SysfsRoot,
		CheckpointPath: filepath.Join(cfg.DRAPluginDir, draCheckpointFile),
		GPUCDIID:       func(uuid string) string { return cdi.QualifiedName(cdi.GPUKind, uuid) },
		NICCDIID:       f.nicCDIID,
		Specs:          f,
		Sources:        1 + len(cfg.NICResources),
		Log:            log,
	})
	if err != nil {
		return nil, err
	}
	f.drv = drv
	// The helper logs through klog's context logger: ours, so there is
	// one structured log.
	f.ctx = klog.NewContext(ctx, logr.FromSlogHandler(log.Handler()))
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(config.DRADriverName),
		kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(cfg.PluginRegistryDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.DRAPluginDir),
	}
	if cfg.PodUID != "" {
		// Two pods of a rolling update serve side by side; the kubelet
		// moves to the newer one.
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(cfg.PodUID)))
	}
	if f.helper, err = kubeletplugin.Start(f.ctx, drv, opts...); err != nil {
		return nil, fmt.Errorf("starting the DRA kubelet plugin: %w", err)
	}
	log.Info("serving through DRA", "driver", config.DRADriverName, "node", node, "pluginDir", cfg.DRAPluginDir)
	drv.SetPublisher(f.ctx, f.helper)
	return f, nil
}

// kubeClient reads cfg.Kubeconfig, or the pod's service account.
func kubeClient(cfg config.Config) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("DRA mode needs API access for ResourceSlices: set kubeconfig (--kubeconfig) or run in a pod with a service account: %w", err)
	}
	rc.UserAgent = "gpu-device-plugin"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("DRA: API client: %w", err)
	}
	return c, nil
}

// run stops the helper when ctx ends. Prepared claims stay in the
// checkpoint; the ResourceSlices stay too, for the next start to update.
func (f *draFront) run(ctx context.Context) error {
	<-ctx.Done()
	f.helper.Stop()
	return nil
}

// Ensure is dra.CDISpecs: the GPU spec is checked against the control
// nodes present, as before an Allocate; a NIC pool's spec must be on disk.
func (f *draFront) Ensure(kind string) error {
	if kind == cdi.GPUKind {
		f.mu.Lock()
		g := f.gspecs
		f.mu.Unlock()
		if g == nil {
			return fmt.Errorf("%w: no GPU CDI spec yet", device.ErrNotReady)
		}
		return g.Ensure()
	}
	return f.specs.ready(kind)
}

func (f *draFront) nicCDIID(pool, address string) string {
	f.mu.Lock()
	p := f.pools[pool]
	f.mu.Unlock()
	if p == nil {
		return ""
	}
	return p.CDIName(address)
}

// nicFront hands the NIC pools to the driver.
func (f *draFront) nicFront(s *nicServer) (nicFront, error) {
	f.mu.Lock()
	for _, p := range s.pools.All() {
		f.pools[p.Resource()] = p
	}
	f.mu.Unlock()
	return draNICs{f}, nil
}

type draNICs struct{ f *draFront }

func (n draNICs) setDevices(p *nic.Pool, devs []device.Device, first bool) {
	n.f.drv.SetNICPool(n.f.ctx, dra.NICPool{Name: p.Resource(), NICs: p.NICs()}, devs, first)
}

func (n draNICs) run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// draGPUs hands the GPUs to the driver.
type draGPUs struct{ f *draFront }

func (g draGPUs) take(inv *nvml.Inventory, specs *gpuSpecs) (health.Notifier, error) {
	g.f.mu.Lock()
	g.f.gspecs, g.f.inv = specs, inv
	g.f.mu.Unlock()
	return g.f.drv, nil
}

// run publishes the GPUs (after take's caller polled their health once,
// so the first slice already carries their taints) and waits.
func (g draGPUs) run(ctx context.Context) error {
	g.f.mu.Lock()
	inv := g.f.inv
	g.f.mu.Unlock()
	g.f.drv.SetGPUs(g.f.ctx, dra.GPUs{GPUs: inv.GPUs, Topology: inv.Topology, DriverVersion: inv.DriverVersion, CUDADriverVersion: inv.CUDADriverVersion})
	<-ctx.Done()
	return nil
}

// absent publishes no GPUs, so the NIC pools need not wait for a driver.
func (g draGPUs) absent(context.Context) { g.f.drv.SetGPUs(g.f.ctx, dra.GPUs{}) }

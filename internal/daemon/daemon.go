package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dpnode"
)

// NewLogger is the one structured logger, at cfg's level and in its
// format, writing to w.
func NewLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// OpenFunc loads NVML. Production passes nvml.Open; tests pass a mock.
type OpenFunc func(path string) (nvml.Library, error)

// Run serves every resource until ctx ends. A missing driver is not fatal:
// the GPU resource waits for NVML, retrying at cfg.NVMLRetryInterval, while
// other resources are served.
func Run(ctx context.Context, cfg config.Config, open OpenFunc, log *slog.Logger) error {
	return RunWith(ctx, cfg, open, log)
}

// Option adds to what Run can do.
type Option func(*options)

type options struct {
	dra NewFrontEnd
}

// WithDRA supplies the DRA front-end (dra.NewFrontEnd, through
// dramode.With). It lives outside this package so that the device-plugin
// executable links no Kubernetes client code; gpu-device-plugin-dra
// passes it. F is its concrete type, so the front-end needs nothing of
// this package.
func WithDRA[F FrontEnd](start func(context.Context, config.Config, *ondisk.Store, *slog.Logger) (F, error)) Option {
	return func(o *options) {
		o.dra = func(ctx context.Context, cfg config.Config, specs *ondisk.Store, log *slog.Logger) (FrontEnd, error) {
			fe, err := start(ctx, cfg, specs, log)
			if err != nil {
				return nil, err
			}
			return fe, nil
		}
	}
}

// RunWith is Run with options.
func RunWith(ctx context.Context, cfg config.Config, open OpenFunc, log *slog.Logger, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	specs, err := ondisk.NewStore(CDIOptions(cfg), log)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	// Spec files stay on shutdown (specStore says why).
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Go(func() { specs.Run(ctx) })
	// Liveness and readiness: shut until the GPUs (and NIC pools) are
	// discovered, then until the front-end has told the kubelet.
	status := probe.New(nil)
	status.Gate(gateGPUs, "discovering GPUs")
	if len(cfg.NICResources) > 0 {
		status.Gate(gateNICs, "scanning NICs")
	}
	// A human's release of a GPU comes on the health socket only, never
	// the metrics port: only who can exec into the pod reaches it.
	remEndpoint := &remediate.Endpoint{}
	if why := remediationOff(cfg); why != "" {
		remEndpoint.Off(why)
	}
	if cfg.HealthSocket != "" {
		ln, err := probe.Listen(cfg.HealthSocket)
		if err != nil {
			return fmt.Errorf("healthSocket (--health-socket): %w", err)
		}
		log.Info("answering liveness and readiness probes", "socket", cfg.HealthSocket)
		mux := http.NewServeMux()
		mux.Handle("/", status.Handler())
		mux.Handle(remediate.PathStatus, remEndpoint.Handler())
		mux.Handle(remediate.PathStatus+"/", remEndpoint.Handler())
		wg.Go(func() {
			if err := probe.Serve(ctx, ln, mux); err != nil {
				log.Error("health socket stopped", "err", err)
			}
		})
	}
	var mets *metrics.Metrics
	var hook *metrics.CDIHook
	if cfg.MetricsAddress != "" {
		reg := exposition.NewRegistry()
		for _, c := range []exposition.Collector{metrics.GoRuntime(), metrics.Process("/proc")} {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("registering metrics: %w", err)
			}
		}
		if specs != nil {
			if hook, err = metrics.RegisterCDIHook(reg); err != nil {
				return err
			}
		}
		if mets, err = metrics.NewMetrics(reg); err != nil {
			return err
		}
		if err := metrics.RegisterProbes(reg, status); err != nil {
			return err
		}
		if cfg.PodResourcesSocket != "" {
			if err := reg.Register(allocations(cfg, mets, log)); err != nil {
				return fmt.Errorf("registering metrics: %w", err)
			}
		}
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics: listening on %s: %w", cfg.MetricsAddress, err)
		}
		log.Info("serving metrics", "address", ln.Addr().String())
		// Every path but the probes' is /metrics, as before they came.
		mux := http.NewServeMux()
		mux.Handle("/", reg)
		mux.Handle("GET /livez", status.Handler())
		mux.Handle("GET /readyz", status.Handler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "err", err)
			}
		})
		wg.Go(func() {
			<-ctx.Done()
			srv.Close()
		})
	}
	fail := func(err error) {
		if err != nil {
			select {
			case errc <- err:
			default:
			}
			cancel()
		}
	}
	var apiObs kubeapi.RequestObserver // nil unless metrics are on
	if mets != nil {
		apiObs = mets
	}
	api, err := newAPIAccess(cfg, apiObs)
	if err != nil {
		return err
	}
	rep, err := newReporting(cfg, api, log)
	if err != nil {
		return err
	}
	runtimeDoor(cfg, mets, rep, log)
	cord, err := nodeCordon(cfg, api, rep, log)
	if err != nil {
		return err
	}
	if cord != nil {
		// Off the remediation's goroutine: a slow API server never holds
		// up a GPU's remediation.
		wg.Go(func() { cord.Run(ctx) })
	}
	labelsTo := LabelDelivery(cfg, "")
	var labelsAPI any // nil unless nodeLabels: node or nodefeature
	if cfg.NodeLabels == config.NodeLabelsNode || cfg.NodeLabels == config.NodeLabelsNodeFeature {
		labelsAPI, labelsTo.Node = api.client, api.node
	}
	// The one place the kubelet API is chosen: everything above and in
	// serveGPUs and serveNICs is shared by both front-ends.
	info := devinfo.NewLocked(cfg.DeviceInfoDir)
	var fe FrontEnd
	switch {
	case cfg.KubeletAPI != config.KubeletAPIDRA:
		fe = dpnode.New(dpnode.Options{Layout: LayoutOptions(cfg), DevicePluginDir: cfg.DevicePluginDir, IMEX: IMEXChannels(cfg)}, specs, info, log)
	case o.dra == nil:
		return errors.New("kubeletAPI dra: this executable serves the device-plugin API only; DRA mode runs in gpu-device-plugin-dra, which serve starts when it is installed beside it")
	default:
		if fe, err = o.dra(ctx, cfg, specs, log); err != nil {
			return err
		}
	}
	if r, ok := fe.(readiness); ok {
		r.UseReadiness(status.Gate)
	}
	if u, ok := fe.(podUIDs); ok && rep != nil {
		rep.holders.useDRAPodUIDs(u.PodUID)
	}
	wg.Go(func() { fail(fe.Run(ctx)) })
	if rep != nil {
		// Health also goes to the API server, behind either front-end.
		wg.Go(func() { rep.run(ctx) })
	}
	// Whether GPU containers get the hook: a metric and the Node condition.
	onHook := func(installed bool, _ error) {
		if hook != nil {
			hook.Set(installed)
		}
		if rep != nil && cfg.CDIHookPath != "" {
			if installed {
				rep.rep.SetNotice(report.GPU, "", "")
			} else {
				rep.rep.SetNotice(report.GPU, ReasonCDIHookMissing, cdi.HookMissingMessage(cfg.CDIHookPath))
			}
		}
	}
	wg.Go(func() {
		fail(serveGPUs(ctx, cfg, open, mets, specs, onHook, fe, rep, labelsTo, labelsAPI, cordoner(cord), status, remEndpoint, log))
	})
	if len(cfg.NICResources) > 0 {
		wg.Go(func() { fail(serveNICs(ctx, cfg, specs, mets, info, fe, rep, status, log)) })
	}
	<-ctx.Done()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// The readiness gates and liveness loops the daemon keeps itself; the
// front-ends add a gate per resource (device-plugin API) or one for the
// ResourceSlices (DRA).
const (
	gateGPUs      = "GPUs"
	gateNICs      = "NIC pools"
	loopGPUHealth = "GPU health polls"
	loopNICScan   = "NIC scans"
)

// readiness is a front-end that says whether the kubelet has what it
// serves (dpnode and dra both are).
type readiness interface {
	UseReadiness(ready func(name, why string))
}

// ReasonCDIHookMissing is the GPUHealthy condition's reason while every GPU
// is healthy but the GPU CDI spec cannot run the hook.
const ReasonCDIHookMissing = "CDIHookMissing"

// allocations is the collector of gpu_device_plugin_device_allocated,
// asking the kubelet's PodResources API at each scrape.
func allocations(cfg config.Config, mets *metrics.Metrics, log *slog.Logger) *metrics.AllocationCollector {
	return mets.Allocations(metrics.AllocationOptions{
		Holders: podresources.Client{Socket: cfg.PodResourcesSocket, Timeout: allocationTimeout}.Holders,
		Driver:  config.DRADriverName,
		Pool:    poolName(cfg),
		Timeout: allocationTimeout,
		Source:  cfg.PodResourcesSocket + " (podResourcesSocket, --pod-resources-socket)",
		Log:     log,
	})
}

// allocationTimeout is well inside Prometheus's default 10s scrape
// timeout: a stuck kubelet must not fail the whole scrape.
const allocationTimeout = 2 * time.Second

// poolName is this node's DRA pool: the node's name. Empty when it is not
// known; DRA holders are then not matched.
func poolName(cfg config.Config) string {
	n, _ := cfg.Node()
	return n
}

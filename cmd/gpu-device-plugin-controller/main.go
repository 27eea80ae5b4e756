// Command gpu-device-plugin-controller runs the ComputeDomain controller:
// one Deployment for the cluster, leader-elected, which keeps each
// ComputeDomain's status from the entries its nodes write. It is a program
// of its own, not a command of the node daemon, so that the daemon links
// no informers, leader election or clientset.
//
//	gpu-device-plugin-controller [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	cdcontrol "github.com/gpu-device-plugin/gpu-device-plugin/internal/control/computedomain"
)

// name is this program's, in its errors and its flag set.
const name = "gpu-device-plugin-controller"

// Set at link time, as for gpu-device-plugin.
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// controllerFlags are the controller's settings; each has an environment
// twin the chart sets.
type controllerFlags struct {
	kubeconfig, namespace, leaseName, identity string
	nodeTimeout, resync, leaseDuration         time.Duration
}

func parseFlags(args []string, stderr io.Writer) (controllerFlags, error) {
	var f controllerFlags
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	host, _ := os.Hostname()
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; empty: the pod's service account")
	fs.StringVar(&f.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader Lease (the controller's own; env POD_NAMESPACE)")
	fs.StringVar(&f.leaseName, "lease-name", "gpu-device-plugin-compute-domain-controller", "name of the leader Lease")
	fs.StringVar(&f.identity, "identity", envOr("POD_NAME", host), "this replica's name in the Lease (env POD_NAME)")
	fs.DurationVar(&f.nodeTimeout, "node-timeout", 2*time.Minute, "a node whose entry is older is reported lost (NodeLost)")
	fs.DurationVar(&f.resync, "resync", 30*time.Second, "how often every domain is looked at again")
	fs.DurationVar(&f.leaseDuration, "lease-duration", 15*time.Second, "the Lease's duration")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if f.namespace == "" {
		return f, errors.New("--namespace is empty; set it (or POD_NAMESPACE) to the namespace the controller runs in")
	}
	if f.nodeTimeout < 10*time.Second {
		return f, fmt.Errorf("--node-timeout %s is shorter than 10s; nodes write their entry every 30s at most: give 1m or more", f.nodeTimeout)
	}
	if f.resync <= 0 || f.leaseDuration < 3*time.Second {
		return f, errors.New("--resync must be positive and --lease-duration at least 3s")
	}
	return f, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	var rc *rest.Config
	if f.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("API access: %w", err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("the Kubernetes client: %w", err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("the dynamic client: %w", err)
	}
	log.Info("starting the ComputeDomain controller", "version", version, "commit", commit,
		"lease", f.namespace+"/"+f.leaseName, "identity", f.identity)
	c := cdcontrol.New(cdcontrol.Options{Dynamic: dc, Kube: kc, DriverName: config.DRADriverName, NodeTimeout: f.nodeTimeout, Log: log})
	return c.RunLeader(ctx, cdcontrol.Leader{Namespace: f.namespace, Name: f.leaseName, Identity: f.identity, LeaseDuration: f.leaseDuration}, f.resync)
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	cdcontrol "github.com/gpu-device-plugin/gpu-device-plugin/internal/control/computedomain"
)

// controllerCommand is the first argument that runs the ComputeDomain
// controller instead of the node plugin.
const controllerCommand = "compute-domain-controller"

// controllerFlags are the controller's settings; each has an environment
// twin the chart sets.
type controllerFlags struct {
	kubeconfig, namespace, leaseName, identity string
	nodeTimeout, resync, leaseDuration         time.Duration
}

func parseControllerFlags(args []string, stderr io.Writer) (controllerFlags, error) {
	var f controllerFlags
	fs := flag.NewFlagSet(controllerCommand, flag.ContinueOnError)
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
		return f, fmt.Errorf("%s: unexpected argument %q", controllerCommand, fs.Arg(0))
	}
	if f.namespace == "" {
		return f, fmt.Errorf("%s: --namespace is empty; set it (or POD_NAMESPACE) to the namespace the controller runs in", controllerCommand)
	}
	if f.nodeTimeout < 10*time.Second {
		return f, fmt.Errorf("%s: --node-timeout %s is shorter than 10s; nodes write their entry every 30s at most: give 1m or more", controllerCommand, f.nodeTimeout)
	}
	if f.resync <= 0 || f.leaseDuration < 3*time.Second {
		return f, fmt.Errorf("%s: --resync must be positive and --lease-duration at least 3s", controllerCommand)
	}
	return f, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func runController(ctx context.Context, args []string) error {
	f, err := parseControllerFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	var rc *rest.Config
	if f.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("%s: API access: %w", controllerCommand, err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	log.Info("starting the ComputeDomain controller", "version", version, "lease", f.namespace+"/"+f.leaseName, "identity", f.identity)
	c := cdcontrol.New(cdcontrol.Options{Dynamic: dc, Kube: kc, DriverName: config.DRADriverName, NodeTimeout: f.nodeTimeout, Log: log})
	return c.RunLeader(ctx, cdcontrol.Leader{Namespace: f.namespace, Name: f.leaseName, Identity: f.identity, LeaseDuration: f.leaseDuration}, f.resync)
}

// Command helminstall installs and uninstalls the plugin's chart with
// Helm's own install and uninstall actions (what `helm install` and `helm
// uninstall` run): the cluster lane's way to install as an operator does.
// It packages the chart as `helm package` does (chartutil.Save, as make
// release does) and installs that archive, not the folder.
//
//	helminstall install -chart deploy/helm/gpu-device-plugin -values values.json
//	helminstall uninstall
//
// It is a program of its own because Helm's client brings kustomize, which
// imports Go's plugin package: a binary with it binds every symbol at
// start, and the suite's, which links go-nvml for the mock, would not
// start without the real NVML.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: helminstall install -chart DIR [-values FILE.json] | uninstall"))
	}
	fs := flag.NewFlagSet("helminstall "+os.Args[1], flag.ExitOnError)
	release := fs.String("release", "gpu-device-plugin", "the release's name")
	namespace := fs.String("namespace", "kube-system", "the release's namespace")
	dir := fs.String("chart", "", "install: the chart's folder, packaged before it is installed")
	valuesFile := fs.String("values", "", "install: values as a JSON object")
	fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := config(*namespace)
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "install":
		err = install(ctx, cfg, *release, *namespace, *dir, *valuesFile)
	case "uninstall":
		_, err = action.NewUninstall(cfg).Run(*release)
		if err == nil {
			fmt.Printf("helminstall: uninstalled %s\n", *release)
		}
	default:
		err = fmt.Errorf("unknown command %q: install or uninstall", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func install(ctx context.Context, cfg *action.Configuration, release, namespace, dir, valuesFile string) error {
	if dir == "" {
		return fmt.Errorf("install: -chart names no folder")
	}
	values := map[string]any{}
	if valuesFile != "" {
		b, err := os.ReadFile(valuesFile)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &values); err != nil {
			return fmt.Errorf("values %s: %w", valuesFile, err)
		}
	}
	c, err := loader.Load(dir)
	if err != nil {
		return fmt.Errorf("loading the chart %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp("", "chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tgz, err := chartutil.Save(c, tmp)
	if err != nil {
		return fmt.Errorf("packaging the chart: %w", err)
	}
	packaged, err := loader.Load(tgz)
	if err != nil {
		return fmt.Errorf("loading the packaged chart %s: %w", filepath.Base(tgz), err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = release, namespace
	rel, err := in.RunWithContext(ctx, packaged, values)
	if err != nil {
		return fmt.Errorf("helm install %s: %w", filepath.Base(tgz), err)
	}
	fmt.Printf("helminstall: installed %s from %s: revision %d, %s\n", rel.Name, filepath.Base(tgz), rel.Version, rel.Info.Status)
	return nil
}

// config is Helm's client for KUBECONFIG's cluster, keeping its release
// records as Secrets in namespace, as helm does.
func config(namespace string) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig := os.Getenv("KUBECONFIG")
	flags.KubeConfig, flags.Namespace = &kubeconfig, &namespace
	cfg := &action.Configuration{}
	if err := cfg.Init(flags, namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, fmt.Errorf("helm client: %w", err)
	}
	return cfg, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "helminstall:", err)
	os.Exit(1)
}

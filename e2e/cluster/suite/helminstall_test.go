package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"helm.sh/helm/v3/pkg/chartutil"
)

// helmInstall installs the chart in dir with Helm itself (e2e/cmd/helminstall,
// which suite.sh builds: Helm's install action on the packaged chart, as
// `helm package` and `helm install` do). The returned release is the same
// rendering, for the steps that read it; its uninstall is Helm's too.
func helmInstall(ctx context.Context, dir string, values chartutil.Values) (*release, error) {
	if env.Helm == "" {
		return nil, fmt.Errorf("E2E_HELM is not set: run the suite through e2e/cluster/suite.sh, which builds e2e/cmd/helminstall")
	}
	r, err := renderChartDir(dir, values)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(values)
	if err != nil {
		return nil, err
	}
	f := filepath.Join(os.TempDir(), fmt.Sprintf("values-%d.json", os.Getpid()))
	if err := os.WriteFile(f, b, 0o600); err != nil {
		return nil, err
	}
	defer os.Remove(f)
	if err := runHelm(ctx, "install", "-release", releaseName, "-namespace", releaseNamespace, "-chart", dir, "-values", f); err != nil {
		return nil, err
	}
	r.helm = true
	return r, nil
}

// runHelm runs e2e/cmd/helminstall with args, on KUBECONFIG's cluster.
func runHelm(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, env.Helm, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w\n%s", filepath.Base(env.Helm), args, err, out)
	}
	return nil
}

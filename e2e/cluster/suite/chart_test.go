package suite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// The release, as `helm install gpu-device-plugin deploy/helm/gpu-device-plugin -n kube-system`.
const (
	releaseName      = "gpu-device-plugin"
	releaseNamespace = "kube-system"
	fieldManager     = "gpu-device-plugin-e2e"
)

// release is the chart rendered with one set of values, applied to the
// cluster with server-side apply: what `helm template | kubectl apply
// --server-side` does, without a Helm binary or its cluster client.
type release struct {
	objects []*unstructured.Unstructured
	// helm: Helm installed the release (helmInstall); uninstall is
	// then `helm uninstall`.
	helm bool
}

// chartValues are the values that put the plugin on the fixture: the mock
// library as the driver root's NVML, its profile and control FIFO in the
// environment, the fake sysfs and /dev, all through one hostPath mounted
// at the same path, so the host paths in Allocate answers and CDI specs
// are right for the runtime too.
func chartValues(strategies ...string) (chartutil.Values, error) {
	return env.chartValues(strategies...)
}

// chartValues are the values that put the plugin on the fixture s describes.
func (s *settings) chartValues(strategies ...string) (chartutil.Values, error) {
	fixture := s.Fixture
	v := chartutil.Values{
		"image":              imageValues(s.PluginImage),
		"hostNetwork":        true,
		"driverRoot":         s.driverRoot(),
		"cdiSpecDir":         s.CDISpecDir,
		"deviceListStrategy": strategies,
		"config": map[string]any{
			"deviceIDStrategy": "uuid",
			// Fast polls, so a cooled GPU is healthy again within seconds.
			"healthPollInterval": "1s",
			"xidRecoveryPeriod":  "10m",
			"logFormat":          "json",
		},
		"extraArgs": []any{
			"--nvml-library=" + s.nvmlLibrary(),
			"--sysfs-root=" + filepath.Join(fixture, "sys"),
			"--dev-root=" + filepath.Join(fixture, "dev"),
		},
		"env": []any{
			map[string]any{"name": "MOCK_NVML_PROFILE", "value": s.profilePath()},
			map[string]any{"name": "MOCK_NVML_CONTROL", "value": s.controlFIFO()},
		},
		"extraVolumes": []any{
			map[string]any{"name": "fixture", "hostPath": map[string]any{"path": fixture, "type": "Directory"}},
		},
		"extraVolumeMounts": []any{
			// HostToContainer: the fixture holds mpsRoot, whose /dev/shm
			// tmpfs the chart's Bidirectional mps volume mounts. This
			// volume, under it, gets a copy of each such tmpfs; as a slave
			// it loses the copy when the tmpfs is unmounted, where a
			// private copy would stay, hidden, and keep the folder busy.
			map[string]any{"name": "fixture", "mountPath": fixture, "mountPropagation": "HostToContainer"},
		},
	}
	// GPU Feature Discovery's labels through NFD's local feature file, in
	// the node's features.d (on the local cluster a folder under .run: the
	// cluster shares this machine's /etc).
	if s.NFDFeaturesDir != "" {
		v["nodeLabels"] = map[string]any{"mode": "nfd", "nfdFeaturesDir": s.NFDFeaturesDir}
	}
	// The node has no kube-proxy: where the plugin talks to the API
	// server (DRA, events, the node condition), it uses the address the
	// suite uses, or the node's own (E2E_NODE_API_SERVER, on kind).
	host, port, err := apiHostPort()
	if err != nil {
		return nil, err
	}
	v["env"] = append(v["env"].([]any),
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": host},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": port},
	)
	if s.hasNICs() {
		// The README's pools for this node: internal/config/testdata/example-nics.yaml.
		root, err := repoRoot()
		if err != nil {
			return nil, err
		}
		pools, err := chartutil.ReadValuesFile(filepath.Join(root, "internal", "config", "testdata", "example-nics.yaml"))
		if err != nil {
			return nil, err
		}
		v["config"].(map[string]any)["nicResources"] = pools["nicResources"]
		v["extraArgs"] = append(v["extraArgs"].([]any), "--proc-root="+s.procRoot())
	}
	return v, nil
}

// imageValues are the chart's image values for ref (repository:tag), an
// image the node has.
func imageValues(ref string) map[string]any {
	repo, tag := ref, "latest"
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo, tag = repo[:i], repo[i+1:]
	}
	return map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"}
}

// renderChart renders deploy/helm/gpu-device-plugin with chartValues, and
// what operators read turned on (the device-plugin lane).
func renderChart(strategies ...string) (*release, error) {
	values, err := chartValues(strategies...)
	if err != nil {
		return nil, err
	}
	operatorValues(values)
	return renderValues(values)
}

// renderValues renders deploy/helm/gpu-device-plugin with values.
func renderValues(values chartutil.Values) (*release, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	return renderChartDir(filepath.Join(root, "deploy", "helm", "gpu-device-plugin"), values)
}

// renderChartDir renders the chart in dir (this tree's, or another
// release's) with values.
func renderChartDir(dir string, values chartutil.Values) (*release, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart %s: %w", dir, err)
	}
	// The cluster's version, as helm install would see it.
	caps := chartutil.DefaultCapabilities.Copy()
	if v, err := k8s.kube.Discovery().ServerVersion(); err == nil {
		caps.KubeVersion = chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}
	}
	vals, err := chartutil.ToRenderValues(c, values,
		chartutil.ReleaseOptions{Name: releaseName, Namespace: releaseNamespace, Revision: 1, IsInstall: true},
		caps)
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	out, err := engine.Engine{Strict: true}.Render(c, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering the chart: %w", err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		if base := filepath.Base(name); !strings.HasPrefix(base, "_") && base != "NOTES.txt" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	r := &release{}
	for _, name := range names {
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out[name]), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if u.GetNamespace() == "" {
				u.SetNamespace(releaseNamespace)
			}
			r.objects = append(r.objects, &u)
		}
	}
	return r, nil
}

// repoRoot is the plugin's repository: go test runs in this package's
// directory, e2e/cluster/suite. (Not harness.RepoRoot, which brings the
// kubelet's code into the build.)
func repoRoot() (string, error) {
	dir, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "deploy", "helm", "gpu-device-plugin", "Chart.yaml")); err != nil {
		return "", fmt.Errorf("finding the repository from the test's directory: %w", err)
	}
	return dir, nil
}

func restMapper() meta.RESTMapper {
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(k8s.kube.Discovery()))
}

// resourceFor is the API of u's kind: in u's namespace, or cluster-wide
// for a cluster-scoped kind (RBAC roles, DeviceClasses, admission policies).
func resourceFor(m *meta.RESTMapping, u *unstructured.Unstructured) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameRoot {
		u.SetNamespace("")
		return k8s.dynamic.Resource(m.Resource)
	}
	return k8s.dynamic.Resource(m.Resource).Namespace(u.GetNamespace())
}

// apply creates or updates every object of the release.
func (r *release) apply(ctx context.Context) error {
	mapper := restMapper()
	for _, u := range r.objects {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s: %w", gvk.Kind, err)
		}
		_, err = resourceFor(m, u).Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
		if err != nil {
			return fmt.Errorf("applying %s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
	return nil
}

// uninstall deletes every object of the release, DaemonSet pods first
// gone (foreground deletion), as `helm uninstall --wait` does.
func (r *release) uninstall(ctx context.Context) error {
	if r.helm {
		if err := runHelm(ctx, "uninstall", "-release", releaseName, "-namespace", releaseNamespace); err != nil {
			return err
		}
	}
	mapper := restMapper()
	fg := metav1.DeletePropagationForeground
	for _, u := range slices.Backward(r.objects) {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s: %w", gvk.Kind, err)
		}
		res := resourceFor(m, u)
		if err := res.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s: %w", gvk.Kind, u.GetName(), err)
		}
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := res.Get(ctx, u.GetName(), metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			return fmt.Errorf("%s %s still there: %w", gvk.Kind, u.GetName(), err)
		}
	}
	return nil
}

// objectKey names an object across two renderings of the chart.
func objectKey(u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	return gvk.Group + "/" + gvk.Kind + "/" + u.GetName()
}

// upgradeFrom applies r over from, the rendering installed now, and deletes
// the objects from has that r does not, as `helm upgrade` (and rollback)
// does; it returns what it deleted.
func (r *release) upgradeFrom(ctx context.Context, from *release) ([]string, error) {
	if err := r.apply(ctx); err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, u := range r.objects {
		keep[objectKey(u)] = true
	}
	gone := &release{}
	var names []string
	for _, u := range from.objects {
		if !keep[objectKey(u)] {
			gone.objects = append(gone.objects, u)
			names = append(names, u.GetKind()+"/"+u.GetName())
		}
	}
	return names, gone.uninstall(ctx)
}

// daemonSetName is the name of the release's DaemonSet.
func (r *release) daemonSetName() string {
	for _, u := range r.objects {
		if u.GetKind() == "DaemonSet" {
			return u.GetName()
		}
	}
	return ""
}

// manifest is the release as YAML-ish text, for logs.
func (r *release) String() string {
	var b bytes.Buffer
	for _, u := range r.objects {
		fmt.Fprintf(&b, "%s/%s ", u.GetKind(), u.GetName())
	}
	return strings.TrimSpace(b.String())
}

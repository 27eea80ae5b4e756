package release

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// A chart in an OCI registry, as Helm pushes it (helm.sh/helm/v3's
// pkg/registry/constants.go): a manifest whose config is Chart.yaml's
// metadata as JSON and whose one layer is the packaged chart.
const (
	ChartConfigMediaType types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	ChartLayerMediaType  types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// PushOptions say where a release goes.
type PushOptions struct {
	Dir       string
	Version   string
	Platforms []Platform
	// Image is the image's repository (registry/name, no tag): the index
	// is pushed as Image:<version.Tag>.
	Image string
	// Charts is the repository the chart goes under, as helm push takes
	// it: the chart is pushed as Charts/gpu-device-plugin:<chart version>,
	// which helm pull oci://<Charts>/gpu-device-plugin --version reads.
	Charts string
	Remote []remote.Option
}

// Pushed says what went where.
type Pushed struct {
	Image, Chart             name.Tag
	ImageDigest, ChartDigest v1.Hash
}

// Push checks the release folder (Verify), then uploads its image index
// and its chart. Credentials come from docker login's store and the
// transport honours HTTPS_PROXY, as docker push and helm push would.
func Push(ctx context.Context, o PushOptions) (Pushed, error) {
	imageTag, chartTag, err := pushTags(o)
	if err != nil {
		return Pushed{}, err
	}
	if err := Verify(o.Dir, o.Version, o.Platforms); err != nil {
		return Pushed{}, fmt.Errorf("the release folder %s fails its checks, so nothing was pushed:\n%w", o.Dir, err)
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.Remote...)
	l := Layout{o.Version}

	work, err := os.MkdirTemp("", "release-push-")
	if err != nil {
		return Pushed{}, err
	}
	defer os.RemoveAll(work)
	ia, err := ReadIndexArchive(filepath.Join(o.Dir, l.ImageArchive()), work)
	if err != nil {
		return Pushed{}, err
	}
	res := Pushed{Image: imageTag, Chart: chartTag}
	if res.ImageDigest, err = ia.Index.Digest(); err != nil {
		return res, err
	}
	if err := remote.WriteIndex(imageTag, ia.Index, opts...); err != nil {
		return res, fmt.Errorf("pushing the image index to %s: %w", imageTag, err)
	}

	tgz, err := os.ReadFile(filepath.Join(o.Dir, l.Chart()))
	if err != nil {
		return res, err
	}
	art, err := chartArtifact(tgz)
	if err != nil {
		return res, err
	}
	for _, blob := range []v1.Layer{art.config, art.chart} {
		if err := remote.WriteLayer(chartTag.Repository, blob, opts...); err != nil {
			return res, fmt.Errorf("pushing the chart to %s: %w", chartTag, err)
		}
	}
	if err := remote.Put(chartTag, art, opts...); err != nil {
		return res, fmt.Errorf("pushing the chart's manifest to %s: %w", chartTag, err)
	}
	res.ChartDigest = art.digest
	return res, nil
}

// pushTags checks the destinations and names the tags: the image's is its
// version.Tag, the chart's its version with + as _ (Helm's way).
func pushTags(o PushOptions) (image, chart name.Tag, err error) {
	if err := version.CheckRelease(o.Version); err != nil {
		return image, chart, err
	}
	for _, r := range []struct{ what, ref, example string }{
		{"IMAGE", o.Image, "registry.example.com/team/gpu-device-plugin"},
		{"CHARTS", o.Charts, "registry.example.com/team/charts"},
	} {
		if r.ref == "" {
			return image, chart, fmt.Errorf("no repository to push to: set %s, e.g. %s=%s", r.what, r.what, r.example)
		}
		last := r.ref[strings.LastIndex(r.ref, "/")+1:]
		if strings.ContainsAny(last, ":@") {
			return image, chart, fmt.Errorf("%s=%s names a tag or digest: give the repository only (%s), the tag is the release's", r.what, r.ref, r.example)
		}
	}
	if image, err = name.NewTag(o.Image + ":" + version.Tag(o.Version)); err != nil {
		return image, chart, fmt.Errorf("IMAGE=%s: %w", o.Image, err)
	}
	chartVersion, err := version.Chart(o.Version)
	if err != nil {
		return image, chart, err
	}
	if chart, err = name.NewTag(strings.TrimSuffix(o.Charts, "/") + "/" + Name + ":" + version.ChartTag(chartVersion)); err != nil {
		return image, chart, fmt.Errorf("CHARTS=%s: %w", o.Charts, err)
	}
	return image, chart, nil
}

// chartManifest is a packaged chart as an OCI manifest, Helm's layout.
type chartManifest struct {
	config, chart v1.Layer
	manifest      []byte
	digest        v1.Hash
}

func (a *chartManifest) RawManifest() ([]byte, error)        { return a.manifest, nil }
func (a *chartManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// chartArtifact lays out a packaged chart as Helm's registry client does:
// the config is Chart.yaml's metadata as JSON (helm's json.Marshal of
// chart.Metadata), the one layer the .tgz, and the annotations Helm
// writes (title, version, description, url, source, created: Chart.yaml's
// time in the package, so pushing twice gives one digest).
func chartArtifact(tgz []byte) (*chartManifest, error) {
	ch, err := loadArchive(tgz)
	if err != nil {
		return nil, err
	}
	created, err := chartCreated(tgz)
	if err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(ch.Metadata)
	if err != nil {
		return nil, err
	}
	a := &chartManifest{config: static.NewLayer(cfg, ChartConfigMediaType), chart: static.NewLayer(tgz, ChartLayerMediaType)}
	desc := func(l v1.Layer, mt types.MediaType) (v1.Descriptor, error) {
		d, err := l.Digest()
		if err != nil {
			return v1.Descriptor{}, err
		}
		n, err := l.Size()
		return v1.Descriptor{MediaType: mt, Digest: d, Size: n}, err
	}
	cd, err := desc(a.config, ChartConfigMediaType)
	if err != nil {
		return nil, err
	}
	ld, err := desc(a.chart, ChartLayerMediaType)
	if err != nil {
		return nil, err
	}
	ann := map[string]string{
		"org.opencontainers.image.title":   ch.Metadata.Name,
		"org.opencontainers.image.version": ch.Metadata.Version,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.description": ch.Metadata.Description,
		"org.opencontainers.image.url":         ch.Metadata.Home,
	} {
		if v != "" {
			ann[k] = v
		}
	}
	if len(ch.Metadata.Sources) > 0 {
		ann["org.opencontainers.image.source"] = ch.Metadata.Sources[0]
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Config: cd, Layers: []v1.Descriptor{ld}, Annotations: ann}
	if a.manifest, err = json.Marshal(m); err != nil {
		return nil, err
	}
	if a.digest, _, err = v1.SHA256(bytes.NewReader(a.manifest)); err != nil {
		return nil, err
	}
	return a, nil
}

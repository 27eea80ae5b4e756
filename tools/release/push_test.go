package release

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

func testRegistry(t *testing.T) string {
	t.Helper()
	// No credentials of the machine's own: the registry wants none.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// Push uploads the folder's image index, both platforms, and its chart in
// Helm's OCI layout; what the registry serves back is the folder's, digest
// for digest, and reads as helm pull reads it.
func TestPushRoundTrip(t *testing.T) {
	f := theFakeRelease(t)
	host := testRegistry(t)
	l := Layout{fakeVersion}
	res, err := Push(context.Background(), PushOptions{
		Dir: f.dir, Version: fakeVersion, Platforms: fakePlatforms,
		Image: host + "/team/gpu-device-plugin", Charts: host + "/team/charts",
	})
	if err != nil {
		t.Fatal(err)
	}
	sums, err := ReadSums(f.dir)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the image index", func(t *testing.T) {
		if want := host + "/team/gpu-device-plugin:v9.8.7-fake"; res.Image.String() != want {
			t.Errorf("pushed to %s, want %s", res.Image, want)
		}
		ia, err := ReadIndexArchive(filepath.Join(f.dir, l.ImageArchive()), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		want, err := ia.Index.Digest()
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(res.Image)
		if err != nil {
			t.Fatalf("pulling the index back: %v", err)
		}
		got, err := idx.Digest()
		if err != nil || got != want || res.ImageDigest != want {
			t.Errorf("the registry serves %s (Push said %s), the folder's index is %s (%v)", got, res.ImageDigest, want, err)
		}
		if err := validate.Index(idx); err != nil {
			t.Errorf("the pushed index: %v", err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var platforms []string
		for _, d := range m.Manifests {
			platforms = append(platforms, d.Platform.String())
			img, err := remote.Image(res.Image.Context().Digest(d.Digest.String()), remote.WithPlatform(*d.Platform))
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil || cf.Architecture != d.Platform.Architecture || cf.Config.Labels["org.opencontainers.image.version"] != fakeVersion {
				t.Errorf("%s: architecture %s, labels %v (%v)", d.Platform, cf.Architecture, cf.Config.Labels, err)
			}
		}
		if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("platforms %v", platforms)
		}
	})

	t.Run("the chart", func(t *testing.T) {
		// helm pull oci://HOST/team/charts/gpu-device-plugin --version 9.8.7-fake
		tag, err := name.NewTag(host + "/team/charts/gpu-device-plugin:9.8.7-fake")
		if err != nil {
			t.Fatal(err)
		}
		if res.Chart != tag {
			t.Errorf("pushed to %s, want %s", res.Chart, tag)
		}
		desc, err := remote.Get(tag)
		if err != nil {
			t.Fatalf("pulling the chart's manifest: %v", err)
		}
		if desc.Digest != res.ChartDigest {
			t.Errorf("the registry serves %s, Push said %s", desc.Digest, res.ChartDigest)
		}
		var m v1.Manifest
		if err := json.Unmarshal(desc.Manifest, &m); err != nil {
			t.Fatal(err)
		}
		// What Helm's registry client checks when it pulls.
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" ||
			m.Config.MediaType != "application/vnd.cncf.helm.config.v1+json" ||
			len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.cncf.helm.chart.content.v1.tar+gzip" {
			t.Fatalf("manifest %s", desc.Manifest)
		}
		if got, want := m.Layers[0].Digest.Hex, sums[l.Chart()]; got != want {
			t.Errorf("the chart layer is %s, the folder's %s is %s", got, l.Chart(), want)
		}
		if m.Annotations["org.opencontainers.image.version"] != "9.8.7-fake" || m.Annotations["org.opencontainers.image.title"] != "gpu-device-plugin" ||
			m.Annotations["org.opencontainers.image.created"] != "2023-11-14T22:13:20Z" {
			t.Errorf("annotations %v", m.Annotations)
		}
		repo := tag.Context()
		blob := func(d v1.Hash) []byte {
			l, err := remote.Layer(repo.Digest(d.String()))
			if err != nil {
				t.Fatal(err)
			}
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		var meta chart.Metadata
		if err := json.Unmarshal(blob(m.Config.Digest), &meta); err != nil {
			t.Fatalf("the config is not Chart.yaml's metadata: %v", err)
		}
		if meta.Name != "gpu-device-plugin" || meta.Version != "9.8.7-fake" || meta.AppVersion != "9.8.7-fake" {
			t.Errorf("config: %+v", meta)
		}
		ch, err := loader.LoadArchive(bytes.NewReader(blob(m.Layers[0].Digest)))
		if err != nil {
			t.Fatalf("helm's loader refuses the pulled chart: %v", err)
		}
		if ch.Metadata.Version != "9.8.7-fake" {
			t.Errorf("the pulled chart is %s", ch.Metadata.Version)
		}
	})

	t.Run("pushing again changes nothing", func(t *testing.T) {
		again, err := Push(context.Background(), PushOptions{
			Dir: f.dir, Version: fakeVersion, Platforms: fakePlatforms,
			Image: host + "/team/gpu-device-plugin", Charts: host + "/team/charts",
		})
		if err != nil || again != res {
			t.Errorf("second push %+v (%v), first %+v", again, err, res)
		}
	})
}

// Helm's tag for a chart version with build metadata has _ for +.
func TestPushTags(t *testing.T) {
	image, chart, err := pushTags(PushOptions{Version: "v0.1.0+abc.dirty", Image: "r.example/gpu-device-plugin", Charts: "r.example/charts/"})
	if err != nil {
		t.Fatal(err)
	}
	if image.String() != "r.example/gpu-device-plugin:v0.1.0-abc.dirty" || chart.String() != "r.example/charts/gpu-device-plugin:0.1.0_abc.dirty" {
		t.Errorf("image %s chart %s", image, chart)
	}
}

func TestPushRefuses(t *testing.T) {
	f := theFakeRelease(t)
	spoiled := copyRelease(t, f.dir)
	writeBytes(t, filepath.Join(spoiled, "stray"), nil)
	for _, tc := range []struct {
		name string
		o    PushOptions
		want string
	}{
		{"no image", PushOptions{Charts: "r.example/charts"}, "set IMAGE, e.g. IMAGE=registry.example.com/team/gpu-device-plugin"},
		{"no charts", PushOptions{Image: "r.example/xx"}, "set CHARTS"},
		{"a tag", PushOptions{Image: "r.example/xx:v1", Charts: "r.example/charts"}, "IMAGE=r.example/xx:v1 names a tag or digest"},
		{"a digest", PushOptions{Image: "r.example/xx", Charts: "r.example/charts@sha256:" + strings.Repeat("a", 64)}, "CHARTS=r.example/charts@sha256"},
		{"a port is no tag", PushOptions{Dir: t.TempDir() + "/none", Image: "localhost:5000/xx", Charts: "localhost:5000/charts"}, "no release folder"},
		{"a folder that fails its checks", PushOptions{Dir: spoiled, Image: "r.example/xx", Charts: "r.example/charts"}, "nothing was pushed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Version, tc.o.Platforms = fakeVersion, fakePlatforms
			_, err := Push(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Push: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/ignore"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// PackageChart writes the chart in dir as helm package would, a gzipped
// tarball of <name>/..., without the files its .helmignore names, and
// with Chart.yaml's version and appVersion set for release (version.Chart
// and version.AppVersion). Entries are in name order with the time mtime,
// so the same chart gives the same bytes. The result is loaded back with
// Helm's own loader before it is returned.
func PackageChart(dir, release string, mtime time.Time) ([]byte, *chart.Metadata, error) {
	chartVersion, err := version.Chart(release)
	if err != nil {
		return nil, nil, err
	}
	files, err := chartFiles(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the chart %s: %w", dir, err)
	}
	meta, ok := files["Chart.yaml"]
	if !ok {
		return nil, nil, fmt.Errorf("the chart %s has no Chart.yaml", dir)
	}
	var name string
	if files["Chart.yaml"], name, err = setChartVersions(meta, chartVersion, version.AppVersion(release)); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(dir, "Chart.yaml"), err)
	}

	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf) // no name, time zero: the same bytes each time
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		h := &tar.Header{Name: path.Join(name, n), Mode: 0o644, Size: int64(len(files[n])), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	c, err := loader.LoadArchive(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return nil, nil, fmt.Errorf("helm cannot load the chart packaged from %s: %w", dir, err)
	}
	return buf.Bytes(), c.Metadata, nil
}

// chartFiles reads the chart's files as Helm's directory loader does: its
// .helmignore and Helm's defaults decide what is left out.
func chartFiles(dir string) (map[string][]byte, error) {
	rules := ignore.Empty()
	if r, err := ignore.ParseFile(filepath.Join(dir, ignore.HelmIgnore)); err == nil {
		rules = r
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	rules.AddDefaults()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if rules.Ignore(rel, fi) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", rel)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = b
		return nil
	})
	return files, err
}

// setChartVersions sets version and appVersion in a Chart.yaml, keeping
// its other keys, their order and its comments, and returns it with the
// chart's name.
func setChartVersions(chartYAML []byte, chartVersion, appVersion string) ([]byte, string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(chartYAML, &doc); err != nil {
		return nil, "", err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, "", errors.New("not a YAML mapping")
	}
	m := doc.Content[0]
	set := map[string]string{"version": chartVersion, "appVersion": appVersion}
	var name string
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i].Value, m.Content[i+1]
		if k == "name" {
			name = v.Value
		}
		if nv, ok := set[k]; ok {
			v.Kind, v.Tag, v.Value, v.Style = yaml.ScalarNode, "!!str", nv, yaml.DoubleQuotedStyle
			delete(set, k)
		}
	}
	for _, k := range []string{"version", "appVersion"} {
		if nv, ok := set[k]; ok {
			m.Content = append(m.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k},
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: nv, Style: yaml.DoubleQuotedStyle})
		}
	}
	if name == "" {
		return nil, "", errors.New("no name")
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, "", err
	}
	return out.Bytes(), name, enc.Close()
}

// LoadChart reads a packaged chart with Helm's loader.
func LoadChart(file string) (*chart.Chart, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	c, err := loadArchive(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	return c, nil
}

func loadArchive(tgz []byte) (*chart.Chart, error) {
	c, err := loader.LoadArchive(bytes.NewReader(tgz))
	if err != nil {
		return nil, fmt.Errorf("helm cannot load the chart: %w", err)
	}
	return c, nil
}

// chartCreated is the time of Chart.yaml's entry in a packaged chart:
// when the release was built (SOURCE_DATE_EPOCH), whenever it is pushed.
func chartCreated(tgz []byte) (time.Time, error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return time.Time{}, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return time.Time{}, errors.New("no Chart.yaml in the chart")
		}
		if err != nil {
			return time.Time{}, err
		}
		if path.Base(h.Name) == "Chart.yaml" && path.Dir(path.Dir(h.Name)) == "." {
			return h.ModTime.UTC(), nil
		}
	}
}

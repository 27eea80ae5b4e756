package version

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
)

func TestTag(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"release", "v1.2.3", "v1.2.3"},
		{"describe", "v1.2.3-4-gabc1234-dirty", "v1.2.3-4-gabc1234-dirty"},
		{"build metadata", "1.2.3+meta", "1.2.3-meta"},
		{"a build between releases", "v0.1.0+4c3f594.dirty", "v0.1.0-4c3f594.dirty"},
		{"leading dot", ".x", "x"},
		{"empty", "", "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Tag(tc.in)
			if got != tc.want {
				t.Errorf("Tag(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if _, err := name.NewTag("example.com/plugin:" + got); err != nil {
				t.Errorf("Tag(%q) = %q is not a valid tag: %v", tc.in, got, err)
			}
		})
	}
}

// The chart's version is the semantic version without v; its appVersion
// is the image tag without v (the chart's default tag is v + appVersion);
// its registry tag has _ for +, as Helm's.
func TestChart(t *testing.T) {
	for _, tc := range []struct{ name, in, chart, app, tag string }{
		{"release", "v0.1.0", "0.1.0", "0.1.0", "0.1.0"},
		{"pre-release", "v0.2.0-rc.1", "0.2.0-rc.1", "0.2.0-rc.1", "0.2.0-rc.1"},
		{"a build between releases", "v0.1.0+4c3f594.dirty", "0.1.0+4c3f594.dirty", "0.1.0-4c3f594.dirty", "0.1.0_4c3f594.dirty"},
		{"ci", "v0.0.0-ci", "0.0.0-ci", "0.0.0-ci", "0.0.0-ci"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chart, err := Chart(tc.in)
			if err != nil || chart != tc.chart {
				t.Errorf("Chart(%q) = %q, %v; want %q", tc.in, chart, err, tc.chart)
			}
			if got := AppVersion(tc.in); got != tc.app || "v"+got != Tag(tc.in) {
				t.Errorf("AppVersion(%q) = %q, want %q, the image tag %s without v", tc.in, got, tc.app, Tag(tc.in))
			}
			if got := ChartTag(chart); got != tc.tag {
				t.Errorf("ChartTag(%q) = %q, want %q", chart, got, tc.tag)
			}
		})
	}
	for _, bad := range []string{"dev", "v1.2", "v01.2.3", "abc1234-dirty"} {
		if _, err := Chart(bad); err == nil {
			t.Errorf("Chart(%q) accepted a version that is not semver", bad)
		}
	}
}

func TestPackage(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"release tag", "v1.2.3", "1.2.3"},
		{"a build between releases keeps its build metadata, after the release", "v0.1.0+4c3f594", "0.1.0+4c3f594"},
		{"a modified tree's build", "v0.1.0+4c3f594.dirty", "0.1.0+4c3f594.dirty"},
		{"pre-release with build metadata", "v0.2.0-rc.1+4c3f594", "0.2.0~rc.1+4c3f594"},
		{"tag without v", "0.4.0", "0.4.0"},
		{"commits after a tag sort after it", "v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"dirty tree after a tag", "v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234.dirty"},
		{"dirty tree on a tag", "v1.2.3-dirty", "1.2.3+dirty"},
		{"pre-release sorts before the release", "v1.3.0-rc.1", "1.3.0~rc.1"},
		{"bare commit", "abc1234", "0.0.0+git.abc1234"},
		{"bare commit starting with digits", "89460c5-dirty", "0.0.0+git.89460c5.dirty"},
		{"no git", "dev", "0.0.0+git.dev"},
		{"odd characters", "feature/x_y", "0.0.0+git.feature.x.y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Package(tc.in); got != tc.want {
				t.Errorf("Package(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCheckRelease(t *testing.T) {
	for _, ok := range []string{"v0.1.0", "v0.2.0-rc.1", "v0.1.0+4c3f594.dirty", "v0.0.0-ci"} {
		if err := CheckRelease(ok); err != nil {
			t.Errorf("CheckRelease(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"0.1.0", "v0.1", "dev", "", "v0.1.0 "} {
		if err := CheckRelease(bad); err == nil {
			t.Errorf("CheckRelease(%q) accepted it", bad)
		}
	}
}

package main

import (
	"testing"
)

func TestPackageVersion(t *testing.T) {
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
			if got := PackageVersion(tc.in); got != tc.want {
				t.Errorf("PackageVersion(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestNewestGLIBC(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"numeric order, not string order", []string{"GLIBC_2.3.2", "GLIBC_2.34", "GLIBC_2.4", "GLIBC_2.32"}, "2.34"},
		{"private and other libraries ignored", []string{"GLIBC_PRIVATE", "GCC_3.0", "", "GLIBC_2.2.5"}, "2.2.5"},
		{"static binary", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewestGLIBC(tc.in); got != tc.want {
				t.Errorf("NewestGLIBC(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

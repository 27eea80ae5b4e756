// Package version turns the release version (the VERSION file's, as make
// version prints it: v0.1.0, v0.2.0-rc.1, v0.1.0+4c3f594.dirty) into the
// form each part of a release needs: the image tag, the node packages'
// version, the chart's version and appVersion. imagebuild, pkgbuild and
// the release checks all use it, so the parts agree by construction.
package version

import (
	"fmt"
	"regexp"
	"strings"
)

// semver is semver.org's regular expression, after an optional "v".
var semver = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// IsSemver says whether v is a semantic version, with or without a v.
func IsSemver(v string) bool { return semver.MatchString(v) }

// CheckRelease refuses what cannot name a release: v and a semantic
// version (v0.1.0, v0.2.0-rc.1, v0.1.0+4c3f594), as the VERSION file and
// make version write it. Without the v the image's tag would not be the
// chart's default, v + appVersion.
func CheckRelease(v string) error {
	if !strings.HasPrefix(v, "v") || !IsSemver(v) {
		return fmt.Errorf("version %q is not v and a semantic version (v0.1.0, v0.2.0-rc.1)", v)
	}
	return nil
}

var badTagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// Tag turns a version into a valid image tag: a semantic version's build
// metadata after a - (v0.1.0+4c3f594 → v0.1.0-4c3f594), as tags have no +.
func Tag(version string) string {
	t := badTagChars.ReplaceAllString(version, "-")
	t = strings.TrimLeft(t, ".-")
	if t == "" {
		t = "dev"
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// Chart is the chart's version: the semantic version without the v, as
// Helm wants (v0.1.0 → 0.1.0, v0.1.0+4c3f594 → 0.1.0+4c3f594).
func Chart(version string) (string, error) {
	if !IsSemver(version) {
		return "", fmt.Errorf("version %q is not a semantic version (v0.1.0, v0.2.0-rc.1): a chart needs one", version)
	}
	return strings.TrimPrefix(version, "v"), nil
}

// AppVersion is the chart's appVersion: the image tag without its v, as
// the chart's default image tag is "v" + appVersion (a label value too, so
// no +).
func AppVersion(version string) string {
	return strings.TrimPrefix(Tag(version), "v")
}

// ChartTag is the tag of the chart in an OCI registry: its version with +
// made _, as Helm pushes and pulls it.
func ChartTag(chartVersion string) string {
	return strings.ReplaceAll(chartVersion, "+", "_")
}

var (
	describe  = regexp.MustCompile(`^v?([0-9]+\.[0-9]+(?:\.[0-9]+)*)([-+].*)?$`)
	sinceTag  = regexp.MustCompile(`^[0-9]+-g[0-9a-f]+`)
	notInVers = regexp.MustCompile(`[^A-Za-z0-9.~+]+`)
)

// Package turns the Makefile's semantic version (or `git describe --tags
// --always --dirty` output, as an older tree's build gives) into a version
// dpkg and rpm both accept and order: the v dropped, v1.2.3 → 1.2.3; build
// metadata kept after a +, v1.2.3+abc1234.dirty → 1.2.3+abc1234.dirty
// (after 1.2.3: a build between releases); a pre-release after a ~,
// v1.3.0-rc.1 → 1.3.0~rc.1 (before 1.3.0); v1.2.3-4-gabc1234-dirty →
// 1.2.3+4.gabc1234.dirty; and a bare commit such as abc1234-dirty →
// 0.0.0+git.abc1234.dirty.
func Package(v string) string {
	m := describe.FindStringSubmatch(v)
	if m == nil {
		return "0.0.0+git." + clean(v)
	}
	base, rest := m[1], strings.TrimLeft(m[2], "-.+")
	if rest == "" {
		return base
	}
	// A describe suffix (-N-gHASH) is newer than the tag; anything else
	// after a dash is a pre-release, older than it.
	if sinceTag.MatchString(rest) || strings.HasPrefix(m[2], "+") {
		return base + "+" + clean(rest)
	}
	if rest == "dirty" {
		return base + "+dirty"
	}
	return base + "~" + clean(rest)
}

func clean(s string) string {
	s = notInVers.ReplaceAllString(s, ".")
	s = strings.Trim(s, ".")
	if s == "" {
		return "unknown"
	}
	return s
}

package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// root is the repository root, seen from tools/release.
const root = "../.."

// semver is semver.org's regular expression, after a "v".
var semver = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// release is the VERSION file's version: one line, "v" and a semantic
// version without build metadata.
func release(t *testing.T) string {
	t.Helper()
	b := read(t, "VERSION")
	v := strings.TrimSuffix(string(b), "\n")
	if !semver.MatchString(v) || strings.Contains(v, "+") || strings.ContainsAny(v, " \t\n") {
		t.Fatalf("VERSION holds %q; want one line, v and a semantic version without build metadata (v0.1.0, v0.2.0-rc.1)", b)
	}
	return v
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVersionFileIsSemver(t *testing.T) {
	release(t)
}

// The chart, its default image tag, the static manifests and the
// CHANGELOG name the VERSION file's version.
func TestReleasePartsAgree(t *testing.T) {
	v := release(t)
	bare := strings.TrimPrefix(v, "v") // a chart's version has no v

	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(read(t, "deploy/helm/gpu-device-plugin/Chart.yaml"), &chart); err != nil {
		t.Fatal(err)
	}
	var values struct {
		Image struct {
			Tag *string `yaml:"tag"`
		} `yaml:"image"`
	}
	if err := yaml.Unmarshal(read(t, "deploy/helm/gpu-device-plugin/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	// The image's tag, when values.yaml leaves it empty.
	helpers := string(read(t, "deploy/helm/gpu-device-plugin/templates/_helpers.tpl"))

	for _, tc := range []struct{ name, got, want string }{
		{"Chart.yaml version", chart.Version, bare},
		{"Chart.yaml appVersion", chart.AppVersion, bare},
		{"values.yaml image.tag, empty to follow appVersion", deref(values.Image.Tag), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("%s is %q, VERSION %s wants %q", tc.name, tc.got, v, tc.want)
			}
		})
	}
	t.Run("the chart's default image tag is v and appVersion", func(t *testing.T) {
		if !strings.Contains(helpers, `.Values.image.tag | default (printf "v%s" .Chart.AppVersion)`) {
			t.Error(`_helpers.tpl no longer defaults image.tag to "v" + appVersion; keep it, or check the new default here`)
		}
	})

	for _, m := range []string{"deploy/manifests/gpu-device-plugin.yaml", "deploy/manifests/gpu-device-plugin-dra.yaml"} {
		t.Run(m, func(t *testing.T) {
			labels, images := manifestVersions(t, m)
			if len(labels) == 0 || len(images) == 0 {
				t.Fatalf("%s: no app.kubernetes.io/version label or no image found", m)
			}
			for _, l := range labels {
				if l != bare {
					t.Errorf("%s: app.kubernetes.io/version %q, VERSION %s wants %q", m, l, v, bare)
				}
			}
			for _, img := range images {
				if _, tag, _ := strings.Cut(img, ":"); tag != v {
					t.Errorf("%s: image %s, VERSION wants the tag %s", m, img, v)
				}
			}
		})
	}

	t.Run("CHANGELOG.md's newest section", func(t *testing.T) {
		// An Unreleased section may come first: what the next release adds.
		var first string
		for _, line := range strings.Split(string(read(t, "CHANGELOG.md")), "\n") {
			if strings.HasPrefix(line, "## ") && line != "## Unreleased" {
				first = strings.TrimPrefix(line, "## ")
				break
			}
		}
		if first != v {
			t.Errorf("CHANGELOG.md's first release section is %q; want ## %s, the newest release first (after ## Unreleased, if any)", first, v)
		}
	})
}

// deref is *s, or "<missing>" for nil.
func deref(s *string) string {
	if s == nil {
		return "<missing>"
	}
	return *s
}

// manifestVersions returns every app.kubernetes.io/version label value and
// every container image in a multi-document manifest.
func manifestVersions(t *testing.T, path string) (labels, images []string) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(read(t, path)))
	var walk func(n any)
	walk = func(n any) {
		switch n := n.(type) {
		case map[string]any:
			for k, v := range n {
				if s, ok := v.(string); ok && k == "app.kubernetes.io/version" {
					labels = append(labels, s)
				}
				if s, ok := v.(string); ok && k == "image" {
					images = append(images, s)
				}
				walk(v)
			}
		case []any:
			for _, v := range n {
				walk(v)
			}
		}
	}
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return labels, images
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		walk(doc)
	}
}

// makeCmd runs make in dir as a person would, without the settings of a
// make that runs this test (make tools-test) or a VERSION in the
// environment.
func makeCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", append([]string{"-C", dir, "--no-print-directory"}, args...)...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VERSION", "COMMIT"}, k)
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var (
	ldflagsVersion = regexp.MustCompile(`-X main\.version=(\S+)`)
	toolVersion    = regexp.MustCompile(`-version '([^']*)'`)
	// a main package's link-time version variable, as -X main.version sets it
	versionVar = regexp.MustCompile(`(?m)^\s*version\s*=\s*"dev"`)
)

// Every binary under cmd/ is stamped with one version, and imagebuild (the
// image's tag and org.opencontainers.image.version) and pkgbuild (the
// .deb's and .rpm's version) are given the same: the Makefile's VERSION,
// which is the VERSION file's, with build metadata between releases.
func TestMakefileStampsOneVersion(t *testing.T) {
	v := release(t)
	out := makeCmd(t, root, "-n", "build", "image", "packages")
	stamped := strings.TrimSpace(makeCmd(t, root, "-s", "version"))
	if stamped != v && !strings.HasPrefix(stamped, v+"+") {
		t.Fatalf("make version prints %q; want %s, or %s+<commit> between releases", stamped, v, v)
	}
	if !semver.MatchString(stamped) {
		t.Errorf("make version prints %q, not a semantic version", stamped)
	}

	builds := map[string]string{} // ./cmd/<binary> → version it is linked with
	var tools []string
	sourced := sourcedBinaries(t)
	// A recipe's continued lines are one command.
	for _, line := range strings.Split(strings.ReplaceAll(out, "\\\n", " "), "\n") {
		switch {
		case strings.Contains(line, " build ") && strings.Contains(line, "./cmd/"):
			pkg := line[strings.LastIndex(line, "./cmd/"):]
			m := ldflagsVersion.FindStringSubmatch(line)
			if m == nil {
				builds[pkg] = "nothing (no -X main.version)"
				continue
			}
			if !strings.Contains(line, "-X main.commit=") {
				t.Errorf("%s is built without -X main.commit: %s", pkg, line)
			}
			builds[pkg] = m[1]
		case strings.Contains(line, "./imagebuild") || strings.Contains(line, "./pkgbuild"):
			m := toolVersion.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("not given -version: %s", line)
				continue
			}
			tools = append(tools, m[1])
			if m[1] != stamped {
				t.Errorf("make gives %s, binaries get %s: %s", m[1], stamped, line)
			}
			for _, p := range toolBinaryProblems(line, sourced) {
				t.Errorf("%s: %s", p, line)
			}
		}
	}
	if len(tools) != 2 {
		t.Errorf("found %d imagebuild and pkgbuild runs in make -n image packages, want 2:\n%s", len(tools), out)
	}

	cmds, err := filepath.Glob(filepath.Join(root, "cmd", "*"))
	if err != nil || len(cmds) == 0 {
		t.Fatalf("no binaries under cmd/: %v", err)
	}
	for _, dir := range cmds {
		pkg := "./cmd/" + filepath.Base(dir)
		t.Run(pkg, func(t *testing.T) {
			got, ok := builds[pkg]
			if !ok {
				t.Fatalf("make build does not build %s:\n%s", pkg, out)
			}
			if got != stamped {
				t.Errorf("%s is stamped %s, make version is %s", pkg, got, stamped)
			}
			// -X sets nothing, silently, where the variable does not exist.
			srcs, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			if !slices.ContainsFunc(srcs, func(p string) bool {
				b, err := os.ReadFile(p)
				return err == nil && !strings.HasSuffix(p, "_test.go") && versionVar.Match(b)
			}) {
				t.Errorf(`%s has no package variable version = "dev" for -X main.version to set`, pkg)
			}
		})
	}
}

// The Makefile's numbering, on a scratch repository with its Makefile and
// a VERSION file: the tagged commit of a clean tree is the release, any
// other commit is the release with the commit as build metadata.
func TestMakeVersionNumbering(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	for name, body := range map[string][]byte{"Makefile": read(t, "Makefile"), "VERSION": []byte("v1.4.0\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"GIT_CEILING_DIRECTORIES="+filepath.Dir(dir))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := func(args ...string) string {
		t.Helper()
		return strings.TrimSpace(makeCmd(t, dir, append([]string{"-s", "version"}, args...)...))
	}
	head := func() string { return git("rev-parse", "--short", "HEAD") }

	// Each step changes the repository, then says what make version prints.
	steps := []struct {
		name string
		do   func()
		want func() string
		args []string
	}{
		{"no git: a source archive is the version it names", func() {}, func() string { return "v1.4.0" }, nil},
		{"an untagged commit carries its commit as build metadata", func() {
			git("init", "-q")
			git("add", ".")
			git("commit", "-q", "-m", "one")
		}, func() string { return "v1.4.0+" + head() }, nil},
		{"a commit tagged with another version is not the release", func() { git("tag", "v1.3.0") },
			func() string { return "v1.4.0+" + head() }, nil},
		{"the commit tagged with VERSION is the release", func() { git("tag", "v1.4.0") },
			func() string { return "v1.4.0" }, nil},
		{"a modified tree on the release's commit is not the release", func() {
			if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("v1.4.0\n\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, func() string { return "v1.4.0+" + head() + ".dirty" }, nil},
		{"VERSION on the command line wins", func() {}, func() string { return "v9.9.9-test" }, []string{"VERSION=v9.9.9-test"}},
		{"a commit after the release", func() {
			git("commit", "-q", "-am", "two")
		}, func() string { return "v1.4.0+" + head() }, nil},
	}
	for _, s := range steps {
		s.do()
		got, want := version(s.args...), s.want()
		if got != want {
			t.Errorf("%s: make version prints %q, want %q", s.name, got, want)
		}
		if !semver.MatchString(got) {
			t.Errorf("%s: %q is not a semantic version", s.name, got)
		}
	}
}

// apacheLicenseSHA256 is the SHA-256 of the Apache License 2.0 as the ASF
// publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt).
const apacheLicenseSHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

// LICENSE is the Apache License 2.0, word for word, and every place that
// names the license for the image and the packages says Apache-2.0.
func TestLicense(t *testing.T) {
	sum := sha256.Sum256(read(t, "LICENSE"))
	if got := hex.EncodeToString(sum[:]); got != apacheLicenseSHA256 {
		t.Errorf("LICENSE has SHA-256 %s, not the Apache License 2.0's text (%s)", got, apacheLicenseSHA256)
	}
	for _, tc := range []struct{ file, line string }{
		{"Makefile", `LICENSE\s*\?=\s*Apache-2\.0`},     // make image's labels, make packages
		{"packaging/nfpm.yaml", `license: Apache-2\.0`}, // packages built without -license
		{"Dockerfile", `ARG LICENSE=Apache-2\.0`},       // the Dockerfile's image label
	} {
		t.Run(tc.file, func(t *testing.T) {
			if !regexp.MustCompile(`(?m)^` + tc.line + `\s*$`).Match(read(t, tc.file)) {
				t.Errorf("%s has no line matching %s", tc.file, tc.line)
			}
		})
	}
}

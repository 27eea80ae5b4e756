package release

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// The folder holds exactly the parts a release is made of, they check out
// (Verify, and coreutils' sha256sum -c where it is installed), and the
// same inputs give the same bytes.
func TestFakeReleaseChecksOut(t *testing.T) {
	f := theFakeRelease(t)
	if err := Verify(f.dir, fakeVersion, fakePlatforms); err != nil {
		t.Fatalf("Verify:\n%v", err)
	}
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	want := []string{
		"SHA256SUMS",
		"gpu-device-plugin-9.8.7-fake.tgz",
		"gpu-device-plugin-9.8.7~fake-1.aarch64.rpm",
		"gpu-device-plugin-9.8.7~fake-1.x86_64.rpm",
		"gpu-device-plugin-cdi-hook-v9.8.7-fake-linux-amd64",
		"gpu-device-plugin-cdi-hook-v9.8.7-fake-linux-arm64",
		"gpu-device-plugin-image-v9.8.7-fake.oci.tar",
		"gpu-device-plugin-v9.8.7-fake.cdx.json",
		"gpu-device-plugin_9.8.7~fake-1_amd64.deb",
		"gpu-device-plugin_9.8.7~fake-1_arm64.deb",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the folder holds\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		if err := run(f.dir, nil, "sha256sum", "-c", "--quiet", SumsFile); err != nil {
			t.Errorf("sha256sum -c: %v", err)
		}
	}

	again := t.TempDir()
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".deb") || strings.HasSuffix(n, ".rpm") {
			writeBytes(t, filepath.Join(again, n), mustRead(t, filepath.Join(f.dir, n)))
		}
	}
	if err := Assemble(f.options(again)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"gpu-device-plugin-image-v9.8.7-fake.oci.tar", "gpu-device-plugin-9.8.7-fake.tgz", "gpu-device-plugin-v9.8.7-fake.cdx.json"} {
		if !bytes.Equal(mustRead(t, filepath.Join(f.dir, n)), mustRead(t, filepath.Join(again, n))) {
			t.Errorf("%s differs between two assemblies of the same inputs", n)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The image index has one OCI image per platform, each valid (every blob
// matches its digest), tagged with the release.
func TestFakeReleaseImageIndex(t *testing.T) {
	f := theFakeRelease(t)
	ia, err := ReadIndexArchive(filepath.Join(f.dir, Layout{fakeVersion}.ImageArchive()), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if ia.Tag != "v9.8.7-fake" || ia.Name != "example.com/gpu-device-plugin:v9.8.7-fake" {
		t.Errorf("tag %q, name %q", ia.Tag, ia.Name)
	}
	if err := validate.Index(ia.Index); err != nil {
		t.Errorf("the image index: %v", err)
	}
	m, err := ia.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.String())
		if d.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("%s: media type %s, want OCI's", d.Platform, d.MediaType)
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v", platforms)
	}
}

// The SBOM covers each binary of each platform, with its SHA-256, the
// modules it was built from (with go.sum's hash) and the Go toolchain.
func TestFakeReleaseSBOM(t *testing.T) {
	f := theFakeRelease(t)
	bom, err := ReadSBOM(filepath.Join(f.dir, Layout{fakeVersion}.SBOM()))
	if err != nil {
		t.Fatal(err)
	}
	if bom.SpecVersion != cdx.SpecVersion1_6 || !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") {
		t.Errorf("spec %s, serial %q", bom.SpecVersion, bom.SerialNumber)
	}
	byRef := map[string]cdx.Component{}
	for _, c := range *bom.Components {
		byRef[c.BOMRef] = c
	}
	yaml, ok := byRef["pkg:golang/go.yaml.in/yaml/v3@v3.0.4"]
	if !ok || yaml.Hashes == nil || len((*yaml.Hashes)[0].Value) != 64 {
		t.Errorf("go.yaml.in/yaml/v3 is missing or has no SHA-256: %+v", yaml)
	}
	var std bool
	for ref := range byRef {
		std = std || strings.HasPrefix(ref, "pkg:golang/std@go1.")
	}
	if !std {
		t.Error("no standard library component")
	}
	for _, p := range fakePlatforms {
		for _, b := range Binaries() {
			ref := "pkg:golang/github.com/gpu-device-plugin/gpu-device-plugin/cmd/" + b + "@" + fakeVersion + "?goarch=" + p.Arch + "&goos=linux"
			c, ok := byRef[ref]
			if !ok {
				t.Errorf("no component %s", ref)
				continue
			}
			sum, err := fileSHA256(filepath.Join(PlatformDir(f.work, p), b))
			if err != nil {
				t.Fatal(err)
			}
			if (*c.Hashes)[0].Value != sum {
				t.Errorf("%s: SHA-256 %s, the binary's is %s", ref, (*c.Hashes)[0].Value, sum)
			}
			var deps []string
			for _, d := range *bom.Dependencies {
				if d.Ref == ref && d.Dependencies != nil {
					deps = *d.Dependencies
				}
			}
			if !slices.Contains(deps, yaml.BOMRef) {
				t.Errorf("%s does not depend on %s: %v", ref, yaml.BOMRef, deps)
			}
		}
	}
}

// Every way a part can disagree with the release is one line of Verify's
// error that names the part.
func TestVerifyCatchesDisagreement(t *testing.T) {
	f := theFakeRelease(t)
	l := Layout{fakeVersion}
	amd64 := Platform{"linux", "amd64"}
	type spoiling struct {
		name  string
		spoil func(t *testing.T, dir string)
		sums  bool // rewrite SHA256SUMS after spoiling
		want  []string
	}
	cases := []spoiling{
		{
			name:  "a file SHA256SUMS does not list",
			spoil: func(t *testing.T, dir string) { writeBytes(t, filepath.Join(dir, "notes.txt"), []byte("x")) },
			want:  []string{"notes.txt is not in SHA256SUMS", "notes.txt is not part of release"},
		},
		{
			name: "a file changed after SHA256SUMS",
			spoil: func(t *testing.T, dir string) {
				p := filepath.Join(dir, l.SBOM())
				writeBytes(t, p, append(mustRead(t, p), '\n'))
			},
			want: []string{l.SBOM() + " has SHA-256"},
		},
		{
			name:  "a file SHA256SUMS lists is gone",
			spoil: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, l.Hook(amd64))) },
			want:  []string{"SHA256SUMS lists files the folder does not have: " + l.Hook(amd64), l.Hook(amd64) + " is missing"},
		},
		{
			name: "a chart of another version",
			spoil: func(t *testing.T, dir string) {
				tgz, _, err := PackageChart(filepath.Join(root, "deploy/helm/gpu-device-plugin"), "v9.8.7-faky", fakeCreated)
				if err != nil {
					t.Fatal(err)
				}
				writeBytes(t, filepath.Join(dir, l.Chart()), tgz)
			},
			sums: true,
			want: []string{`Chart.yaml version is "9.8.7-faky", want 9.8.7-fake`, `Chart.yaml appVersion is "9.8.7-faky"`},
		},
		{
			name: "a hook stamped with another version",
			spoil: func(t *testing.T, dir string) {
				p := filepath.Join(dir, l.Hook(amd64))
				writeBytes(t, p, restamp(t, mustRead(t, p), fakeVersion, "v9.8.7-faky"))
			},
			sums: true,
			want: []string{l.Hook(amd64) + ` reports version "v9.8.7-faky"`, l.Hook(amd64) + " is not the hook the linux/amd64 image carries"},
		},
		{
			name: "a hook for the other architecture",
			spoil: func(t *testing.T, dir string) {
				writeBytes(t, filepath.Join(dir, l.Hook(amd64)), mustRead(t, filepath.Join(dir, l.Hook(Platform{"linux", "arm64"}))))
			},
			sums: true,
			want: []string{l.Hook(amd64) + " is for EM_AARCH64, not linux/amd64"},
		},
		{
			name: "packages of another version",
			spoil: func(t *testing.T, dir string) {
				for _, n := range []string{"gpu-device-plugin_9.8.7~fake-1_amd64.deb", "gpu-device-plugin-9.8.7~fake-1.x86_64.rpm"} {
					os.Remove(filepath.Join(dir, n))
				}
				if err := f.packages(amd64, "v9.8.7-faky", dir); err != nil {
					t.Fatal(err)
				}
			},
			sums: true,
			want: []string{`gpu-device-plugin_9.8.7~faky-1_amd64.deb: version "9.8.7~faky", want 9.8.7~fake`, `gpu-device-plugin-9.8.7~faky-1.x86_64.rpm: version "9.8.7~faky"`},
		},
		{
			name: "an image labelled with another version",
			spoil: func(t *testing.T, dir string) {
				work := t.TempDir()
				g := f
				g.work = work
				for _, p := range fakePlatforms {
					if err := os.CopyFS(PlatformDir(work, p), os.DirFS(PlatformDir(f.work, p))); err != nil {
						t.Fatal(err)
					}
				}
				if err := f.image(amd64, "v9.8.7-faky", filepath.Join(PlatformDir(work, amd64), "image.tar")); err != nil {
					t.Fatal(err)
				}
				idx := filepath.Join(t.TempDir(), "index")
				if err := Assemble(AssembleOptions{Dir: idx, Version: fakeVersion, Work: work, Platforms: fakePlatforms,
					ChartDir: filepath.Join(root, "deploy/helm/gpu-device-plugin"), Repository: "example.com/gpu-device-plugin", Created: fakeCreated}); err == nil {
					t.Fatal("Assemble took an image labelled with another version")
				}
				writeBytes(t, filepath.Join(dir, l.ImageArchive()), mustRead(t, filepath.Join(idx, l.ImageArchive())))
			},
			sums: true,
			want: []string{`the linux/amd64 image: label org.opencontainers.image.version is "v9.8.7-faky", want v9.8.7-fake`},
		},
		{
			name: "an SBOM of other binaries",
			spoil: func(t *testing.T, dir string) {
				var bins []Binary
				for _, p := range fakePlatforms {
					for _, b := range Binaries() {
						to := filepath.Join(t.TempDir(), b)
						writeBytes(t, to, restamp(t, mustRead(t, filepath.Join(PlatformDir(f.work, p), b)), fakeVersion, "v9.8.7-faky"))
						bins = append(bins, Binary{Path: to, Platform: p})
					}
				}
				bom, err := SBOM(fakeVersion, bins, fakeCreated)
				if err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				if err := WriteSBOM(&buf, bom); err != nil {
					t.Fatal(err)
				}
				writeBytes(t, filepath.Join(dir, l.SBOM()), buf.Bytes())
			},
			sums: true,
			want: []string{`gpu-device-plugin for linux/amd64 has version "v9.8.7-faky"`,
				`gpu-device-plugin-dp for linux/arm64 has version ""`, "gpu-device-plugin-dp for linux/arm64 is not the binary the image carries",
				`gpu-device-plugin-dra for linux/arm64 has version ""`, "gpu-device-plugin-dra for linux/arm64 is not the binary the image carries",
				`gpu-device-plugin-controller for linux/arm64 has version ""`, "gpu-device-plugin-controller for linux/arm64 is not the binary the image carries"},
		},
	}
	// The executables serve runs and the controller, stripped as make
	// strips them (-s), so their main.version is matched, not read.
	for _, b := range []string{"gpu-device-plugin-dp", "gpu-device-plugin-dra", "gpu-device-plugin-controller"} {
		cases = append(cases, spoiling{
			name: "packages whose stripped " + b + " is another version",
			spoil: func(t *testing.T, dir string) {
				work := t.TempDir()
				pd := PlatformDir(work, amd64)
				if err := os.CopyFS(pd, os.DirFS(PlatformDir(f.work, amd64))); err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(pd, b)
				writeBytes(t, p, restamp(t, mustRead(t, p), fakeVersion, "v9.8.7-faky"))
				g := f
				g.work = work
				if err := g.packages(amd64, fakeVersion, dir); err != nil {
					t.Fatal(err)
				}
			},
			sums: true,
			want: []string{"gpu-device-plugin_9.8.7~fake-1_amd64.deb: /usr/bin/" + b + " holds no string v9.8.7-fake (stripped",
				"gpu-device-plugin_9.8.7~fake-1_amd64.deb: /usr/bin/" + b + " is not the one the linux/amd64 image carries"},
		})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyRelease(t, f.dir)
			tc.spoil(t, dir)
			if tc.sums {
				if err := WriteSums(dir); err != nil {
					t.Fatal(err)
				}
			}
			err := Verify(dir, fakeVersion, fakePlatforms)
			if err == nil {
				t.Fatal("Verify passed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Verify's error does not say %q:\n%v", w, err)
				}
			}
		})
	}

	t.Run("a platform the release lacks", func(t *testing.T) {
		err := Verify(f.dir, fakeVersion, append(fakePlatforms, Platform{"linux", "ppc64le"}))
		for _, w := range []string{
			"gpu-device-plugin-cdi-hook-v9.8.7-fake-linux-ppc64le is missing",
			"the image index has linux/amd64, linux/arm64, want linux/amd64, linux/arm64, linux/ppc64le",
			"want one .deb for linux/ppc64le, found 0",
			"does not cover gpu-device-plugin for linux/ppc64le",
		} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Verify's error does not say %q:\n%v", w, err)
			}
		}
	})
	t.Run("another version", func(t *testing.T) {
		err := Verify(f.dir, "v9.8.7-other", fakePlatforms)
		if err == nil || !strings.Contains(err.Error(), "gpu-device-plugin-image-v9.8.7-other.oci.tar is missing") {
			t.Errorf("Verify of another version: %v", err)
		}
	})
}

// Each line of Verify's error is one problem.
func TestVerifyErrorLines(t *testing.T) {
	f := theFakeRelease(t)
	dir := copyRelease(t, f.dir)
	writeBytes(t, filepath.Join(dir, "a"), nil)
	writeBytes(t, filepath.Join(dir, "b"), nil)
	err := Verify(dir, fakeVersion, fakePlatforms)
	if err == nil {
		t.Fatal("Verify passed")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 4 {
		t.Errorf("want 4 lines (2 files each not in SHA256SUMS and not part of the release):\n%v", err)
	}
}

func TestPackageChart(t *testing.T) {
	dir := filepath.Join(root, "deploy/helm/gpu-device-plugin")
	tgz, md, err := PackageChart(dir, "v1.2.3-rc.1+abc", fakeCreated)
	if err != nil {
		t.Fatal(err)
	}
	if md.Name != "gpu-device-plugin" || md.Version != "1.2.3-rc.1+abc" || md.AppVersion != "1.2.3-rc.1-abc" {
		t.Errorf("name %s version %s appVersion %s", md.Name, md.Version, md.AppVersion)
	}
	if want := version.Tag("v1.2.3-rc.1+abc"); "v"+md.AppVersion != want {
		t.Errorf("the chart's default image tag v%s is not the image's %s", md.AppVersion, want)
	}
	again, _, err := PackageChart(dir, "v1.2.3-rc.1+abc", fakeCreated)
	if err != nil || !bytes.Equal(tgz, again) {
		t.Errorf("two packages of one chart differ (%v)", err)
	}
	p := filepath.Join(t.TempDir(), "c.tgz")
	writeBytes(t, p, tgz)
	packed, err := LoadChart(p)
	if err != nil {
		t.Fatal(err)
	}
	// Every file Helm's directory loader takes, and nothing else.
	files, err := chartFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for n := range files {
		want = append(want, n)
	}
	for _, f := range packed.Raw {
		got = append(got, f.Name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) || !slices.Contains(got, "templates/daemonset.yaml") {
		t.Errorf("the package holds %v, the chart %v", got, want)
	}
	if packed.Metadata.KubeVersion == "" || packed.Metadata.Description == "" {
		t.Error("Chart.yaml lost keys other than version and appVersion")
	}
	if _, _, err := PackageChart(dir, "1.2", fakeCreated); err == nil {
		t.Error("a chart packaged with version 1.2, not semver")
	}
}

func TestSetChartVersions(t *testing.T) {
	in := "# a comment\napiVersion: v2\nname: x\nversion: 0.1.0 # old\nkubeVersion: \">=1.27.0-0\"\n"
	out, name, err := setChartVersions([]byte(in), "1.0.0", "1.0.0")
	if err != nil || name != "x" {
		t.Fatalf("%q, %v", name, err)
	}
	for _, w := range []string{"# a comment", `version: "1.0.0"`, `appVersion: "1.0.0"`, `kubeVersion: ">=1.27.0-0"`} {
		if !strings.Contains(string(out), w) {
			t.Errorf("Chart.yaml lacks %q:\n%s", w, out)
		}
	}
	if _, _, err := setChartVersions([]byte("version: 1\n"), "1.0.0", "1.0.0"); err == nil {
		t.Error("a Chart.yaml without a name accepted")
	}
}

func TestSums(t *testing.T) {
	dir := t.TempDir()
	writeBytes(t, filepath.Join(dir, "a"), []byte("a\n"))
	writeBytes(t, filepath.Join(dir, "b c"), nil)
	if err := WriteSums(dir); err != nil {
		t.Fatal(err)
	}
	want := "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7  a\n" +
		"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  b c\n"
	if got := string(mustRead(t, filepath.Join(dir, SumsFile))); got != want {
		t.Errorf("SHA256SUMS:\n%s\nwant\n%s", got, want)
	}
	if err := CheckSums(dir); err != nil {
		t.Error(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteSums(dir); err == nil || !strings.Contains(err.Error(), "sub is not a regular file") {
		t.Errorf("a folder in the release: %v", err)
	}
}

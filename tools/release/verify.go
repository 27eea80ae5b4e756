package release

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// Where the image and the packages install each binary.
func imagePath(binary string) string { return "usr/bin/" + binary }

func packagePath(binary string) string {
	if binary == HookBinary {
		return "/usr/libexec/gpu-device-plugin/" + binary
	}
	return "/usr/bin/" + binary
}

// elfMachine is the ELF machine of a Go architecture.
func elfMachine(goarch string) (elf.Machine, bool) {
	switch goarch {
	case "amd64":
		return elf.EM_X86_64, true
	case "arm64":
		return elf.EM_AARCH64, true
	case "ppc64le":
		return elf.EM_PPC64, true
	case "s390x":
		return elf.EM_S390, true
	}
	return elf.EM_NONE, false
}

// checker gathers a release folder's problems, one line each.
type checker struct {
	dir       string
	release   string
	layout    Layout
	platforms []Platform
	errs      []error
	// sums of each platform's binaries as the image carries them
	imageBinaries map[Platform]map[string]string
}

func (c *checker) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// Verify checks the release folder dir against the version it is for and
// the platforms it must serve: SHA256SUMS lists every file with its sum;
// the folder holds the image index, the chart, the SBOM, the hook and a
// .deb and an .rpm per platform, and nothing else; and every one of them
// says release, each in its own form (version.Tag, version.Chart,
// version.Package): the image's tag and labels, the version stamped into
// every binary in the image, the packages and the hooks, the chart's
// version and appVersion, the packages' headers, the SBOM's main
// component and binaries. The image's binaries must be the .debs', the
// hooks' and the SBOM's, byte for byte. The error has one line per problem.
func Verify(dir, release string, platforms []Platform) error {
	if err := version.CheckRelease(release); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("no release folder %s (make release VERSION=%s writes it): %w", dir, release, err)
	}
	c := &checker{dir: dir, release: release, layout: Layout{release}, platforms: platforms, imageBinaries: map[Platform]map[string]string{}}
	if err := CheckSums(dir); err != nil {
		c.errs = append(c.errs, err)
	}
	c.checkFiles()
	c.checkImage()
	c.checkHooks()
	c.checkChart()
	c.checkPackages()
	c.checkSBOM()
	return errors.Join(c.errs...)
}

func (c *checker) path(name string) string { return filepath.Join(c.dir, name) }

// checkFiles wants the named parts and packages only.
func (c *checker) checkFiles() {
	names, err := folderFiles(c.dir)
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	want := []string{c.layout.ImageArchive(), c.layout.Chart(), c.layout.SBOM()}
	for _, p := range c.platforms {
		want = append(want, c.layout.Hook(p))
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			c.fail("%s is missing", w)
		}
	}
	for _, n := range names {
		if !slices.Contains(want, n) && !strings.HasSuffix(n, ".deb") && !strings.HasSuffix(n, ".rpm") {
			c.fail("%s is not part of release %s (a leftover? make release starts from an empty folder)", n, c.release)
		}
	}
}

func (c *checker) checkImage() {
	archive := c.path(c.layout.ImageArchive())
	if _, err := os.Stat(archive); err != nil {
		return // checkFiles said so
	}
	work, err := os.MkdirTemp("", "release-verify-")
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	defer os.RemoveAll(work)
	ia, err := ReadIndexArchive(archive, work)
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	tag := version.Tag(c.release)
	if ia.Tag != tag || !strings.HasSuffix(ia.Name, ":"+tag) {
		c.fail("%s: the image is tagged %q (%s), version %s wants %s", c.layout.ImageArchive(), ia.Tag, ia.Name, c.release, tag)
	}
	m, err := ia.Index.IndexManifest()
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	var got []string
	for _, d := range m.Manifests {
		if d.Platform == nil {
			c.fail("%s: the index lists %s without a platform", c.layout.ImageArchive(), d.Digest)
			continue
		}
		p := Platform{d.Platform.OS, d.Platform.Architecture}
		got = append(got, p.String())
		img, err := ia.Index.Image(d.Digest)
		if err != nil {
			c.fail("%s: the %s image: %w", c.layout.ImageArchive(), p, err)
			continue
		}
		c.checkPlatformImage(p, img)
	}
	var want []string
	for _, p := range c.platforms {
		want = append(want, p.String())
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		c.fail("%s: the image index has %s, want %s", c.layout.ImageArchive(), strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

func (c *checker) checkPlatformImage(p Platform, img v1.Image) {
	where := c.layout.ImageArchive() + ": the " + p.String() + " image"
	cf, err := img.ConfigFile()
	if err != nil {
		c.fail("%s: %w", where, err)
		return
	}
	if cf.OS != p.OS || cf.Architecture != p.Arch {
		c.fail("%s: its config says %s/%s", where, cf.OS, cf.Architecture)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != c.release {
		c.fail("%s: label org.opencontainers.image.version is %q, want %s", where, v, c.release)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		c.fail("%s: no layers (%v)", where, err)
		return
	}
	files, err := layerFiles(layers[len(layers)-1], imagePaths())
	if err != nil {
		c.fail("%s: %w", where, err)
		return
	}
	sums := map[string]string{}
	for _, b := range Binaries() {
		content, ok := files[imagePath(b)]
		if !ok {
			c.fail("%s: no /%s", where, imagePath(b))
			continue
		}
		c.checkBinary(where+": /"+imagePath(b), content, p)
		sums[b] = sha256Hex(content)
	}
	c.imageBinaries[p] = sums
}

func imagePaths() []string {
	var out []string
	for _, b := range Binaries() {
		out = append(out, imagePath(b))
	}
	return out
}

// checkBinary wants an ELF executable for p stamped with the release.
func (c *checker) checkBinary(where string, content []byte, p Platform) {
	f, err := elf.NewFile(bytes.NewReader(content))
	if err != nil {
		c.fail("%s is not an ELF executable: %w", where, err)
		return
	}
	if m, ok := elfMachine(p.Arch); !ok || f.Machine != m {
		c.fail("%s is for %s, not %s", where, f.Machine, p)
	}
	switch v, err := StampedVersion(content, c.release); {
	case errors.Is(err, errStripped):
		c.fail("%s holds no string %s (stripped of its symbols, so its main.version is matched, not read)", where, c.release)
	case err != nil:
		c.fail("%s: reading main.version: %w", where, err)
	case v != c.release:
		c.fail("%s reports version %q (main.version), want %s", where, v, c.release)
	}
	info, err := buildinfo.Read(bytes.NewReader(content))
	if err != nil {
		c.fail("%s has no Go build information: %w", where, err)
		return
	}
	if goos, goarch := setting(info, "GOOS"), setting(info, "GOARCH"); goos != p.OS || goarch != p.Arch {
		c.fail("%s was built for %s/%s, not %s", where, goos, goarch, p)
	}
}

func (c *checker) checkHooks() {
	for _, p := range c.platforms {
		name := c.layout.Hook(p)
		content, err := os.ReadFile(c.path(name))
		if err != nil {
			continue // checkFiles said so
		}
		c.checkBinary(name, content, p)
		if f, err := elf.NewFile(bytes.NewReader(content)); err == nil {
			if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
				c.fail("%s is dynamically linked; the hook must be static (CGO_ENABLED=0)", name)
			}
		}
		if img, ok := c.imageBinaries[p]; ok && img[HookBinary] != sha256Hex(content) {
			c.fail("%s is not the hook the %s image carries", name, p)
		}
	}
}

func (c *checker) checkChart() {
	name := c.layout.Chart()
	if _, err := os.Stat(c.path(name)); err != nil {
		return
	}
	ch, err := LoadChart(c.path(name))
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	wantVersion, _ := version.Chart(c.release)
	md := ch.Metadata
	if md.Name != Name {
		c.fail("%s: the chart is named %q, want %s", name, md.Name, Name)
	}
	if md.Version != wantVersion {
		c.fail("%s: Chart.yaml version is %q, want %s", name, md.Version, wantVersion)
	}
	if want := version.AppVersion(c.release); md.AppVersion != want {
		c.fail("%s: Chart.yaml appVersion is %q, want %s (the image tag %s without v)", name, md.AppVersion, want, version.Tag(c.release))
	}
}

func (c *checker) checkPackages() {
	names, err := folderFiles(c.dir)
	if err != nil {
		return
	}
	debs := map[string][]string{}
	rpms := map[string][]string{}
	wantVersion := version.Package(c.release)
	var wantPaths []string
	for _, b := range Binaries() {
		wantPaths = append(wantPaths, packagePath(b))
	}
	for _, n := range names {
		switch {
		case strings.HasSuffix(n, ".deb"):
			pkg, err := ReadDeb(c.path(n), wantPaths...)
			if err != nil {
				c.errs = append(c.errs, err)
				continue
			}
			c.checkPackage(n, pkg, wantVersion)
			debs[pkg.Arch] = append(debs[pkg.Arch], n)
			p := Platform{"linux", pkg.Arch}
			for _, b := range Binaries() {
				content, ok := pkg.Files[packagePath(b)]
				if !ok {
					c.fail("%s has no %s", n, packagePath(b))
					continue
				}
				c.checkBinary(n+": "+packagePath(b), content, p)
				if img, ok := c.imageBinaries[p]; ok && img[b] != sha256Hex(content) {
					c.fail("%s: %s is not the one the %s image carries", n, packagePath(b), p)
				}
			}
		case strings.HasSuffix(n, ".rpm"):
			pkg, err := ReadRPM(c.path(n))
			if err != nil {
				c.errs = append(c.errs, err)
				continue
			}
			c.checkPackage(n, pkg, wantVersion)
			rpms[pkg.Arch] = append(rpms[pkg.Arch], n)
		}
	}
	for _, p := range c.platforms {
		if got := debs[p.Arch]; len(got) != 1 {
			c.fail("want one .deb for %s, found %d %v", p, len(got), got)
		}
		if got := rpms[rpmArch(p.Arch)]; len(got) != 1 {
			c.fail("want one .rpm for %s (%s), found %d %v", p, rpmArch(p.Arch), len(got), got)
		}
		delete(debs, p.Arch)
		delete(rpms, rpmArch(p.Arch))
	}
	for arch, n := range debs {
		c.fail("%v: a .deb for %s, which release %s does not serve", n, arch, c.release)
	}
	for arch, n := range rpms {
		c.fail("%v: an .rpm for %s, which release %s does not serve", n, arch, c.release)
	}
}

func (c *checker) checkPackage(file string, pkg Package, wantVersion string) {
	if pkg.Name != Name {
		c.fail("%s: package %q, want %s", file, pkg.Name, Name)
	}
	if pkg.Version != wantVersion {
		c.fail("%s: version %q, want %s (release %s)", file, pkg.Version, wantVersion, c.release)
	}
}

func (c *checker) checkSBOM() {
	name := c.layout.SBOM()
	if _, err := os.Stat(c.path(name)); err != nil {
		return
	}
	bom, err := ReadSBOM(c.path(name))
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	if bom.Metadata == nil || bom.Metadata.Component == nil {
		c.fail("%s has no main component", name)
		return
	}
	if mc := bom.Metadata.Component; mc.Name != Name || mc.Version != c.release {
		c.fail("%s: the main component is %s %s, want %s %s", name, mc.Name, mc.Version, Name, c.release)
	}
	type key struct {
		p    Platform
		name string
	}
	apps := map[key]cdx.Component{}
	if bom.Components != nil {
		for _, comp := range *bom.Components {
			if comp.Type != cdx.ComponentTypeApplication {
				continue
			}
			props := map[string]string{}
			if comp.Properties != nil {
				for _, p := range *comp.Properties {
					props[p.Name] = p.Value
				}
			}
			apps[key{Platform{props["cdx:gomod:build:env:GOOS"], props["cdx:gomod:build:env:GOARCH"]}, comp.Name}] = comp
		}
	}
	for _, p := range c.platforms {
		for _, b := range Binaries() {
			comp, ok := apps[key{p, b}]
			if !ok {
				c.fail("%s does not cover %s for %s", name, b, p)
				continue
			}
			delete(apps, key{p, b})
			if comp.Version != c.release {
				c.fail("%s: %s for %s has version %q, want %s", name, b, p, comp.Version, c.release)
			}
			want, ok := c.imageBinaries[p][b]
			if !ok {
				continue
			}
			if comp.Hashes == nil || !slices.Contains(*comp.Hashes, cdx.Hash{Algorithm: cdx.HashAlgoSHA256, Value: want}) {
				c.fail("%s: %s for %s is not the binary the image carries (SHA-256 %s)", name, b, p, want)
			}
		}
	}
	for k := range apps {
		c.fail("%s lists %s for %s, which release %s does not ship", name, k.name, k.p, c.release)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

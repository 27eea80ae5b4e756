package release

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// AssembleOptions say what goes into a release folder.
type AssembleOptions struct {
	// Dir is the release folder. make release has emptied it and pkgbuild
	// has written the packages there.
	Dir     string
	Version string
	// Work holds one folder per platform, <os>-<arch> (linux-arm64), with
	// the binaries make built for it (Binaries) and image.tar, the
	// docker-archive imagebuild made of them.
	Work      string
	Platforms []Platform
	// ChartDir is the chart's source, deploy/helm/gpu-device-plugin.
	ChartDir string
	// Repository is the image's, named in the OCI layout's index.json.
	Repository string
	// Created dates the layout's entries, the chart's and the SBOM
	// (SOURCE_DATE_EPOCH): the same commit gives the same files.
	Created time.Time
}

// PlatformDir is where make puts a platform's binaries and image.
func PlatformDir(work string, p Platform) string { return filepath.Join(work, p.OS+"-"+p.Arch) }

// Assemble writes the image index, the hooks, the chart, the SBOM and
// SHA256SUMS into the release folder, then checks it all (Verify).
func Assemble(o AssembleOptions) error {
	if err := version.CheckRelease(o.Version); err != nil {
		return err
	}
	l := Layout{o.Version}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	var images []v1.Image
	var binaries []Binary
	for _, p := range o.Platforms {
		pd := PlatformDir(o.Work, p)
		img, err := tarball.ImageFromPath(filepath.Join(pd, "image.tar"), nil)
		if err != nil {
			return fmt.Errorf("the %s image (imagebuild writes %s): %w", p, filepath.Join(pd, "image.tar"), err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return fmt.Errorf("the %s image: %w", p, err)
		}
		if cf.OS != p.OS || cf.Architecture != p.Arch {
			return fmt.Errorf("%s holds a %s/%s image, not %s", filepath.Join(pd, "image.tar"), cf.OS, cf.Architecture, p)
		}
		images = append(images, img)
		for _, b := range Binaries() {
			binaries = append(binaries, Binary{Path: filepath.Join(pd, b), Platform: p})
		}
		if err := copyExecutable(filepath.Join(pd, HookBinary), filepath.Join(o.Dir, l.Hook(p))); err != nil {
			return fmt.Errorf("the %s hook: %w", p, err)
		}
	}

	idx, err := Index(images)
	if err != nil {
		return err
	}
	if err := WriteIndexArchive(filepath.Join(o.Dir, l.ImageArchive()), idx, o.Repository, version.Tag(o.Version), o.Created); err != nil {
		return err
	}

	tgz, _, err := PackageChart(o.ChartDir, o.Version, o.Created)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(o.Dir, l.Chart()), func(w io.Writer) error { _, err := w.Write(tgz); return err }); err != nil {
		return err
	}

	bom, err := SBOM(o.Version, binaries, o.Created)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(o.Dir, l.SBOM()), func(w io.Writer) error { return WriteSBOM(w, bom) }); err != nil {
		return err
	}

	if err := WriteSums(o.Dir); err != nil {
		return err
	}
	return Verify(o.Dir, o.Version, o.Platforms)
}

func copyExecutable(src, dst string) error {
	if err := writeFile(dst, func(w io.Writer) error { return copyFile(w, src) }); err != nil {
		return err
	}
	return os.Chmod(dst, 0o755)
}

package release

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/gpu-device-plugin/gpu-device-plugin/tools/unpack"
)

// Annotations of the index's entry in the layout's index.json: the tag
// (OCI's image-layout spec) and the full name containerd imports it as.
const (
	refNameAnnotation   = "org.opencontainers.image.ref.name"
	imageNameAnnotation = "io.containerd.image.name"
)

// Index makes one OCI image index of images, one per platform, each taken
// from its config's os and architecture. The images are made OCI ones
// (imagebuild writes Docker's media types, as docker-archive wants); their
// layers' bytes, and so their digests, stay the same.
func Index(images []v1.Image) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("reading an image's config: %w", err)
		}
		p := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		if seen[p.String()] {
			return nil, fmt.Errorf("two images for %s", p.String())
		}
		seen[p.String()] = true
		oci, err := toOCI(img)
		if err != nil {
			return nil, fmt.Errorf("the %s image: %w", p.String(), err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: oci, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// toOCI gives img OCI's manifest, config and layer media types.
func toOCI(img v1.Image) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, MediaType: types.OCILayer}
	}
	if out, err = mutate.Append(out, adds...); err != nil {
		return nil, err
	}
	// The original config: its history, labels and diff IDs.
	return mutate.ConfigFile(out, cf)
}

// WriteIndexArchive writes idx as an OCI image layout tarball at out, its
// entry in index.json tagged tag and named repository:tag. Entries are in
// name order with the time mtime, so the same index gives the same bytes.
func WriteIndexArchive(out string, idx v1.ImageIndex, repository, tag string, mtime time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing an OCI layout: %w", err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		refNameAnnotation:   tag,
		imageNameAnnotation: repository + ":" + tag,
	})); err != nil {
		return fmt.Errorf("writing the image index to an OCI layout: %w", err)
	}
	return writeFile(out, func(w io.Writer) error { return tarTree(w, dir, mtime) })
}

// IndexArchive is an OCI layout tarball read back: its one image index and
// the tag its index.json gives it.
type IndexArchive struct {
	Index v1.ImageIndex
	Tag   string
	Name  string // repository:tag, for containerd
}

// ReadIndexArchive unpacks the tarball at archive into workDir, which
// must outlive the index (its blobs are read from there), and reads it.
func ReadIndexArchive(archive, workDir string) (IndexArchive, error) {
	if err := unpack.Tarball(archive, workDir); err != nil {
		return IndexArchive{}, fmt.Errorf("unpacking %s: %w", filepath.Base(archive), err)
	}
	root, err := layout.ImageIndexFromPath(workDir)
	if err != nil {
		return IndexArchive{}, fmt.Errorf("%s is not an OCI image layout: %w", filepath.Base(archive), err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return IndexArchive{}, fmt.Errorf("%s: %w", filepath.Base(archive), err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return IndexArchive{}, fmt.Errorf("%s: index.json lists %d entries; want one, the image index", filepath.Base(archive), len(m.Manifests))
	}
	d := m.Manifests[0]
	idx, err := root.ImageIndex(d.Digest)
	if err != nil {
		return IndexArchive{}, fmt.Errorf("%s: %w", filepath.Base(archive), err)
	}
	return IndexArchive{Index: idx, Tag: d.Annotations[refNameAnnotation], Name: d.Annotations[imageNameAnnotation]}, nil
}

// tarTree writes the regular files and directories under dir, in name
// order, with fixed owners, modes and times.
func tarTree(w io.Writer, dir string, mtime time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("%s is neither a file nor a directory", p)
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Typeflag: tar.TypeReg, Size: fi.Size(), Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = h.Name+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.IsDir() {
			continue
		}
		if err := copyFile(tw, p); err != nil {
			return err
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// writeFile writes target through a temporary file beside it, so a failed
// write leaves no half file behind.
func writeFile(target string, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-")
	if err != nil {
		return err
	}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), target)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// layerFiles reads the files named in want (paths without a leading /)
// out of a layer.
func layerFiles(l v1.Layer, want []string) (map[string][]byte, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		n := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if h.Typeflag == tar.TypeReg && slices.Contains(want, n) {
			if out[n], err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		}
	}
}

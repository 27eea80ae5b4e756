// Package unpack unpacks the tarballs the build tools read (a base image's
// OCI layout, a release's image index) into a folder of their own.
package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Tarball unpacks file, a tarball of regular files and directories, into
// dir. A name that would land outside dir, or an entry of another kind
// (a link, a device), is refused: the tarball may come from anyone.
func Tarball(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("%s: entry %q is outside the archive", file, h.Name)
		}
		target := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := writeFrom(target, tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry %q is neither a file nor a directory", file, h.Name)
		}
	}
}

func writeFrom(target string, r io.Reader) error {
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

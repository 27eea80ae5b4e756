package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Package is what a .deb's or .rpm's header says.
type Package struct {
	Name, Version, Release, Arch string
	// Files are the package's files read in full, by absolute path, for
	// those the caller asked for.
	Files map[string][]byte
}

// rpmArch is rpm's name for a Go architecture; dpkg uses Go's for these.
func rpmArch(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return goarch
}

// ReadDeb reads a .deb's control fields and the files named in want.
func ReadDeb(file string, want ...string) (Package, error) {
	f, err := os.Open(file)
	if err != nil {
		return Package{}, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	magic := make([]byte, 8)
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != "!<arch>\n" {
		return Package{}, fmt.Errorf("%s is not a .deb (an ar archive)", path.Base(file))
	}
	p := Package{Files: map[string][]byte{}}
	var control bool
	for {
		hdr := make([]byte, 60)
		if _, err := io.ReadFull(r, hdr); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return p, fmt.Errorf("%s: %w", path.Base(file), err)
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[:16])), "/")
		var size int64
		if _, err := fmt.Sscan(strings.TrimSpace(string(hdr[48:58])), &size); err != nil {
			return p, fmt.Errorf("%s: member %s: bad size", path.Base(file), name)
		}
		body := io.LimitReader(r, size)
		switch {
		case strings.HasPrefix(name, "control.tar"):
			control = true
			err = readDebTar(name, body, func(n string, content []byte) {
				if n == "control" {
					p.Name, p.Version, p.Arch = controlFields(content)
				}
			}, "control")
		case strings.HasPrefix(name, "data.tar"):
			err = readDebTar(name, body, func(n string, content []byte) { p.Files["/"+n] = content }, trimSlash(want)...)
		}
		if err != nil {
			return p, fmt.Errorf("%s: %s: %w", path.Base(file), name, err)
		}
		if _, err := io.Copy(io.Discard, body); err != nil {
			return p, err
		}
		if size%2 == 1 {
			if _, err := r.Discard(1); err != nil && !errors.Is(err, io.EOF) {
				return p, err
			}
		}
	}
	if !control || p.Version == "" {
		return p, fmt.Errorf("%s has no control file with a Version", path.Base(file))
	}
	// dpkg's version is upstream-revision; nfpm's release is the revision.
	if i := strings.LastIndex(p.Version, "-"); i > 0 {
		p.Version, p.Release = p.Version[:i], p.Version[i+1:]
	}
	return p, nil
}

func trimSlash(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = strings.TrimPrefix(p, "/")
	}
	return out
}

// readDebTar calls found for each wanted file (a path without ./ or /) of
// a member tarball, gzipped or not.
func readDebTar(member string, r io.Reader, found func(string, []byte), want ...string) error {
	switch {
	case strings.HasSuffix(member, ".gz"):
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		r = zr
	case strings.HasSuffix(member, ".tar"):
	default:
		return fmt.Errorf("compression not read here (packaging/nfpm.yaml asks for gzip)")
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		n := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		for _, w := range want {
			if n == w && h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					return err
				}
				found(n, b)
			}
		}
	}
}

func controlFields(control []byte) (name, version, arch string) {
	for _, line := range strings.Split(string(control), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "Package":
			name = strings.TrimSpace(v)
		case "Version":
			version = strings.TrimSpace(v)
		case "Architecture":
			arch = strings.TrimSpace(v)
		}
	}
	return name, version, arch
}

// ReadRPM reads an .rpm's name, version, release and architecture from
// its header (the lead, the signature header, then the header, as rpm's
// file format lays them out).
func ReadRPM(file string) (Package, error) {
	f, err := os.Open(file)
	if err != nil {
		return Package{}, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	lead := make([]byte, 96)
	if _, err := io.ReadFull(r, lead); err != nil || !bytes.Equal(lead[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		return Package{}, fmt.Errorf("%s is not an .rpm", path.Base(file))
	}
	if _, err := rpmHeader(r, true); err != nil {
		return Package{}, fmt.Errorf("%s: signature header: %w", path.Base(file), err)
	}
	tags, err := rpmHeader(r, false)
	if err != nil {
		return Package{}, fmt.Errorf("%s: header: %w", path.Base(file), err)
	}
	return Package{Name: tags[1000], Version: tags[1001], Release: tags[1002], Arch: tags[1022]}, nil
}

// rpmHeader reads one header structure and returns its string tags; the
// signature header is padded to 8 bytes.
func rpmHeader(r *bufio.Reader, padded bool) (map[uint32]string, error) {
	var intro struct {
		Magic    [3]byte
		Version  byte
		Reserved [4]byte
		Count    uint32
		Size     uint32
	}
	if err := binary.Read(r, binary.BigEndian, &intro); err != nil {
		return nil, err
	}
	if intro.Magic != [3]byte{0x8e, 0xad, 0xe8} || intro.Count > 1<<16 || intro.Size > 64<<20 {
		return nil, errors.New("bad header magic or size")
	}
	index := make([]struct{ Tag, Type, Offset, Count uint32 }, intro.Count)
	if err := binary.Read(r, binary.BigEndian, index); err != nil {
		return nil, err
	}
	store := make([]byte, intro.Size)
	if _, err := io.ReadFull(r, store); err != nil {
		return nil, err
	}
	if padded {
		if pad := (8 - intro.Size%8) % 8; pad > 0 {
			if _, err := r.Discard(int(pad)); err != nil {
				return nil, err
			}
		}
	}
	tags := map[uint32]string{}
	for _, e := range index {
		const typeString = 6
		if e.Type != typeString || e.Offset >= uint32(len(store)) {
			continue
		}
		s := store[e.Offset:]
		if i := bytes.IndexByte(s, 0); i >= 0 {
			tags[e.Tag] = string(s[:i])
		}
	}
	return tags, nil
}

package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// layerBuilder collects the files of one layer. Entries are written in
// path order with fixed owners and times, so the same inputs always give
// the same layer digest.
type layerBuilder struct {
	mtime   time.Time
	entries map[string]entry
}

type entry struct {
	mode    int64
	typ     byte
	content []byte
}

func newLayer(mtime time.Time) *layerBuilder {
	return &layerBuilder{mtime: mtime, entries: map[string]entry{}}
}

// file adds a regular file at an absolute image path, with its parents.
func (l *layerBuilder) file(p string, mode int64, content []byte) {
	p = clean(p)
	l.parents(p)
	l.entries[p] = entry{mode: mode, typ: tar.TypeReg, content: content}
}

// dir adds a directory, with its parents.
func (l *layerBuilder) dir(p string, mode int64) {
	p = clean(p)
	l.parents(p)
	l.entries[p] = entry{mode: mode, typ: tar.TypeDir}
}

func (l *layerBuilder) parents(p string) {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := l.entries[d]; !ok {
			l.entries[d] = entry{mode: 0o755, typ: tar.TypeDir}
		}
	}
}

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// paths lists the layer's entries in the order they are written.
func (l *layerBuilder) paths() []string {
	ps := make([]string, 0, len(l.entries))
	for p := range l.entries {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

func (l *layerBuilder) tar() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range l.paths() {
		e := l.entries[p]
		h := &tar.Header{Name: p, Mode: e.mode, Typeflag: e.typ, ModTime: l.mtime, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s to a layer: %w", p, err)
		}
		if _, err := tw.Write(e.content); err != nil {
			return nil, fmt.Errorf("writing %s to a layer: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// layer turns the collected files into an image layer (gzip-compressed by
// go-containerregistry when written).
func (l *layerBuilder) layer() (v1.Layer, error) {
	data, err := l.tar()
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

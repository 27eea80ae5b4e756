package ocihook

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Link asks for a symlink at Path (absolute, in the container) whose content is Target.
type Link struct {
	Target string
	Path   string
}

// Request is what create-container is asked to do inside one container.
type Request struct {
	Links   []Link
	Folders []string // library directories to add to the ld cache
}

// Args turns the request back into the command line that ParseLink and ParseFolder read,
// so the parent can hand it to the sandbox unchanged.
func (r Request) Args() []string {
	var args []string
	for _, l := range r.Links {
		args = append(args, "--link", l.Target+"::"+l.Path)
	}
	for _, f := range r.Folders {
		args = append(args, "--folder", f)
	}
	return args
}

// ParseLink reads a --link value, TARGET::LINK.
func ParseLink(s string) (Link, error) {
	target, path, ok := strings.Cut(s, "::")
	switch {
	case !ok:
		return Link{}, fmt.Errorf("%q is not TARGET::LINK (example: libcuda.so.1::/usr/lib64/libcuda.so)", s)
	case target == "" || strings.ContainsRune(target, 0):
		return Link{}, fmt.Errorf("%q: TARGET must be a non-empty symlink content", s)
	}
	path, err := containerPath(path)
	if err != nil {
		return Link{}, fmt.Errorf("%q: LINK %w", s, err)
	}
	if path == "/" {
		return Link{}, fmt.Errorf("%q: LINK must name a file, not /", s)
	}
	return Link{Target: target, Path: path}, nil
}

// ParseFolder reads a --folder value. Each folder becomes one line of an ld.so.conf file, so
// characters that ld.so.conf treats as separators, comments or options are refused.
func ParseFolder(s string) (string, error) {
	dir, err := containerPath(s)
	if err != nil {
		return "", fmt.Errorf("%q: %w", s, err)
	}
	if strings.ContainsAny(dir, " \t#,:=") {
		return "", fmt.Errorf("%q: a library folder cannot contain spaces, tabs, '#', ',', ':' or '='", s)
	}
	return dir, nil
}

func containerPath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", errors.New("must be an absolute path in the container")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return "", errors.New("must not contain control characters")
		}
	}
	return filepath.Clean(p), nil
}

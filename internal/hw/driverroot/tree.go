package driverroot

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// tree reads a directory tree as if root were "/". Paths are slash-separated
// and relative to root, "." being root itself.
type tree struct{ root string }

func (t tree) host(rel string) string { return filepath.Join(t.root, filepath.FromSlash(rel)) }

func (t tree) file(real, at string) File {
	return File{HostPath: t.host(real), Path: "/" + at}
}

func (t tree) isRegular(rel string) bool {
	fi, err := os.Lstat(t.host(rel))
	return err == nil && fi.Mode().IsRegular()
}

func (t tree) isDir(rel string) bool {
	fi, err := os.Lstat(t.host(rel))
	return err == nil && fi.IsDir()
}

// resolve follows every symlink in rel the way the kernel would inside a
// chroot at root: absolute targets and ".." stay inside root. It returns
// the real path, relative to root.
func (t tree) resolve(rel string) (string, error) {
	done := "."
	rest := strings.Split(rel, "/")
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c)
		fi, err := os.Lstat(t.host(next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("resolving %s under %s: too many levels of symbolic links", rel, t.root)
		}
		target, err := os.Readlink(t.host(next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = "."
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return done, nil
}

// libDir is a library directory: at is where the container sees it (the
// path searched), real where it is in the tree.
type libDir struct{ at, real string }

// lib is a library found in a directory: the real file to mount and the
// paths (relative to the root) to mount it at: its own name and its soname
// links, in the directory searched.
type lib struct {
	file string
	at   []string
}

// library finds base ("libcuda.so") in the first of dirs that holds it.
func (t tree) library(dirs []libDir, base, version string) (lib, bool) {
	for _, dir := range dirs {
		entries, err := os.ReadDir(t.host(dir.real))
		if err != nil {
			continue
		}
		var versioned, sonames []string
		for _, e := range entries {
			suffix, ok := strings.CutPrefix(e.Name(), base+".")
			switch {
			case !ok:
			case isVersion(suffix):
				versioned = append(versioned, suffix)
			case isNumber(suffix):
				sonames = append(sonames, suffix)
			}
		}
		file := t.pick(dir.real, base, version, versioned, sonames)
		if file == "" {
			continue
		}
		l := lib{file: file, at: []string{path.Join(dir.at, path.Base(file))}}
		slices.SortFunc(sonames, compareVersions)
		for _, s := range sonames {
			if at := path.Join(dir.at, base+"."+s); at != l.at[0] {
				l.at = append(l.at, at)
			}
		}
		return l, true
	}
	return lib{}, false
}

// pick chooses the real file of base in dir: the driver's version, else
// what the highest soname link points to, else the highest version.
func (t tree) pick(dir, base, version string, versioned, sonames []string) string {
	regular := func(suffix string) string {
		p, err := t.resolve(path.Join(dir, base+"."+suffix))
		if err != nil || !t.isRegular(p) {
			return ""
		}
		return p
	}
	if version != "" && slices.Contains(versioned, version) {
		if p := regular(version); p != "" {
			return p
		}
	}
	for _, group := range [][]string{sonames, versioned} {
		sorted := slices.SortedFunc(slices.Values(group), func(a, b string) int { return compareVersions(b, a) })
		for _, s := range sorted {
			if p := regular(s); p != "" {
				return p
			}
		}
	}
	return ""
}

// isVersion reports whether s is a dotted driver version such as 550.54.15.
func isVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if !isNumber(p) {
			return false
		}
	}
	return true
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// compareVersions orders dotted numbers numerically, component by component.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.ParseUint(as[i], 10, 64)
		y, _ := strconv.ParseUint(bs[i], 10, 64)
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(as), len(bs))
}

// Package sysfstest builds fake host trees (sysfs, /proc, /dev, pci.ids)
// for tests from a small line-oriented text format, so fixtures stay
// reviewable in a diff instead of living in binary archives.
//
// The format, one directive a line; paths are relative to the tree root
// and never leave it:
//
//	# a comment; blank lines are ignored
//	dir  <path>                  a directory (parents are always created)
//	file <path> <content>        a file holding content plus "\n", as sysfs prints it
//	file <path>                  an empty file
//	file <path> "<go string>"    a file holding exactly the unquoted Go string (binary bytes)
//	file <path> <<EOF            a file holding the following lines up to a line "EOF"
//	link <path> <target>         a symlink; target is written as given (usually relative)
//	rm   <path>                  remove a path and everything under it (for mutations)
package sysfstest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Materialize applies the directives read from r under dir.
func Materialize(dir string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		verb, rest, _ := strings.Cut(text, " ")
		rest = strings.TrimLeft(rest, " \t")
		rel, arg, _ := strings.Cut(rest, " ")
		arg = strings.TrimLeft(arg, " \t")
		if rel == "" {
			return fmt.Errorf("line %d: %s needs a path", line, verb)
		}
		path, err := inside(dir, rel)
		if err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		switch verb {
		case "dir":
			err = os.MkdirAll(path, 0o755)
		case "file":
			var content string
			switch {
			case arg == "":
			case strings.HasPrefix(arg, "<<"):
				end := strings.TrimSpace(arg[2:])
				var b strings.Builder
				closed := false
				for sc.Scan() {
					line++
					if strings.TrimSpace(sc.Text()) == end {
						closed = true
						break
					}
					b.WriteString(sc.Text())
					b.WriteByte('\n')
				}
				if !closed {
					return fmt.Errorf("line %d: here-document for %s never ends with %q", line, rel, end)
				}
				content = b.String()
			case strings.HasPrefix(arg, `"`):
				content, err = strconv.Unquote(arg)
				if err != nil {
					return fmt.Errorf("line %d: %s: content %s is not a Go string: %w", line, rel, arg, err)
				}
			default:
				content = arg + "\n"
			}
			err = writeFile(path, content)
		case "link":
			if arg == "" {
				return fmt.Errorf("line %d: link %s needs a target", line, rel)
			}
			if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
				_ = os.Remove(path)
				err = os.Symlink(arg, path)
			}
		case "rm":
			err = os.RemoveAll(path)
		default:
			return fmt.Errorf("line %d: unknown directive %q (want dir, file, link or rm)", line, verb)
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
	return sc.Err()
}

func inside(dir, rel string) (string, error) {
	if filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("path %q must stay inside the tree", rel)
	}
	return filepath.Join(dir, rel), nil
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// Dir is the sysfs package's testdata directory, where the fixtures live.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// Load materialises the fixture testdata/<name>.tree into a fresh
// t.TempDir() and returns that root. The host's sysfs is <root>/sys, its
// /proc <root>/proc and its /dev <root>/dev.
func Load(t testing.TB, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(Dir(), name+".tree"))
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	defer f.Close()
	root := t.TempDir()
	if err := Materialize(root, f); err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return root
}

// Apply applies more directives to an existing tree, for tests that
// change the hardware under a running scanner (hot-plug, link down,
// removal).
func Apply(t testing.TB, root, directives string) {
	t.Helper()
	if err := Materialize(root, strings.NewReader(directives)); err != nil {
		t.Fatalf("applying directives: %v", err)
	}
}

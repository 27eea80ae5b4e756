package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// DefaultExtraLibs are the libraries libnvidia-ml.so.1 links against
// besides libc. The plugin dlopens NVML from the driver root at run time,
// so the image must carry them even though the plugin binary itself needs
// only libc: since glibc 2.34 they are stubs, but the dynamic loader still
// wants each file.
var DefaultExtraLibs = []string{"libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1"}

// elfArch maps an ELF machine to the Go and OCI architecture name, the
// Debian multiarch triplet its libraries live under and Debian's name for
// the architecture (its cross libc is libc6-<debian>-cross).
var elfArch = map[elf.Machine]struct{ goarch, triplet, debian string }{
	elf.EM_X86_64:  {"amd64", "x86_64-linux-gnu", "amd64"},
	elf.EM_AARCH64: {"arm64", "aarch64-linux-gnu", "arm64"},
	elf.EM_PPC64:   {"ppc64le", "powerpc64le-linux-gnu", "ppc64el"},
}

// Runtime is what a dynamically linked binary needs to start: its
// interpreter (the dynamic loader, at the path the binary names) and the
// shared libraries, each with the file it was found in on this machine.
type Runtime struct {
	Arch        string
	Triplet     string
	Debian      string            // Debian's architecture name
	Interpreter string            // e.g. /lib64/ld-linux-x86-64.so.2
	InterpFile  string            // the host file behind it
	Libs        map[string]string // soname → host file
}

// libDirs are where a glibc distribution keeps its libraries, in the
// dynamic loader's default search order, as paths inside the sysroot. The
// last, lib, is where a Debian cross libc (libc6-arm64-cross, its sysroot
// /usr/aarch64-linux-gnu) keeps them all, the loader included.
func libDirs(triplet string) []string {
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

// ResolveRuntime reads binary's ELF headers and finds its interpreter and
// every library it needs, transitively, plus extra, in sysroot: / for the
// build machine's own architecture, or a cross libc's sysroot such as
// /usr/aarch64-linux-gnu. A missing extra library is reported to warn, not
// failed: only NVML needs them.
func ResolveRuntime(binary, sysroot string, extra []string, warn func(string, ...any)) (*Runtime, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", binary, err)
	}
	defer f.Close()
	arch, ok := elfArch[f.Machine]
	if !ok {
		return nil, fmt.Errorf("%s: unsupported machine %s", binary, f.Machine)
	}
	rt := &Runtime{Arch: arch.goarch, Triplet: arch.triplet, Debian: arch.debian, Libs: map[string]string{}}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("%s: reading PT_INTERP: %w", binary, err)
		}
		rt.Interpreter = string(b[:len(b)-1]) // NUL-terminated
	}
	if rt.Interpreter == "" {
		return rt, nil // static: nothing to add
	}
	dirs := libDirs(arch.triplet)
	// At its own path on a glibc system; in lib, beside the libraries, in
	// a cross sysroot.
	rt.InterpFile, err = findLib(sysroot, append([]string{path.Dir(rt.Interpreter)}, dirs...), path.Base(rt.Interpreter), f.Machine)
	if err != nil {
		return nil, fmt.Errorf("%s: its dynamic loader %s: %w%s", binary, rt.Interpreter, err, installHint(sysroot, arch.debian))
	}

	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: reading DT_NEEDED: %w", binary, err)
	}
	if err := rt.add(sysroot, needed, dirs, f.Machine); err != nil {
		return nil, fmt.Errorf("%s: %w", binary, err)
	}
	for _, lib := range extra {
		if lib == "" {
			continue
		}
		if err := rt.add(sysroot, []string{lib}, dirs, f.Machine); err != nil {
			warn("%v; the image will not have it", err)
		}
	}
	return rt, nil
}

// installHint says which package brings a glibc for a foreign
// architecture, when sysroot is not the build machine's own root.
func installHint(sysroot, debian string) string {
	if filepath.Clean(sysroot) == "/" {
		return ""
	}
	return fmt.Sprintf(" (apt-get install libc6-dev-%s-cross brings a sysroot for %s)", debian, debian)
}

// add resolves sonames and what they need in turn.
func (rt *Runtime) add(sysroot string, sonames, dirs []string, machine elf.Machine) error {
	for _, soname := range sonames {
		if _, done := rt.Libs[soname]; done || filepath.Base(rt.Interpreter) == soname {
			continue
		}
		file, err := findLib(sysroot, dirs, soname, machine)
		if err != nil {
			return fmt.Errorf("library %s: %w", soname, err)
		}
		rt.Libs[soname] = file
		lf, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		more, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return fmt.Errorf("reading DT_NEEDED of %s: %w", file, err)
		}
		if err := rt.add(sysroot, more, dirs, machine); err != nil {
			return err
		}
	}
	return nil
}

// findLib finds soname in dirs inside sysroot, skipping files for another
// machine (a 32-bit libc in /lib, say), and returns the real file behind
// any symlink.
func findLib(sysroot string, dirs []string, soname string, machine elf.Machine) (string, error) {
	for _, d := range dirs {
		p, err := resolveIn(sysroot, path.Join(d, soname))
		if err != nil {
			continue
		}
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := f.Machine == machine
		f.Close()
		if ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s under %s", strings.Join(dirs, ", "), sysroot)
}

// resolveIn returns the file that p names inside the tree at root,
// following symlinks as a chroot into root would: an absolute target is
// read inside root too, so a sysroot's links never lead to the build
// machine's own libraries.
func resolveIn(root, p string) (string, error) {
	const maxLinks = 40
	links := 0
	rest := strings.Split(path.Clean("/" + p)[1:], "/")
	cur := "/"
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: more than %d symbolic links", p, maxLinks)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		rest = append(strings.Split(path.Clean("/" + target)[1:], "/"), rest...)
		cur = "/"
	}
	return filepath.Join(root, cur), nil
}

// merge adds what another binary of the image needs. Both must be for one
// architecture and, when both are dynamic, name one loader: the image
// carries a single one.
func (rt *Runtime) merge(other *Runtime) error {
	if other.Arch != rt.Arch {
		return fmt.Errorf("it is for %s, the plugin for %s", other.Arch, rt.Arch)
	}
	if other.Interpreter == "" {
		return nil
	}
	if rt.Interpreter == "" {
		rt.Interpreter, rt.InterpFile = other.Interpreter, other.InterpFile
	} else if other.Interpreter != rt.Interpreter {
		return fmt.Errorf("its dynamic loader is %s, the plugin's %s", other.Interpreter, rt.Interpreter)
	}
	for soname, file := range other.Libs {
		if _, ok := rt.Libs[soname]; !ok {
			rt.Libs[soname] = file
		}
	}
	return nil
}

// addTo writes the loader at its own path and each library under
// /lib/<triplet>, the first directory the loader searches.
func (rt *Runtime) addTo(l *layerBuilder, sysroot string) error {
	if rt.Interpreter == "" {
		return nil
	}
	b, err := os.ReadFile(rt.InterpFile)
	if err != nil {
		return err
	}
	l.file(rt.Interpreter, 0o755, b)
	sonames := make([]string, 0, len(rt.Libs))
	for s := range rt.Libs {
		sonames = append(sonames, s)
	}
	sort.Strings(sonames)
	for _, s := range sonames {
		b, err := os.ReadFile(rt.Libs[s])
		if err != nil {
			return err
		}
		l.file(filepath.Join("/lib", rt.Triplet, s), 0o755, b)
	}
	// glibc is LGPL: its copyright notice travels with its binaries. A
	// Debian cross libc (sysroot /usr/<triplet>) keeps it in
	// /usr/share/doc/libc6-<arch>-cross.
	for _, p := range []string{
		filepath.Join(sysroot, "usr/share/doc/libc6/copyright"),
		filepath.Join(sysroot, "../share/doc/libc6-"+rt.Debian+"-cross/copyright"),
	} {
		b, err := os.ReadFile(p)
		if err == nil {
			l.file("/usr/share/doc/libc6/copyright", 0o644, b)
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

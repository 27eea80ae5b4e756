package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// DefaultExtraLibs are the libraries libnvidia-ml.so.1 links against
// besides libc. The plugin dlopens NVML from the driver root at run time,
// so the image must carry them even though the plugin binary itself needs
// only libc: since glibc 2.34 they are stubs, but the dynamic loader still
// wants each file.
var DefaultExtraLibs = []string{"libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1"}

// elfArch maps an ELF machine to the Go and OCI architecture name and the
// Debian multiarch triplet its libraries live under.
var elfArch = map[elf.Machine]struct{ goarch, triplet string }{
	elf.EM_X86_64:  {"amd64", "x86_64-linux-gnu"},
	elf.EM_AARCH64: {"arm64", "aarch64-linux-gnu"},
	elf.EM_PPC64:   {"ppc64le", "powerpc64le-linux-gnu"},
}

// Runtime is what a dynamically linked binary needs to start: its
// interpreter (the dynamic loader, at the path the binary names) and the
// shared libraries, each with the file it was found in on this machine.
type Runtime struct {
	Arch        string
	Triplet     string
	Interpreter string            // e.g. /lib64/ld-linux-x86-64.so.2
	InterpFile  string            // the host file behind it
	Libs        map[string]string // soname → host file
}

// libDirs are where a glibc distribution keeps its libraries, in the
// dynamic loader's default search order.
func libDirs(root, triplet string) []string {
	var dirs []string
	for _, d := range []string{"lib/" + triplet, "usr/lib/" + triplet, "lib64", "usr/lib64", "lib", "usr/lib"} {
		dirs = append(dirs, filepath.Join(root, d))
	}
	return dirs
}

// ResolveRuntime reads binary's ELF headers and finds its interpreter and
// every library it needs, transitively, plus extra, under hostRoot (/ on a
// real build). A missing extra library is reported to warn, not failed:
// only NVML needs them.
func ResolveRuntime(binary, hostRoot string, extra []string, warn func(string, ...any)) (*Runtime, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", binary, err)
	}
	defer f.Close()
	arch, ok := elfArch[f.Machine]
	if !ok {
		return nil, fmt.Errorf("%s: unsupported machine %s", binary, f.Machine)
	}
	rt := &Runtime{Arch: arch.goarch, Triplet: arch.triplet, Libs: map[string]string{}}
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
	rt.InterpFile, err = filepath.EvalSymlinks(filepath.Join(hostRoot, rt.Interpreter))
	if err != nil {
		return nil, fmt.Errorf("%s: its dynamic loader %s is not on this machine: %w", binary, rt.Interpreter, err)
	}

	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: reading DT_NEEDED: %w", binary, err)
	}
	dirs := libDirs(hostRoot, arch.triplet)
	if err := rt.add(needed, dirs, f.Machine); err != nil {
		return nil, fmt.Errorf("%s: %w", binary, err)
	}
	for _, lib := range extra {
		if lib == "" {
			continue
		}
		if err := rt.add([]string{lib}, dirs, f.Machine); err != nil {
			warn("%v; the image will not have it", err)
		}
	}
	return rt, nil
}

// add resolves sonames and what they need in turn.
func (rt *Runtime) add(sonames, dirs []string, machine elf.Machine) error {
	for _, soname := range sonames {
		if _, done := rt.Libs[soname]; done || filepath.Base(rt.Interpreter) == soname {
			continue
		}
		file, err := findLib(soname, dirs, machine)
		if err != nil {
			return err
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
		if err := rt.add(more, dirs, machine); err != nil {
			return err
		}
	}
	return nil
}

// findLib finds soname in dirs, skipping files for another machine (a
// 32-bit libc in /lib, say), and returns the real file behind any symlink.
func findLib(soname string, dirs []string, machine elf.Machine) (string, error) {
	for _, d := range dirs {
		p, err := filepath.EvalSymlinks(filepath.Join(d, soname))
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
	return "", fmt.Errorf("library %s not found in %v", soname, dirs)
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
func (rt *Runtime) addTo(l *layerBuilder, hostRoot string) error {
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
	// glibc is LGPL: its copyright notice travels with its binaries.
	if b, err := os.ReadFile(filepath.Join(hostRoot, "usr/share/doc/libc6/copyright")); err == nil {
		l.file("/usr/share/doc/libc6/copyright", 0o644, b)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

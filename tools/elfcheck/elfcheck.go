// Package elfcheck checks that a binary is a static executable for an
// architecture. The CDI hook must be: the container runtime runs it on the
// host, whatever libc the host has, and the node package's glibc
// dependency is worked out from the plugin alone.
package elfcheck

import (
	"debug/elf"
	"fmt"
)

var goarch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_PPC64:   "ppc64le",
	elf.EM_S390:    "s390x",
}

// Static returns an error unless binary is an ELF executable for arch (a
// GOARCH) with no dynamic loader and no shared libraries.
func Static(binary, arch string) error {
	f, err := elf.Open(binary)
	if err != nil {
		return fmt.Errorf("reading %s (run make build first): %w", binary, err)
	}
	defer f.Close()
	if a := goarch[f.Machine]; a != arch {
		return fmt.Errorf("%s is for %s (%s), the plugin for %s", binary, f.Machine, a, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0 (make build does)", binary)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; build it with CGO_ENABLED=0 (make build does)", binary, libs)
	}
	return nil
}

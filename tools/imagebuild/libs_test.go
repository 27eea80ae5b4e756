package main

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A scratch image takes its glibc from the sysroot it is given: the build
// machine's own root for its architecture, or a Debian cross libc's
// sysroot (/usr/aarch64-linux-gnu), whose libraries and loader all sit in
// lib/ and whose copyright is in ../share/doc/libc6-arm64-cross. Links in
// the tree, absolute ones included, are followed inside it, never out to
// the machine running the test.
func TestScratchImageFromSysroot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine elf.Machine
		arch    string
		interp  string
		// the fixture, relative to the directory holding the sysroot
		files   map[string][]byte
		sysroot string // inside that directory
		// image path → fixture path whose content it must carry
		want map[string]string
	}{
		{
			name: "arm64 from Debian's cross libc", machine: elf.EM_AARCH64, arch: "arm64",
			interp: "/lib/ld-linux-aarch64.so.1", sysroot: "usr/aarch64-linux-gnu",
			files: map[string][]byte{
				"usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1": fakeELF(elf.EM_AARCH64, "", nil),
				"usr/aarch64-linux-gnu/lib/libc.so.6":             fakeELF(elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1", []string{"ld-linux-aarch64.so.1"}),
				// an absolute link, as a root file system has: read inside the sysroot
				"usr/aarch64-linux-gnu/lib/libm.so.6":       []byte("-> /lib/libm-2.36.so"),
				"usr/aarch64-linux-gnu/lib/libm-2.36.so":    fakeELF(elf.EM_AARCH64, "", []string{"libc.so.6"}),
				"usr/aarch64-linux-gnu/lib/libresolv.so.2":  fakeELF(elf.EM_AARCH64, "", []string{"libc.so.6"}),
				"usr/aarch64-linux-gnu/lib/libpthread.so.0": fakeELF(elf.EM_AARCH64, "", []string{"libc.so.6"}),
				"usr/share/doc/libc6-arm64-cross/copyright": []byte("glibc, cross\n"),
			},
			want: map[string]string{
				"lib/ld-linux-aarch64.so.1":             "usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1",
				"lib/aarch64-linux-gnu/libc.so.6":       "usr/aarch64-linux-gnu/lib/libc.so.6",
				"lib/aarch64-linux-gnu/libm.so.6":       "usr/aarch64-linux-gnu/lib/libm-2.36.so",
				"lib/aarch64-linux-gnu/libresolv.so.2":  "usr/aarch64-linux-gnu/lib/libresolv.so.2",
				"lib/aarch64-linux-gnu/libpthread.so.0": "usr/aarch64-linux-gnu/lib/libpthread.so.0",
				"usr/share/doc/libc6/copyright":         "usr/share/doc/libc6-arm64-cross/copyright",
			},
		},
		{
			name: "amd64 from a Debian root", machine: elf.EM_X86_64, arch: "amd64",
			interp: "/lib64/ld-linux-x86-64.so.2", sysroot: "root",
			files: map[string][]byte{
				"root/lib64/ld-linux-x86-64.so.2":                []byte("-> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
				"root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": fakeELF(elf.EM_X86_64, "", nil),
				// a 32-bit-style decoy of another machine earlier in the search order is skipped
				"root/lib/x86_64-linux-gnu/libm.so.6":       fakeELF(elf.EM_AARCH64, "", nil),
				"root/usr/lib/x86_64-linux-gnu/libm.so.6":   fakeELF(elf.EM_X86_64, "", []string{"libc.so.6"}),
				"root/lib/x86_64-linux-gnu/libc.so.6":       []byte("-> ../../usr/lib/x86_64-linux-gnu/libc.so.6"),
				"root/usr/lib/x86_64-linux-gnu/libc.so.6":   fakeELF(elf.EM_X86_64, "", nil),
				"root/lib/x86_64-linux-gnu/libresolv.so.2":  fakeELF(elf.EM_X86_64, "", nil),
				"root/lib/x86_64-linux-gnu/libpthread.so.0": fakeELF(elf.EM_X86_64, "", nil),
				"root/usr/share/doc/libc6/copyright":        []byte("glibc\n"),
			},
			want: map[string]string{
				"lib64/ld-linux-x86-64.so.2":           "root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
				"lib/x86_64-linux-gnu/libc.so.6":       "root/usr/lib/x86_64-linux-gnu/libc.so.6",
				"lib/x86_64-linux-gnu/libm.so.6":       "root/usr/lib/x86_64-linux-gnu/libm.so.6",
				"lib/x86_64-linux-gnu/libresolv.so.2":  "root/lib/x86_64-linux-gnu/libresolv.so.2",
				"lib/x86_64-linux-gnu/libpthread.so.0": "root/lib/x86_64-linux-gnu/libpthread.so.0",
				"usr/share/doc/libc6/copyright":        "root/usr/share/doc/libc6/copyright",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tree(t, dir, tc.files)
			bins := t.TempDir()
			tree(t, bins, map[string][]byte{
				"plugin": fakeELF(tc.machine, tc.interp, []string{"libc.so.6"}),
				// each executable serve runs brings a library of its own
				"dp":   fakeELF(tc.machine, tc.interp, []string{"libpthread.so.0", "libc.so.6"}),
				"dra":  fakeELF(tc.machine, tc.interp, []string{"libresolv.so.2", "libc.so.6"}),
				"hook": fakeELF(tc.machine, "", nil),
			})
			var warnings []string
			img, err := Image(Options{
				Binary: filepath.Join(bins, "plugin"), DP: filepath.Join(bins, "dp"), DRA: filepath.Join(bins, "dra"), Controller: filepath.Join(bins, "dra"), Hook: filepath.Join(bins, "hook"),
				Sysroot: filepath.Join(dir, tc.sysroot), ExtraLibs: []string{"libm.so.6", "libdl.so.2"}, PCIIDs: "none",
				Version: "v1.0.0", Created: time.Unix(1, 0),
				Warn: func(f string, args ...any) { warnings = append(warnings, f) },
			})
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Architecture != tc.arch || cf.OS != "linux" {
				t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, tc.arch)
			}
			got := layerFiles(t, img, 0)
			for p, from := range tc.want {
				f, ok := got[p]
				if !ok {
					t.Errorf("the glibc layer has no %s", p)
					continue
				}
				if !bytes.Equal(f.content, mustRead(t, filepath.Join(dir, from))) {
					t.Errorf("%s is not the fixture's %s", p, from)
				}
			}
			for p, f := range got {
				if f.typ == '0' && !strings.HasPrefix(p, "etc/") {
					if _, ok := tc.want[p]; !ok {
						t.Errorf("the glibc layer has %s, which the binaries do not need", p)
					}
				}
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], "will not have it") {
				t.Errorf("warnings %q, want one for the missing extra libdl.so.2", warnings)
			}
		})
	}
}

// A sysroot without the binary's loader says which package brings one.
func TestSysrootWithoutLoader(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(bin, fakeELF(elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1", []string{"libc.so.6"}), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := ResolveRuntime(bin, t.TempDir(), nil, func(string, ...any) {})
	if err == nil || !strings.Contains(err.Error(), "apt-get install libc6-dev-arm64-cross") || strings.Contains(err.Error(), "\n") {
		t.Errorf("err %v, want one line naming libc6-dev-arm64-cross", err)
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string][]byte{
		"lib/real.so":      []byte("x"),
		"lib/abs.so":       []byte("-> /lib/real.so"),
		"lib/rel.so":       []byte("-> real.so"),
		"lib/up.so":        []byte("-> ../../../../lib/real.so"), // .. stops at the root
		"lib64":            []byte("-> lib"),
		"lib/loop.so":      []byte("-> /lib/loop.so"),
		"lib/escape.so":    []byte("-> /etc/hostname"), // the machine's, not the tree's
		"usr/lib/chain.so": []byte("-> /lib64/abs.so"),
	})
	for _, tc := range []struct{ in, want string }{
		{"/lib/real.so", "lib/real.so"},
		{"/lib/abs.so", "lib/real.so"},
		{"/lib/rel.so", "lib/real.so"},
		{"/lib/up.so", "lib/real.so"},
		{"/lib64/real.so", "lib/real.so"},
		{"/usr/lib/chain.so", "lib/real.so"},
		{"/lib/loop.so", ""},
		{"/lib/escape.so", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := resolveIn(root, tc.in)
			if tc.want == "" {
				if err == nil {
					t.Errorf("resolveIn(%s) = %s, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != filepath.Join(root, tc.want) {
				t.Errorf("resolveIn(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

package main

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewestGLIBC(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"numeric order, not string order", []string{"GLIBC_2.3.2", "GLIBC_2.34", "GLIBC_2.4", "GLIBC_2.32"}, "2.34"},
		{"private and other libraries ignored", []string{"GLIBC_PRIVATE", "GCC_3.0", "", "GLIBC_2.2.5"}, "2.2.5"},
		{"static binary", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewestGLIBC(tc.in); got != tc.want {
				t.Errorf("NewestGLIBC(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// elfHeader is the 64-byte header of a 64-bit little-endian ELF executable
// for machine, without sections: enough for binaryFacts, which then reads
// a static binary.
func elfHeader(machine elf.Machine) []byte {
	le := binary.LittleEndian
	h := []byte{'\x7f', 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), 0}
	h = append(h, make([]byte, 8)...)
	h = le.AppendUint16(h, uint16(elf.ET_EXEC))
	h = le.AppendUint16(h, uint16(machine))
	h = le.AppendUint32(h, uint32(elf.EV_CURRENT))
	h = le.AppendUint64(h, 0) // entry
	h = le.AppendUint64(h, 0) // program headers
	h = le.AppendUint64(h, 0) // section headers
	h = le.AppendUint32(h, 0) // flags
	h = le.AppendUint16(h, 64)
	h = le.AppendUint16(h, 56)
	h = le.AppendUint16(h, 0)
	h = le.AppendUint16(h, 64)
	h = le.AppendUint16(h, 0)
	h = le.AppendUint16(h, 0)
	return h
}

// The executables serve runs, gpu-device-plugin-dp (the device-plugin
// mode's, which it runs by default) and gpu-device-plugin-dra (DRA
// mode's), and the ComputeDomain controller are all required and must be
// for the plugin's architecture; each is read for the package's glibc
// dependency.
func TestModeExecutables(t *testing.T) {
	dir := t.TempDir()
	for name, m := range map[string]elf.Machine{"plugin": elf.EM_X86_64, "amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		if err := os.WriteFile(filepath.Join(dir, name), elfHeader(m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := func(n string) string { return filepath.Join(dir, n) }
	for _, mode := range []struct {
		name, flag string
		set        func(o *Options, file string)
	}{
		{"device-plugin mode's executable", "-dp", func(o *Options, f string) { o.DP = f }},
		{"DRA executable", "-dra", func(o *Options, f string) { o.DRA = f }},
		{"ComputeDomain controller", "-controller", func(o *Options, f string) { o.Controller = f }},
	} {
		for _, tc := range []struct{ file, want string }{
			{"", "no " + mode.name + " given (" + mode.flag + ")"},
			{bin("arm64"), "the " + mode.name + " " + bin("arm64") + " is for arm64, the plugin for amd64"},
			{bin("missing"), "the " + mode.name + ": reading missing (run make build first)"},
		} {
			o := Options{Config: "nfpm.yaml", Root: dir, Binary: bin("plugin"), Hook: bin("amd64"), DP: bin("amd64"), DRA: bin("amd64"), Controller: bin("amd64"), OutDir: dir}
			mode.set(&o, tc.file)
			if _, err := Build(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %q: err %v, want one saying %q", mode.flag, tc.file, err, tc.want)
			}
		}
	}
}

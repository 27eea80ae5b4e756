package main

import (
	"archive/tar"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func archOf(t *testing.T, binary string) string {
	t.Helper()
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return elfArch[f.Machine].goarch
}

func withPlatform(t *testing.T, img v1.Image, arch string) *v1.ConfigFile {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	return cf
}

// tarDir packs a directory into a tarball, as `tar -C dir -cf out .` would.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			defer src.Close()
			_, err = io.Copy(tw, src)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

var (
	shared     string // removed when the tests end
	staticOnce sync.Once
	staticBin  string
	staticErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		panic(err)
	}
	shared = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// staticBinary is a tiny Go program built with CGO_ENABLED=0, standing in
// for the CDI hook; built once per test run.
func staticBinary(t *testing.T) string {
	t.Helper()
	staticOnce.Do(func() {
		dir := filepath.Join(shared, "static")
		if staticErr = os.MkdirAll(dir, 0o755); staticErr != nil {
			return
		}
		for name, content := range map[string]string{
			"main.go": "package main\n\nfunc main() { println(\"hook\") }\n",
			"go.mod":  "module example.com/hook\n\ngo 1.21\n",
		} {
			if staticErr = os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); staticErr != nil {
				return
			}
		}
		staticBin = filepath.Join(dir, "hook")
		cmd := exec.Command("go", "build", "-o", staticBin, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if staticErr != nil {
		t.Fatalf("building a static stand-in for the hook: %v", staticErr)
	}
	return staticBin
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hasInterp(t *testing.T, binary string) bool {
	t.Helper()
	f, err := elf.Open(binary)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// newestLayerFiles reads the image's last layer, the one imagebuild adds.
func newestLayerFiles(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("layers: %v (%d)", err, len(layers))
	}
	return layerFiles(t, img, len(layers)-1)
}

// modeStandIn is a copy of binary with bytes appended, standing in for
// gpu-device-plugin-<mode>, one of the executables serve runs (dp, the
// device-plugin mode's; dra, DRA mode's) or the controller, so that its
// content tells it apart in the image; ELF readers ignore the tail.
func modeStandIn(t *testing.T, binary, mode string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gpu-device-plugin-"+mode)
	if err := os.WriteFile(p, append(mustRead(t, binary), mode+" stand-in"...), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeELF is a minimal 64-bit little-endian ELF file for machine, standing
// in for a binary or a shared library in a fixture tree: a PT_INTERP
// naming interp (none when empty) and a .dynamic section listing needed
// as DT_NEEDED (none when nil). Nothing runs it; debug/elf reads it.
func fakeELF(machine elf.Machine, interp string, needed []string) []byte {
	le := binary.LittleEndian
	align := func(b []byte) []byte {
		for len(b)%8 != 0 {
			b = append(b, 0)
		}
		return b
	}
	const ehdr, phdr, shdr = 64, 56, 64
	var progs int
	if interp != "" {
		progs = 1
	}
	body := make([]byte, ehdr+progs*phdr)
	interpOff := len(body)
	if interp != "" {
		body = align(append(body, interp+"\x00"...))
	}
	dynstrOff := len(body)
	dynstr := []byte{0}
	var offsets []uint64
	for _, n := range needed {
		offsets = append(offsets, uint64(len(dynstr)))
		dynstr = append(dynstr, n+"\x00"...)
	}
	body = align(append(body, dynstr...))
	dynamicOff := len(body)
	for _, o := range offsets {
		body = le.AppendUint64(le.AppendUint64(body, uint64(elf.DT_NEEDED)), o)
	}
	body = le.AppendUint64(le.AppendUint64(body, uint64(elf.DT_NULL)), 0)
	dynamicLen := len(body) - dynamicOff
	shstrtab := "\x00.dynstr\x00.dynamic\x00.shstrtab\x00"
	shstrtabOff := len(body)
	body = align(append(body, shstrtab...))
	shOff := len(body)
	section := func(name uint32, typ elf.SectionType, off, size int, link uint32, entsize uint64) {
		body = le.AppendUint32(body, name)
		body = le.AppendUint32(body, uint32(typ))
		body = le.AppendUint64(body, 0) // flags
		body = le.AppendUint64(body, 0) // addr
		body = le.AppendUint64(body, uint64(off))
		body = le.AppendUint64(body, uint64(size))
		body = le.AppendUint32(body, link)
		body = le.AppendUint32(body, 0) // info
		body = le.AppendUint64(body, 1) // addralign
		body = le.AppendUint64(body, entsize)
	}
	section(0, elf.SHT_NULL, 0, 0, 0, 0)
	section(1, elf.SHT_STRTAB, dynstrOff, len(dynstr), 0, 0)
	section(9, elf.SHT_DYNAMIC, dynamicOff, dynamicLen, 1, 16)
	section(18, elf.SHT_STRTAB, shstrtabOff, len(shstrtab), 0, 0)

	var h []byte
	h = append(h, '\x7f', 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), 0)
	h = append(h, make([]byte, 8)...)
	h = le.AppendUint16(h, uint16(elf.ET_DYN))
	h = le.AppendUint16(h, uint16(machine))
	h = le.AppendUint32(h, uint32(elf.EV_CURRENT))
	h = le.AppendUint64(h, 0) // entry
	phOff := uint64(0)
	if progs > 0 {
		phOff = ehdr
	}
	h = le.AppendUint64(h, phOff)
	h = le.AppendUint64(h, uint64(shOff))
	h = le.AppendUint32(h, 0) // flags
	h = le.AppendUint16(h, ehdr)
	h = le.AppendUint16(h, phdr)
	h = le.AppendUint16(h, uint16(progs))
	h = le.AppendUint16(h, shdr)
	h = le.AppendUint16(h, 4) // sections
	h = le.AppendUint16(h, 3) // .shstrtab
	if interp != "" {
		h = le.AppendUint32(h, uint32(elf.PT_INTERP))
		h = le.AppendUint32(h, uint32(elf.PF_R))
		h = le.AppendUint64(h, uint64(interpOff))
		h = le.AppendUint64(h, 0)
		h = le.AppendUint64(h, 0)
		h = le.AppendUint64(h, uint64(len(interp)+1))
		h = le.AppendUint64(h, uint64(len(interp)+1))
		h = le.AppendUint64(h, 1)
	}
	copy(body, h) // the space left at the start
	return body
}

// tree writes a fixture tree under root: each path to its content, or, for
// a value starting with "-> ", a symbolic link to the rest.
func tree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(string(content), "-> "); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, content, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// layerFiles reads the image's i-th layer.
func layerFiles(t *testing.T, img v1.Image, i int) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) <= i {
		t.Fatalf("layers: %v (%d)", err, len(layers))
	}
	rc, err := layers[i].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = entry{mode: h.Mode, typ: h.Typeflag, content: b}
	}
}
